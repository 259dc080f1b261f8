// Command controlplane runs the cluster test's control plane on the host,
// outside the emulated nodes: etcd, kube-apiserver, kube-controller-manager
// and kube-scheduler, in a network namespace of their own. There a bridge
// holds the control plane's address and one tap device per node,
// node<i>-tap, each a node's network card (the VM runner's --tap), and
// routes each node's pod range to its address (node.Nth): pods reach the
// pods of another node through this namespace, as through a host-gw
// network's router. It then runs the commands given with --beside (a
// second node's VM, a client outside the cluster) and the command after
// "--" (the VM runner with the first node and the test) in the same
// namespace, with EBPF_PROXY_CLUSTER_KUBECONFIG naming a kubeconfig that
// reaches the API server from the nodes, and stops everything when the
// command ends, with the command's exit code (1 if it passed and a
// --beside command failed on its own).
//
// The node's one emulated vCPU then runs what a worker node runs, the
// kubelet, containerd and the pods, as on a real cluster; with the control
// plane beside them it spent over half its CPU time on the control plane
// and was saturated throughout.
//
//	controlplane --dir DIR --logs LOGDIR --nodes 2 \
//		--beside 'node2: vmtest --tap node2-tap ... -- worker --index 2 ...' \
//		-- vmtest --tap node1-tap ... -- cluster.test
//
// The host's own network namespace is left alone: the bridge, the tap
// devices, the addresses, the routes to the pods and the forwarding
// between them are inside the private namespace, which is removed at the
// end.
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
	host      netip.Prefix
	// nodes are the cluster's nodes, numbered from 1 (node.Nth).
	nodes []node.Config
	// controllers is kube-controller-manager's --controllers.
	controllers string
	// beside are commands run beside the main command.
	beside  []besideCommand
	command []string
}

// besideCommand is a command run beside the main one (--beside).
type besideCommand struct {
	name string
	args []string
}

// bridgeName is the bridge of the nodes' tap devices.
const bridgeName = "cluster-br"

// TapName is the tap device of the cluster's i-th node.
func TapName(i int) string { return fmt.Sprintf("node%d-tap", i) }

// besideList is the repeatable --beside flag.
type besideList []besideCommand

func (l *besideList) String() string { return fmt.Sprint(len(*l), " commands") }

// Set parses "NAME: COMMAND ARGS..." or "COMMAND ARGS...", split at spaces.
func (l *besideList) Set(v string) error {
	f := strings.Fields(v)
	c := besideCommand{}
	if len(f) > 0 && strings.HasSuffix(f[0], ":") {
		c.name, f = strings.TrimSuffix(f[0], ":"), f[1:]
	}
	if len(f) == 0 {
		return fmt.Errorf("%q names no command", v)
	}
	if c.name == "" {
		c.name = filepath.Base(f[0])
	}
	c.args = f
	*l = append(*l, c)
	return nil
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
	var host string
	var nodes int
	var beside besideList
	var inNetns bool
	fs.StringVar(&o.dir, "dir", "", "directory for the control plane's files and the node's kubeconfig (the node must be able to read it)")
	fs.StringVar(&o.logs, "logs", "", "directory for the components' logs")
	fs.IntVar(&nodes, "nodes", 1, "the number of nodes: a tap device node<i>-tap for each, on one bridge, and a route to its pods")
	fs.StringVar(&host, "host-address", netip.PrefixFrom(node.DefaultIP.Masked().Addr().Next(), node.DefaultIP.Bits()).String(),
		"the control plane's address and prefix on the nodes' bridge")
	fs.Var(&beside, "beside", "'[NAME:] COMMAND ARGS...' to run beside the command, split at spaces; ended when the command ends (repeatable)")
	fs.StringVar(&o.controllers, "controllers", defaultControllers, "kube-controller-manager's --controllers")
	fs.BoolVar(&inNetns, inNetnsFlag, false, "internal: run inside the namespace made by a first run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.beside = beside
	var err error
	o.host, err = netip.ParsePrefix(host)
	for i := 1; err == nil && i <= nodes; i++ {
		var n node.Config
		if n, err = node.Nth(i); err == nil && !o.host.Contains(n.IP.Addr()) {
			err = fmt.Errorf("%s's address %s is not in %s", n.Name, n.IP.Addr(), o.host)
		}
		o.nodes = append(o.nodes, n)
	}
	switch {
	case err != nil:
	case nodes < 1:
		err = fmt.Errorf("--nodes %d: want at least 1", nodes)
	case o.dir == "" || o.logs == "":
		err = errors.New("--dir and --logs are required")
	case fs.NArg() == 0:
		err = errors.New("no command after the flags: controlplane [flags] -- command [args]")
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
	if err := setupNetwork(ctx, o); err != nil {
		return 1, err
	}
	start := time.Now()
	cp, err := startControlPlane(ctx, o)
	if err != nil {
		return 1, err
	}
	defer cp.stop()
	fmt.Fprintf(os.Stderr, "controlplane: API server at %s, up in %.1fs; logs in %s\n", cp.server, time.Since(start).Seconds(), o.logs)

	env := append(os.Environ(), EnvKubeconfig+"="+cp.kubeconfig)
	var beside []*besideProcess
	for _, b := range o.beside {
		p, err := startBeside(b, env)
		if err != nil {
			stopBeside(beside)
			return 1, fmt.Errorf("--beside %s: %w", b.name, err)
		}
		beside = append(beside, p)
	}
	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		stopBeside(beside)
		return 1, err
	}
	stop() // the command gets the signals now, and ends first
	code := waitForwarding(cmd)
	if failed := stopBeside(beside); failed != "" && code == 0 {
		fmt.Fprintln(os.Stderr, "controlplane: the command passed, but", failed)
		code = 1
	}
	if code != 0 {
		cp.logTails(os.Stderr, 25)
	}
	return code, nil
}

// setupNetwork makes the bridge with the control plane's address, a tap
// device per node on it, and a route to each node's pods; and turns on
// forwarding in this namespace, the nodes' router, without redirects (a
// node should not learn another's pods' route from them: every node's
// traffic to other nodes' pods comes this way).
func setupNetwork(ctx context.Context, o options) error {
	cmds := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", bridgeName, "type", "bridge"},
		{"ip", "addr", "add", o.host.String(), "dev", bridgeName},
		{"ip", "link", "set", bridgeName, "up"},
	}
	for i, n := range o.nodes {
		tap := TapName(i + 1)
		cmds = append(cmds,
			[]string{"ip", "tuntap", "add", "dev", tap, "mode", "tap"},
			[]string{"ip", "link", "set", tap, "master", bridgeName},
			[]string{"ip", "link", "set", tap, "up"},
			// onlink: the bridge has no carrier until QEMU opens a tap.
			[]string{"ip", "route", "add", n.PodCIDR, "via", n.IP.Addr().String(), "dev", bridgeName, "onlink"})
	}
	for _, c := range cmds {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	// This namespace's own settings (the process is in it): never the
	// host's.
	for key, val := range map[string]string{
		"net/ipv4/ip_forward":                             "1",
		"net/ipv4/conf/all/send_redirects":                "0",
		"net/ipv4/conf/" + bridgeName + "/send_redirects": "0",
	} {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(val), 0o644); err != nil {
			return fmt.Errorf("sysctl %s in the control plane's namespace: %w", key, err)
		}
	}
	return nil
}

// besideProcess is a running --beside command.
type besideProcess struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// signalled is set once it was told to stop.
	signalled bool
}

// startBeside starts b in a process group of its own (a VM runner's QEMU
// is in it too), its output on stderr, each line after its name.
func startBeside(b besideCommand, env []string) (*besideProcess, error) {
	p := &besideProcess{name: b.name, done: make(chan struct{})}
	p.cmd = exec.Command(b.args[0], b.args[1:]...)
	p.cmd.Env = env
	w := agent.PrefixWriter(b.name+": ", os.Stderr)
	p.cmd.Stdout, p.cmd.Stderr = w, w
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		w.Close()
		close(p.done)
	}()
	return p, nil
}

// besideGrace is how long a --beside command has to end once told to.
const besideGrace = 2 * time.Minute

// stopBeside sends SIGTERM to each command still running, waits for it up
// to besideGrace, then kills its process group; it returns what failed on
// its own (a non-zero exit before it was told to stop), or "".
func stopBeside(ps []*besideProcess) string {
	for _, p := range ps {
		select {
		case <-p.done:
		default:
			p.signalled = true
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	var failed []string
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(besideGrace):
			fmt.Fprintf(os.Stderr, "controlplane: %s did not end within %s of SIGTERM: killing its process group\n", p.name, besideGrace)
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if p.err != nil && !p.signalled {
			failed = append(failed, fmt.Sprintf("%s failed: %v", p.name, p.err))
		}
	}
	return strings.Join(failed, "; ")
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
