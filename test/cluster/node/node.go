// Package node runs a real Kubernetes worker node inside a VM guest of the
// runner in test/vmtest: containerd and runc from Debian's packages, the
// bridge CNI plugin, and a kubelet built from Go modules. The kubelet sets
// global sysctls and owns cgroups and iptables rules, so Start refuses to
// run anywhere but in a guest: the guest's kernel state is its own.
//
// The control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) runs on the host, test/cluster/controlplane, as on a real
// cluster's control-plane node: the guest reaches it through its network
// card (eth0, the VM runner's --tap), where the node has its one address,
// Config.IP, and its default route to the control plane's address.
package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Defaults of Config.
const (
	DefaultName    = "node1"
	DefaultPodCIDR = "10.244.0.0/24"
	// ClusterCIDR holds every pod of the cluster, as --cluster-cidr.
	ClusterCIDR = "10.244.0.0/16"
	// bridgeName is the CNI bridge of the pods.
	bridgeName = "cni0"
	// uplink is the node's network card, on the host's tap device.
	uplink = "eth0"
)

// DefaultIP is the node's address when Config.IP is unset.
var DefaultIP = netip.MustParsePrefix("192.168.50.10/24")

// Nth returns the Config of the cluster's i-th node, counted from 1:
// named node<i>, at DefaultIP's address plus i-1, with the pod range
// 10.244.<i-1>.0/24 of ClusterCIDR. The control plane
// (test/cluster/controlplane) routes each node's pod range to its address
// by the same numbering. The other fields are left to the caller.
func Nth(i int) (Config, error) {
	if i < 1 || i > 16 {
		return Config{}, fmt.Errorf("node number %d: want 1 to 16", i)
	}
	ip := DefaultIP.Addr()
	for range i - 1 {
		ip = ip.Next()
	}
	return Config{
		Name:    fmt.Sprintf("node%d", i),
		IP:      netip.PrefixFrom(ip, DefaultIP.Bits()),
		PodCIDR: fmt.Sprintf("10.244.%d.0/24", i-1),
	}, nil
}

// Config says what node to start.
type Config struct {
	// Name is the Node's name; DefaultName when empty.
	Name string
	// IP is the node's address and prefix; DefaultIP when unset.
	IP netip.Prefix
	// Kubeconfig is the admin's kubeconfig, with the API server at an
	// address of the host in IP's prefix, the node's default route.
	// Required.
	Kubeconfig string
	// PodCIDR is the node's pod range (host-local IPAM on the bridge);
	// DefaultPodCIDR when empty.
	PodCIDR string
	// Images are image archives (docker-archive or OCI) to import into
	// containerd before the kubelet starts; the kubelet's pause image
	// (registry.k8s.io/pause:3.10) must be among them.
	Images []string
	// Aliases name images under a second reference once they are imported:
	// new reference to existing one, each as a pod spec writes it
	// ("ebpf-proxy:v1" is docker.io/library/ebpf-proxy:v1). An upgrade to
	// the same image under another name costs no second archive, whose
	// import would take a minute or more under emulation.
	Aliases map[string]string
	// LogDir receives every component's log; it should be a directory the
	// host can read after the run. Required.
	LogDir string
	// ClusterDNS are the addresses of the cluster's DNS Service that the
	// kubelet gives pods as their nameservers, and ClusterDomain the
	// domain their search path starts from (the kubelet's clusterDNS and
	// clusterDomain). Empty: pods get no nameserver, as the cluster test
	// wants, which runs no DNS server; the conformance run
	// (test/conformance) runs CoreDNS, which Kubernetes' Services specs
	// resolve names through.
	ClusterDNS    []netip.Addr
	ClusterDomain string
	// Logf reports progress; optional.
	Logf func(format string, args ...any)
}

// PauseImage is the sandbox image the kubelet and containerd use.
const PauseImage = "registry.k8s.io/pause:3.10"

// Node is a running node of the cluster.
type Node struct {
	// Name and IP are the Node's.
	Name string
	IP   netip.Addr
	// APIServer is the API server's address and port, as the node
	// dials it.
	APIServer netip.AddrPort

	cfg       Config
	bins      cluster.NodeBinaries
	kubectl   string
	clientset *kubernetes.Clientset
	ctrSock   string
	procs     []*agent.Process
	start     time.Time
}

// Start brings up the node: network, containerd with the images and the
// kubelet, and returns once the Node is Ready and the default
// ServiceAccount exists. On error everything started is stopped.
func Start(ctx context.Context, cfg Config) (n *Node, err error) {
	if !sandbox.InVMGuest() {
		return nil, errors.New("a kubelet writes global sysctls, cgroups and iptables rules: the node runs only in a VM guest of test/vmtest (make cluster-test), never on the host")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if !cfg.IP.IsValid() {
		cfg.IP = DefaultIP
	}
	if cfg.PodCIDR == "" {
		cfg.PodCIDR = DefaultPodCIDR
	}
	if cfg.LogDir == "" || cfg.Kubeconfig == "" {
		return nil, errors.New("node: Config.LogDir and Config.Kubeconfig are required")
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	bins, err := cluster.FindNodeBinaries()
	if err != nil {
		return nil, err
	}
	cpBins, err := cluster.FindBinaries()
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	u, err := url.Parse(rc.Host)
	if err != nil {
		return nil, fmt.Errorf("node: the API server's address %q: %w", rc.Host, err)
	}
	api, err := netip.ParseAddrPort(u.Host)
	if err != nil || !cfg.IP.Contains(api.Addr()) {
		return nil, fmt.Errorf("node: the API server's address %q is not an address and port in the node's %s", u.Host, cfg.IP)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	n = &Node{Name: cfg.Name, IP: cfg.IP.Addr(), APIServer: api, cfg: cfg, bins: bins, kubectl: cpBins.Kubectl, clientset: cs, start: time.Now()}
	// A failed step returns a nil Node: what it started is stopped
	// through this one.
	started := n
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()
	steps := []struct {
		what string
		run  func(context.Context) error
	}{
		{"network", n.setupNetwork},
		{"containerd", n.startContainerd},
		{"images", n.importImages},
		{"kubelet", n.startKubelet},
		{"node ready", n.waitReady},
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return nil, fmt.Errorf("node %s: %w", s.what, err)
		}
		n.logf("%s up", s.what)
	}
	return n, nil
}

func (n *Node) logf(format string, args ...any) {
	n.cfg.Logf("node: %5.1fs "+format, append([]any{time.Since(n.start).Seconds()}, args...)...)
}

// run runs a command to completion and returns its combined output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// setupNetwork gives the node its address on its network card, turns on
// forwarding and bridge netfilter as a kubeadm node's preflight requires,
// and routes everything else to the control plane's host, so that Service
// addresses have a route as on a real node.
func (n *Node) setupNetwork(ctx context.Context) error {
	cmds := [][]string{
		{"ip", "link", "set", uplink, "up"},
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", n.cfg.IP.String(), "dev", uplink},
		{"ip", "route", "add", "default", "via", n.APIServer.Addr().String(), "dev", uplink},
		{"modprobe", "br_netfilter"},
		{"modprobe", "overlay"},
		// Shared mounts, as systemd makes them on a real node: a pod's
		// Bidirectional mount (the agent's /sys/fs/bpf) needs them.
		{"mount", "--make-rshared", "/"},
		{"mount", "--make-shared", "/sys/fs/bpf"},
	}
	for _, c := range cmds {
		if _, err := run(ctx, c[0], c[1:]...); err != nil {
			return err
		}
	}
	// The guest's vCPU is emulated, and the host may not run it for a
	// second or more; its timers then fire in a burst once it runs, and a
	// neighbour resolution that sends 3 probes a second apart gives up
	// (EHOSTUNREACH) before the answer to the first was processed, which
	// no real node does. Ten probes outlast a client's 5 s; the defaults
	// apply to the devices made after (the bridge, every pod's veth).
	for key, val := range map[string]string{
		"net/ipv4/ip_forward":                  "1",
		"net/bridge/bridge-nf-call-iptables":   "1",
		"net/bridge/bridge-nf-call-ip6tables":  "1",
		"net/ipv4/neigh/default/mcast_solicit": "10",
		"net/ipv4/neigh/default/ucast_solicit": "10",
		"net/ipv6/neigh/default/mcast_solicit": "10",
		"net/ipv6/neigh/default/ucast_solicit": "10",
		// A failed attempt's conntrack entry (the cluster test's
		// evidence) then says when it was made and what it counted.
		"net/netfilter/nf_conntrack_acct":      "1",
		"net/netfilter/nf_conntrack_timestamp": "1",
	} {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(val), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", key, err)
		}
	}
	return nil
}

// containerdDir holds containerd's configuration, state and socket.
const containerdDir = "/run/node-containerd"

// containerdRoot is containerd's root. The guest's / is an overlay itself,
// and overlayfs cannot stack an upper directory on it: a tmpfs of its own.
const containerdRoot = "/var/lib/node-containerd"

// cniConfDir holds the CNI configuration containerd reads.
const cniConfDir = "/etc/cni/net.d"

func (n *Node) startContainerd(ctx context.Context) error {
	for _, d := range []string{containerdDir, containerdRoot, cniConfDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if _, err := run(ctx, "mount", "-t", "tmpfs", "tmpfs", containerdRoot); err != nil {
		return err
	}
	n.ctrSock = filepath.Join(containerdDir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = %q
`, containerdRoot, filepath.Join(containerdDir, "state"), n.ctrSock, PauseImage, cniConfDir)
	confPath := filepath.Join(containerdDir, "config.toml")
	if err := os.WriteFile(confPath, []byte(config), 0o644); err != nil {
		return err
	}
	// The bridge plugin makes cni0 with the first address of the range,
	// the pods' gateway; hairpin mode lets a pod reach itself through a
	// Service, as kube-proxy's hairpin masquerade expects. portmap serves
	// pods' hostPorts, as the CNIs of real clusters do (a Kubernetes spec,
	// "KubeProxy should set TCP CLOSE_WAIT timeout", connects to one).
	cni := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"node","plugins":[`+
		`{"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":false,"hairpinMode":true,`+
		`"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"routes":[{"dst":"0.0.0.0/0"}]}},`+
		`{"type":"portmap","capabilities":{"portMappings":true}},`+
		`{"type":"loopback"}]}`, bridgeName, n.cfg.PodCIDR)
	if err := os.WriteFile(filepath.Join(cniConfDir, "10-bridge.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	p, err := n.startProcess("containerd", "containerd", "--config", confPath)
	if err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, p, func() error {
		_, err := os.Stat(n.ctrSock)
		return err
	})
}

// Ctr runs ctr against the node's containerd in the k8s.io namespace, the
// one the kubelet's CRI uses.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "ctr", append([]string{"--address", n.ctrSock, "--namespace", "k8s.io"}, args...)...)
}

// containerdRef is the full reference containerd stores for ref as a pod
// spec or docker-archive writes it: Docker Hub's domain and its library/
// namespace are implied when absent.
func containerdRef(ref string) string {
	first, rest, found := strings.Cut(ref, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return ref
	}
	if !found {
		return "docker.io/library/" + ref
	}
	return "docker.io/" + first + "/" + rest
}

func (n *Node) importImages(ctx context.Context) error {
	for _, img := range n.cfg.Images {
		if _, err := n.Ctr(ctx, "images", "import", img); err != nil {
			return err
		}
	}
	for alias, ref := range n.cfg.Aliases {
		if _, err := n.Ctr(ctx, "images", "tag", "--force", containerdRef(ref), containerdRef(alias)); err != nil {
			return fmt.Errorf("name %s %s: %w", ref, alias, err)
		}
	}
	out, err := n.Ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return err
	}
	if !strings.Contains(out, PauseImage) {
		return fmt.Errorf("the images hold no %s for the kubelet's pod sandboxes; containerd has:\n%s", PauseImage, out)
	}
	n.logf("images: %s", strings.Join(strings.Fields(out), " "))
	return nil
}

// kubeletDir is the kubelet's root directory.
const kubeletDir = "/var/lib/kubelet"

func (n *Node) startKubelet(ctx context.Context) error {
	if err := os.MkdirAll(kubeletDir, 0o755); err != nil {
		return err
	}
	// Containers' logs where the host reads them, as they are written.
	pods := filepath.Join(n.cfg.LogDir, "pods")
	if err := os.MkdirAll(pods, 0o755); err != nil {
		return err
	}
	if err := os.Symlink(pods, "/var/log/pods"); err != nil {
		return fmt.Errorf("containers' logs: %w", err)
	}
	config := kubeletConfig(n.ctrSock, n.cfg.ClusterDNS, n.cfg.ClusterDomain)
	confPath := filepath.Join(kubeletDir, "config.yaml")
	if err := os.WriteFile(confPath, []byte(config), 0o644); err != nil {
		return err
	}
	_, err := n.startProcess("kubelet", n.bins.Kubelet,
		"--config", confPath,
		"--kubeconfig", n.cfg.Kubeconfig,
		"--hostname-override", n.Name,
		"--node-ip", n.IP.String(),
		"--v=1")
	return err
}

// kubeletConfig is the kubelet's configuration file: containerd's socket
// ctrSock, and the cluster's DNS when dns is not empty.
func kubeletConfig(ctrSock string, dns []netip.Addr, domain string) string {
	// cgroupfs: the guest has no systemd. Eviction thresholds low: the
	// guest's disk is a tmpfs and would look full to the defaults.
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://%s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
resolvConf: ""
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, ctrSock)
	if len(dns) > 0 {
		config += "clusterDNS:\n"
		for _, a := range dns {
			config += fmt.Sprintf("  - %q\n", a)
		}
	}
	if domain != "" {
		config += fmt.Sprintf("clusterDomain: %q\n", domain)
	}
	return config
}

// waitReady waits for the Node to be Ready and for the default namespace's
// ServiceAccount and root CA ConfigMap, without which no pod starts.
func (n *Node) waitReady(ctx context.Context) error {
	cs := n.clientset
	return waitFor(ctx, 4*time.Minute, nil, func() error {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, c := range node.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				ready = true
			}
		}
		if !ready {
			return fmt.Errorf("node %s is not Ready", n.Name)
		}
		if len(node.Spec.Taints) > 0 {
			return fmt.Errorf("node %s still has taints %v", n.Name, node.Spec.Taints)
		}
		for _, ns := range []string{"default", "kube-system"} {
			if _, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
				return err
			}
			if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
}

// Clientset is an admin clientset.
func (n *Node) Clientset() *kubernetes.Clientset { return n.clientset }

// Kubectl runs kubectl as the cluster's admin, stdin from stdin when not
// empty, and returns its standard output.
func (n *Node) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := n.KubectlCommand(ctx, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// KubectlCommand returns an unstarted kubectl command as the admin.
func (n *Node) KubectlCommand(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, n.kubectl, append([]string{"--kubeconfig", n.cfg.Kubeconfig}, args...)...)
}

func (n *Node) startProcess(name, bin string, args ...string) (*agent.Process, error) {
	p, err := agent.Start(agent.Options{Name: name, Bin: bin, Args: args, LogPath: filepath.Join(n.cfg.LogDir, name+".log"), Setpgid: true})
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, p)
	return p, nil
}

// LogTails returns the last lines of every component's log.
func (n *Node) LogTails(lines int) string {
	var b strings.Builder
	for _, p := range n.procs {
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", p.Name(), lines, p.LogTail(lines))
	}
	return b.String()
}

// Stop stops the components in reverse order of their start. Pods'
// containers die with the guest; the control plane is the host's.
func (n *Node) Stop() {
	for i := len(n.procs) - 1; i >= 0; i-- {
		_ = n.procs[i].Stop(10 * time.Second)
	}
	n.procs = nil
}

// waitFor polls check every 500 ms until it returns nil, p (if not nil)
// exits, ctx ends or timeout passes, and returns check's last error then.
func waitFor(ctx context.Context, timeout time.Duration, p *agent.Process, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if p != nil && !p.Running() {
			return fmt.Errorf("%s exited: %v\n%s", p.Name(), p.ExitError(), p.LogTail(20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
