// Command controlplane runs the cluster test's control plane on the host,
// outside the emulated node: etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler, in a network namespace of their own whose tap device
// is the node's network card (the VM runner's --tap). It then runs the
// command after "--" (the VM runner with the node and the test) in the
// same namespace, with EBPF_PROXY_CLUSTER_KUBECONFIG naming a kubeconfig
// that reaches the API server from the node, and stops everything when
// the command ends, with the command's exit code.
//
// The node's one emulated vCPU then runs what a worker node runs, the
// kubelet, containerd and the pods, as on a real cluster; with the control
// plane beside them it spent over half its CPU time on the control plane
// and was saturated throughout.
//
//	controlplane --dir DIR --logs LOGDIR -- vmtest --tap node-tap ... -- cluster.test
//
// The host's own network namespace is left alone: the tap device, the
// addresses and the route to the pods are inside the private namespace,
// which is removed at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/test/cluster/node"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
)

// EnvKubeconfig names, in the command's environment, the kubeconfig of the
// cluster's admin with the API server at the host's address on the tap
// device.
const EnvKubeconfig = "EBPF_PROXY_CLUSTER_KUBECONFIG"

// inNetnsFlag marks the second run of the program, inside the namespace.
const inNetnsFlag = "in-netns"

type options struct {
	dir, logs string
	tap       string
	host      netip.Prefix
	node      netip.Addr
	pods      netip.Prefix
	// controllers is kube-controller-manager's --controllers.
	controllers string
	command     []string
}

// defaultControllers are what the cluster test's objects need: the bridge
// CNI assigns pod addresses, so no node IPAM; the garbage collector
// deletes a deleted DaemonSet's pods; the node lifecycle controller lifts
// the not-ready taint the kubelet registers with. Kubernetes' e2e suite
// (test/conformance) needs more (namespaces deleted, Endpoints and their
// mirrors kept): it asks for "*,-nodeipam".
var defaultControllers = strings.Join([]string{
	"daemonset-controller", "deployment-controller", "replicaset-controller",
	"endpointslice-controller", "serviceaccount-controller",
	"root-ca-certificate-publisher-controller", "garbage-collector-controller",
	"node-lifecycle-controller",
}, ",")

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("controlplane", flag.ContinueOnError)
	var o options
	var host, nodeAddr, pods string
	var inNetns bool
	fs.StringVar(&o.dir, "dir", "", "directory for the control plane's files and the node's kubeconfig (the node must be able to read it)")
	fs.StringVar(&o.logs, "logs", "", "directory for the components' logs")
	fs.StringVar(&o.tap, "tap", "node-tap", "tap device the node's VM attaches to")
	fs.StringVar(&host, "host-address", netip.PrefixFrom(node.DefaultIP.Masked().Addr().Next(), node.DefaultIP.Bits()).String(),
		"the control plane's address and prefix on the tap device")
	fs.StringVar(&nodeAddr, "node-address", node.DefaultIP.Addr().String(), "the node's address, the route to the pods")
	fs.StringVar(&pods, "pod-cidr", node.ClusterCIDR, "the cluster's pod range, routed to the node")
	fs.StringVar(&o.controllers, "controllers", defaultControllers, "kube-controller-manager's --controllers")
	fs.BoolVar(&inNetns, inNetnsFlag, false, "internal: run inside the namespace made by a first run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.host, err = netip.ParsePrefix(host); err == nil {
		if o.node, err = netip.ParseAddr(nodeAddr); err == nil {
			o.pods, err = netip.ParsePrefix(pods)
		}
	}
	switch {
	case err != nil:
	case o.dir == "" || o.logs == "":
		err = errors.New("--dir and --logs are required")
	case fs.NArg() == 0:
		err = errors.New("no command after the flags: controlplane [flags] -- command [args]")
	case !o.host.Contains(o.node):
		err = fmt.Errorf("the node's address %s is not in %s", o.node, o.host)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		return 2
	}
	o.command = fs.Args()
	if !inNetns {
		return enterNetns(args)
	}
	code, err := serve(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// enterNetns creates the namespace, runs this program again inside it and
// removes the namespace once that run has ended.
func enterNetns(args []string) int {
	if err := netns.PrepareDir("/run/netns"); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		return 1
	}
	path := filepath.Join("/run/netns", "ebpf-proxy-cluster-"+strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		return 1
	}
	defer func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			fmt.Fprintln(os.Stderr, "controlplane: unmount", path+":", err)
		}
		if err := os.Remove(path); err != nil {
			fmt.Fprintln(os.Stderr, "controlplane:", err)
		}
	}()
	h, err := netns.New(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		return 1
	}
	_ = h.Close()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		return 1
	}
	cmd := exec.Command(self, append([]string{"--" + inNetnsFlag}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := netns.Start(path, cmd); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		return 1
	}
	return waitForwarding(cmd)
}

// waitForwarding waits for cmd, passing it SIGINT and SIGTERM, and returns
// its exit code.
func waitForwarding(cmd *exec.Cmd) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			var exit *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &exit) && exit.ExitCode() >= 0:
				return exit.ExitCode()
			default:
				fmt.Fprintln(os.Stderr, "controlplane:", err)
				return 1
			}
		}
	}
}

// serve runs inside the namespace: the network, the control plane, then
// the command.
func serve(o options) (int, error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for _, d := range []string{o.dir, o.logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return 1, err
		}
	}
	for _, c := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "tuntap", "add", "dev", o.tap, "mode", "tap"},
		{"ip", "addr", "add", o.host.String(), "dev", o.tap},
		{"ip", "link", "set", o.tap, "up"},
		// onlink: the tap has no carrier until QEMU opens it.
		{"ip", "route", "add", o.pods.String(), "via", o.node.String(), "dev", o.tap, "onlink"},
	} {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return 1, fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	start := time.Now()
	cp, err := startControlPlane(ctx, o)
	if err != nil {
		return 1, err
	}
	defer cp.stop()
	fmt.Fprintf(os.Stderr, "controlplane: API server at %s, up in %.1fs; logs in %s\n", cp.server, time.Since(start).Seconds(), o.logs)

	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), EnvKubeconfig+"="+cp.kubeconfig)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 1, err
	}
	stop() // the command gets the signals now, and ends first
	code := waitForwarding(cmd)
	if code != 0 {
		cp.logTails(os.Stderr, 25)
	}
	return code, nil
}

// controlPlane is the running control plane.
type controlPlane struct {
	cluster *cluster.Cluster
	procs   []*agent.Process
	// server is the API server's address as the node dials it;
	// kubeconfig the admin's kubeconfig with that address.
	server     string
	kubeconfig string
}

func startControlPlane(ctx context.Context, o options) (*controlPlane, error) {
	ip := o.host.Addr().String()
	c, err := cluster.Start(ctx, cluster.Options{
		ServingIPs: []net.IP{net.ParseIP(ip)},
		// A kubeadm control plane: the API server on the host's address,
		// the kubernetes Service's endpoint kept by the lease reconciler,
		// privileged pods allowed for the proxies' DaemonSets.
		APIServerArgs: []string{
			"--bind-address=0.0.0.0",
			"--advertise-address=" + ip,
			"--endpoint-reconciler-type=lease",
			"--allow-privileged=true",
			"--kubelet-preferred-address-types=InternalIP",
		},
		StartTimeout: 4 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{cluster: c, server: net.JoinHostPort(ip, strconv.Itoa(c.Port()))}
	ok := false
	defer func() {
		if !ok {
			cp.stop()
		}
	}()
	cp.kubeconfig = filepath.Join(o.dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(cluster.AdminUser, "https://"+cp.server, cp.kubeconfig); err != nil {
		return nil, err
	}
	bins, err := cluster.FindNodeBinaries()
	if err != nil {
		return nil, err
	}
	admin := c.AdminKubeconfig()
	for _, p := range []struct {
		name, bin string
		args      []string
	}{
		{"kube-controller-manager", bins.KubeControllerManager, []string{
			"--kubeconfig", admin,
			"--service-account-private-key-file", c.ServiceAccountKeyFile(),
			"--root-ca-file", c.CAFile(),
			"--controllers=" + o.controllers,
			"--leader-elect=false",
			// kubectl rollout and DaemonSet updates are quicker checks.
			"--concurrent-daemonset-syncs=2",
		}},
		{"kube-scheduler", bins.KubeScheduler, []string{"--kubeconfig", admin, "--leader-elect=false"}},
	} {
		proc, err := agent.Start(agent.Options{Name: p.name, Bin: p.bin, Args: p.args,
			LogPath: filepath.Join(o.logs, p.name+".log"), Setpgid: true})
		if err != nil {
			return nil, err
		}
		cp.procs = append(cp.procs, proc)
	}
	ok = true
	return cp, nil
}

// logTails writes the last lines of every component's log.
func (cp *controlPlane) logTails(w *os.File, lines int) {
	for _, p := range cp.procs {
		fmt.Fprintf(w, "--- %s (last %d lines)\n%s\n", p.Name(), lines, p.LogTail(lines))
	}
	fmt.Fprint(w, cp.cluster.LogTails(lines))
}

// stop stops the controllers, then etcd and the API server.
func (cp *controlPlane) stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		_ = cp.procs[i].Stop(10 * time.Second)
	}
	cp.procs = nil
	_ = cp.cluster.Stop()
}
