package sandbox_test

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main()
	os.Exit(m.Run())
}

var (
	podAIP   = netip.MustParseAddr("10.244.1.10")
	podBIP   = netip.MustParseAddr("10.244.1.11")
	clientIP = netip.MustParseAddr("10.244.1.100")
)

// cluster is one node with two pods serving on several ports and a client
// on the same bridge.
type cluster struct {
	sb          *sandbox.Sandbox
	node        *sandbox.Node
	podA, podB  *sandbox.Pod
	client      *sandbox.Client
	podAServers map[string]*sandbox.Server
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{sb: sandbox.ForTest(t), podAServers: map[string]*sandbox.Server{}}
	c.node = must(c.sb.AddNode("node1"))(t)
	c.podA = must(c.sb.AddPod(c.node, "pod-a", podAIP))(t)
	c.podB = must(c.sb.AddPod(c.node, "pod-b", podBIP))(t)
	for _, pod := range []*sandbox.Pod{c.podA, c.podB} {
		tcp := must(pod.StartTCPServer(8080))(t)
		udp := must(pod.StartUDPServer(8080))(t)
		must(pod.StartTCPServer(9090))(t)
		must(pod.StartHTTPServer(8081))(t)
		if pod == c.podA {
			c.podAServers["tcp"], c.podAServers["udp"] = tcp, udp
		}
	}
	c.client = must(c.sb.AddClient(c.node, "client", clientIP))(t)
	return c
}

func must[T any](v T, err error) func(testing.TB) T {
	return func(tb testing.TB) T {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
		return v
	}
}

func netlinkAddr(a netip.Addr) (*netlink.Addr, error) {
	return netlink.ParseAddr(netip.PrefixFrom(a, a.BitLen()).String())
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// checkProcess asserts that a probe ran as a separate process inside the
// sandbox's cgroup and the client's namespace.
func checkProcess(t *testing.T, sb *sandbox.Sandbox, c *sandbox.Client, p sandbox.Process) {
	t.Helper()
	if p.Cgroup != sb.Cgroup.Name() {
		t.Errorf("probe ran in cgroup %q, want %q", p.Cgroup, sb.Cgroup.Name())
	}
	if p.Netns != c.NS.Inode() {
		t.Errorf("probe ran in netns %d, want %d (%s)", p.Netns, c.NS.Inode(), c.NS.Name())
	}
	if p.PID == os.Getpid() || p.PID == 0 {
		t.Errorf("probe PID %d is not a separate process", p.PID)
	}
}

// answer is what a probe attempt saw, whatever the protocol.
type answer struct {
	server     string
	clientSeen netip.AddrPort
	peer       netip.AddrPort // getpeername, or the reply's source for unconnected UDP
	local      netip.AddrPort
	err        string
}

// probe runs one kind of probe three times and reduces the results to
// answers.
type probe func(t *testing.T, c *sandbox.Client, dst netip.AddrPort) (sandbox.Process, []answer)

func tcpProbe(t *testing.T, c *sandbox.Client, dst netip.AddrPort) (sandbox.Process, []answer) {
	rep, err := c.TCP(t.Context(), dst, 3)
	if err != nil {
		t.Fatal(err)
	}
	var out []answer
	for _, r := range rep.Results {
		out = append(out, answer{r.Server, r.ClientSeen, r.Peer, r.Local, r.Err})
	}
	return rep.Process, out
}

func udpProbe(t *testing.T, c *sandbox.Client, dst netip.AddrPort) (sandbox.Process, []answer) {
	rep, err := c.UDP(t.Context(), dst, 3)
	if err != nil {
		t.Fatal(err)
	}
	var out []answer
	for _, r := range rep.Results {
		out = append(out, answer{r.Server, r.ClientSeen, r.From, r.Local, r.Err})
	}
	return rep.Process, out
}

func udpConnectedProbe(t *testing.T, c *sandbox.Client, dst netip.AddrPort) (sandbox.Process, []answer) {
	rep, err := c.UDPConnected(t.Context(), dst, 3)
	if err != nil {
		t.Fatal(err)
	}
	var out []answer
	for _, r := range rep.Results {
		if r.Err == "" && r.From != r.Peer {
			r.Err = fmt.Sprintf("reply from %s, peer %s", r.From, r.Peer)
		}
		out = append(out, answer{r.Server, r.ClientSeen, r.Peer, r.Local, r.Err})
	}
	return rep.Process, out
}

func httpProbe(t *testing.T, c *sandbox.Client, dst netip.AddrPort) (sandbox.Process, []answer) {
	rep, err := c.HTTP(t.Context(), dst, "/", 3)
	if err != nil {
		t.Fatal(err)
	}
	var out []answer
	for _, r := range rep.Results {
		if r.Err == "" && r.Status != 200 {
			r.Err = fmt.Sprintf("status %d", r.Status)
		}
		// HTTP hides the socket: only the server's view can be checked.
		out = append(out, answer{r.Server, r.ClientSeen, dst, r.ClientSeen, r.Err})
	}
	return rep.Process, out
}

func TestProbesReachPodServers(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	tests := []struct {
		name   string
		probe  probe
		dst    netip.AddrPort
		server string
	}{
		{"tcp to pod-a is answered by pod-a, which sees the client", tcpProbe, ap(podAIP, 8080), "pod-a"},
		{"tcp to a second port of pod-b is answered by pod-b", tcpProbe, ap(podBIP, 9090), "pod-b"},
		{"udp sendto on the same port number as tcp is answered by pod-a", udpProbe, ap(podAIP, 8080), "pod-a"},
		{"connected udp to pod-b is answered by pod-b", udpConnectedProbe, ap(podBIP, 8080), "pod-b"},
		{"http to pod-b is answered by pod-b", httpProbe, ap(podBIP, 8081), "pod-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proc, answers := tt.probe(t, c.client, tt.dst)
			checkProcess(t, c.sb, c.client, proc)
			if len(answers) != 3 {
				t.Fatalf("got %d results, want 3", len(answers))
			}
			for _, a := range answers {
				if a.err != "" {
					t.Errorf("attempt failed: %s", a.err)
					continue
				}
				if a.server != tt.server {
					t.Errorf("answered by %q, want %q", a.server, tt.server)
				}
				if a.clientSeen.Addr() != clientIP || a.clientSeen.Port() != a.local.Port() {
					t.Errorf("server saw client %s, client socket is %s (want address %s)", a.clientSeen, a.local, clientIP)
				}
				if a.peer != tt.dst {
					t.Errorf("peer is %s, want %s", a.peer, tt.dst)
				}
			}
		})
	}
}

func TestProbesReportFailuresByErrno(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	// A closed server must stop answering: its port is then refused.
	for _, srv := range c.podAServers {
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
	}
	tcp := func(dst netip.AddrPort) func() (string, error) {
		return func() (string, error) {
			rep, err := c.client.TCP(t.Context(), dst, 1)
			if err != nil {
				return "", err
			}
			return rep.Results[0].Err, nil
		}
	}
	tests := []struct {
		name    string
		probe   func() (errName string, err error)
		wantErr string
	}{
		{"tcp to a port nobody listens on is refused", tcp(ap(podBIP, 7)), "ECONNREFUSED"},
		{"tcp to a closed server is refused", tcp(ap(podAIP, 8080)), "ECONNREFUSED"},
		{"tcp to a ClusterIP without a proxy has no route off the sandbox", tcp(ap(netip.MustParseAddr("10.96.0.10"), 80)), "ENETUNREACH"},
		{"connected udp to a closed server is refused", func() (string, error) {
			rep, err := c.client.UDPConnected(t.Context(), ap(podAIP, 8080), 1)
			if err != nil {
				return "", err
			}
			return rep.Results[0].Err, nil
		}, "ECONNREFUSED"},
		{"unconnected udp to a closed server gets no reply", func() (string, error) {
			rep, err := c.client.WithTimeout(300*time.Millisecond).UDP(t.Context(), ap(podAIP, 8080), 1)
			if err != nil {
				return "", err
			}
			return rep.Results[0].Err, nil
		}, "ETIMEDOUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.probe()
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.wantErr {
				t.Errorf("got error %q, want %q", got, tt.wantErr)
			}
		})
	}
}

func TestTopologyConnectsNodesPodsAndClients(t *testing.T) {
	sandbox.RequireRoot(t)
	sb := sandbox.ForTest(t)
	node1 := must(sb.AddNode("node1"))(t)
	node2 := must(sb.AddNode("node2"))(t)
	podA := must(sb.AddPod(node1, "pod-a", netip.Addr{}))(t)
	podC := must(sb.AddPod(node2, "pod-c", netip.Addr{}))(t)
	client := must(sb.AddClient(node1, "client", clientIP))(t)
	ext := must(sb.AddExternalClient("ext", netip.Addr{}))(t)
	for _, h := range []*sandbox.Host{podA.Host, podC.Host, node2.Host} {
		must(h.StartTCPServer(80))(t)
	}
	// A LoadBalancer IP held by node2 and announced to the router.
	lbIP := netip.MustParseAddr("198.19.0.10")
	lo := must(node2.NS.Netlink().LinkByName("lo"))(t)
	if err := node2.NS.Netlink().AddrAdd(lo, must(netlinkAddr(lbIP))(t)); err != nil {
		t.Fatal(err)
	}
	if err := sb.RouteToNode(netip.PrefixFrom(lbIP, 32), node2); err != nil {
		t.Fatal(err)
	}

	if podA.IP != netip.MustParseAddr("10.244.1.10") || podC.IP != netip.MustParseAddr("10.244.2.10") || ext.IP != netip.MustParseAddr("198.18.0.10") {
		t.Errorf("picked addresses %s, %s, %s; want the first free from .10 of each subnet", podA.IP, podC.IP, ext.IP)
	}
	tests := []struct {
		name     string
		from     *sandbox.Client
		dst      netip.AddrPort
		server   string
		clientIP netip.Addr
	}{
		{"a client reaches a pod on another node without NAT", client, ap(podC.IP, 80), "pod-c", clientIP},
		{"an external client reaches a pod through the router", ext, ap(podA.IP, 80), "pod-a", ext.IP},
		{"a node reaches its own pod from its bridge address", sb.ClientAt(node1.Host), ap(podA.IP, 80), "pod-a", node1.Gateway},
		{"a node reaches another node's pod from its node address", sb.ClientAt(node1.Host), ap(podC.IP, 80), "pod-c", node1.IP},
		{"an external client reaches a LoadBalancer IP routed to node2", ext, ap(lbIP, 80), "node2", ext.IP},
		{"a pod reaches a server on a node address", sb.ClientAt(podA.Host), ap(node2.IP, 80), "node2", podA.IP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := tt.from.TCP(t.Context(), tt.dst, 1)
			if err != nil {
				t.Fatal(err)
			}
			checkProcess(t, sb, tt.from, rep.Process)
			r := rep.Results[0]
			if r.Err != "" || r.Server != tt.server || r.ClientSeen.Addr() != tt.clientIP {
				t.Errorf("got server %q seeing %s (error %q), want %q seeing %s", r.Server, r.ClientSeen, r.Err, tt.server, tt.clientIP)
			}
		})
	}
}

func TestLoopRunsInsideCgroupAndNetns(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	loop, err := c.client.StartLoop(t.Context(), ap(podAIP, 8080), sandbox.LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Seen from outside while it runs: the probe is in the child cgroup and
	// the client namespace.
	procs, err := c.sb.Cgroup.Procs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(procs, loop.PID()) {
		t.Errorf("cgroup.procs = %v, want it to hold the loop's PID %d", procs, loop.PID())
	}
	if slices.Contains(procs, os.Getpid()) {
		t.Errorf("the test process itself moved into the sandbox cgroup")
	}
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", loop.PID()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino != c.client.NS.Inode() {
		t.Errorf("loop runs in netns %d, want the client's %d", st.Ino, c.client.NS.Inode())
	}
	res, err := loop.Stop()
	if err != nil {
		t.Fatal(err)
	}
	checkProcess(t, c.sb, c.client, res.Process)
	if res.Attempts < 1 || res.Failures != 0 || res.Servers["pod-a"] != res.Attempts {
		t.Errorf("loop result %+v, want every attempt answered by pod-a", res)
	}
}

func TestUDPLoopExchangesDatagrams(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	loop, err := c.client.StartLoop(t.Context(), ap(podAIP, 8080), sandbox.LoopOptions{UDP: true, MaxAttempts: 20})
	if err != nil {
		t.Fatal(err)
	}
	res, err := loop.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts < 1 || res.Failures != 0 || res.Servers["pod-a"] != res.Attempts {
		t.Errorf("loop result %+v, want every attempt answered by pod-a", res)
	}
	// Nothing listens on UDP 8081: every attempt fails (the port
	// unreachable answer, or no answer in time).
	loop, err = c.client.StartLoop(t.Context(), ap(podAIP, 8081), sandbox.LoopOptions{UDP: true, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res, err = loop.Stop(); err != nil {
		t.Fatal(err)
	}
	if res.Attempts < 1 || res.Failures != res.Attempts {
		t.Errorf("loop to a closed UDP port: %+v, want every attempt failed", res)
	}
	// Each failure is detailed, with its time and errno, for a test to
	// set beside what it did meanwhile.
	if len(res.Failed) != res.Failures {
		t.Errorf("loop detailed %d failures of %d: %v", len(res.Failed), res.Failures, res.Failed)
	}
	for _, f := range res.Failed {
		if f.Err == "" || f.At.IsZero() || time.Since(f.At) > time.Minute {
			t.Errorf("failure detail %+v, want its errno and when it started", f)
		}
	}
}

func TestHeldConnectionCarriesDataUntilClosed(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	dst := ap(podAIP, 8080)
	h, err := c.client.Hold(t.Context(), dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	checkProcess(t, c.sb, c.client, h.Process)
	if f := h.First; !f.Connected || f.Err != "" || f.Server != "pod-a" || f.Peer != dst ||
		f.ClientSeen.Addr() != clientIP || f.ClientSeen.Port() != f.Local.Port() {
		t.Fatalf("held connection %+v, want one to pod-a that saw the client's socket", f)
	}
	// The same connection, not a new one per ping: new connections are
	// made and closed meanwhile, and the held one goes on.
	for i := range 20 {
		if err := h.Ping(); err != nil {
			t.Fatalf("ping %d: %v", i+1, err)
		}
		if i == 10 {
			rep, err := c.client.TCP(t.Context(), dst, 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				if r.Err != "" || r.Local == h.First.Local {
					t.Fatalf("new connection beside the held one: %+v", r)
				}
			}
		}
	}
	if err := h.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := h.Ping(); err == nil {
		t.Errorf("ping after Close succeeded")
	}
	// The probe has exited and was reaped.
	if procs := must(c.sb.Cgroup.Procs())(t); len(procs) != 0 {
		t.Errorf("cgroup.procs = %v after Close, want it empty", procs)
	}
}

func TestHeldConnectionReportsFailuresByErrno(t *testing.T) {
	sandbox.RequireRoot(t)
	tests := []struct {
		name string
		dst  netip.AddrPort
		// breakIt runs after the connection is held, before the pings.
		breakIt   func(t *testing.T, c *cluster)
		wantFirst string
		wantPing  []string // any of these
	}{
		{"a closed server ends the connection", ap(podAIP, 8080), func(t *testing.T, c *cluster) {
			if err := c.podAServers["tcp"].Close(); err != nil {
				t.Fatal(err)
			}
		}, "", []string{"EOF", "ECONNRESET", "EPIPE"}},
		{"a connection refused at open was never connected", ap(podBIP, 7), func(*testing.T, *cluster) {}, "ECONNREFUSED", []string{"ENOTCONN"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t)
			h, err := c.client.Hold(t.Context(), tt.dst)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			if h.First.Err != tt.wantFirst {
				t.Fatalf("held connection %+v, want error %q", h.First, tt.wantFirst)
			}
			tt.breakIt(t, c)
			// Every ping fails from now on, and says why.
			for i := range 3 {
				err := h.Ping()
				if err == nil || !slices.ContainsFunc(tt.wantPing, func(e string) bool { return strings.Contains(err.Error(), e) }) {
					t.Errorf("ping %d: %v, want an error naming one of %v", i+1, err, tt.wantPing)
				}
			}
			// Failed pings are results, not a failure of the probe.
			if err := h.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

func TestHeldConnectionSurvivesALinkOutage(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	h, err := c.client.WithTimeout(500*time.Millisecond).Hold(t.Context(), ap(podAIP, 8080))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Ping(); err != nil {
		t.Fatal(err)
	}
	nl := c.podA.NS.Netlink()
	link := must(nl.LinkByName(sandbox.IfaceName))(t)
	if err := nl.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	if err := h.Ping(); err == nil || !strings.Contains(err.Error(), "ETIMEDOUT") {
		t.Errorf("ping while the pod's link is down: %v, want ETIMEDOUT", err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	// TCP retransmits what was lost on its own schedule; the late echo of
	// the ping that timed out must not count as the answer to a later one.
	var perr error
	for range 30 {
		if perr = h.Ping(); perr == nil {
			break
		}
	}
	if perr != nil {
		t.Fatalf("held connection did not recover after the link came back: %v", perr)
	}
	if err := h.Ping(); err != nil {
		t.Errorf("ping after recovery: %v", err)
	}
}

func TestForwardingIsPerNamespace(t *testing.T) {
	sandbox.RequireRoot(t)
	before := must(os.ReadFile("/proc/sys/net/ipv4/ip_forward"))(t)
	sb := sandbox.ForTest(t)
	node := must(sb.AddNode("node1"))(t)
	var inNode []byte
	err := node.NS.Do(func() (err error) {
		inNode, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(inNode) != "1\n" {
		t.Errorf("node forwarding = %q, want enabled", inNode)
	}
	if after := must(os.ReadFile("/proc/sys/net/ipv4/ip_forward"))(t); string(after) != string(before) {
		t.Errorf("host ip_forward changed from %q to %q", before, after)
	}
}

func TestBadTopologyInputIsRejected(t *testing.T) {
	sandbox.RequireRoot(t)
	sb := sandbox.ForTest(t)
	node := must(sb.AddNode("node1"))(t)
	must(sb.AddPod(node, "pod-a", podAIP))(t)
	// A name clash with a namespace the sandbox did not create must fail
	// without removing it.
	foreign := filepath.Join("/run/netns", sb.ID+"-clash")
	if err := os.WriteFile(foreign, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(foreign) })
	tests := []struct {
		name    string
		add     func() error
		wantErr string
	}{
		{"pod outside the node's subnet", func() error { _, err := sb.AddPod(node, "pod-x", netip.MustParseAddr("10.244.2.10")); return err }, "not in 10.244.1.0/24"},
		{"pod on the gateway address", func() error { _, err := sb.AddPod(node, "pod-x", node.Gateway); return err }, "gateway"},
		{"pod on the broadcast address", func() error {
			_, err := sb.AddPod(node, "pod-x", netip.MustParseAddr("10.244.1.255"))
			return err
		}, "broadcast"},
		{"pod on a used address", func() error { _, err := sb.AddPod(node, "pod-x", podAIP); return err }, "already used"},
		{"pod with a used name", func() error { _, err := sb.AddPod(node, "pod-a", netip.Addr{}); return err }, "already used"},
		{"pod with an invalid name", func() error { _, err := sb.AddPod(node, "Pod_A", netip.Addr{}); return err }, "invalid host name"},
		{"external client outside the external network", func() error { _, err := sb.AddExternalClient("ext", podBIP); return err }, "not in 198.18.0.0/24"},
		{"namespace name taken by someone else", func() error { _, err := sb.AddPod(node, "clash", netip.Addr{}); return err }, "file exists"},
		{"node with a pod's name", func() error { _, err := sb.AddNode("pod-a"); return err }, "already used"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.add()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("a netns name the sandbox did not create was touched: %v", err)
	}
}

func TestCloseLeavesNothingBehind(t *testing.T) {
	sandbox.RequireRoot(t)
	sb, err := sandbox.New()
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			sb.Close()
		}
	})
	node := must(sb.AddNode("node1"))(t)
	pod := must(sb.AddPod(node, "pod-a", podAIP))(t)
	must(pod.StartTCPServer(8080))(t)
	must(pod.StartUDPServer(8080))(t)
	client := must(sb.AddClient(node, "client", clientIP))(t)
	ext := must(sb.AddExternalClient("ext", netip.Addr{}))(t)
	// Left running on purpose: Close must end them.
	loop := must(client.StartLoop(t.Context(), ap(podAIP, 8080), sandbox.LoopOptions{}))(t)
	held := must(client.Hold(t.Context(), ap(podAIP, 8080)))(t)
	if err := held.Ping(); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(filepath.Join(sb.BPFFS.Path(), "probe_map")); err != nil {
		t.Fatal(err)
	}
	m.Close()

	var nsPaths []string
	for _, h := range []*sandbox.Host{sb.Router, node.Host, pod.Host, client.Host, ext.Host} {
		nsPaths = append(nsPaths, h.NS.Path())
		if _, err := os.Stat(h.NS.Path()); err != nil {
			t.Fatalf("netns of %s missing before Close: %v", h.Name, err)
		}
	}
	cgroupMount := filepath.Dir(sb.Cgroup.Path())
	cgroupName := sb.Cgroup.Name()
	bpffs := sb.BPFFS.Path()

	closed = true
	if err := sb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := loop.Stop(); err != nil {
		t.Errorf("loop after Close: %v", err)
	}
	if err := held.Close(); err != nil {
		t.Errorf("held connection after Close: %v", err)
	}
	if err := held.Ping(); err == nil {
		t.Errorf("ping on a held connection after Close succeeded")
	}
	for _, p := range append(nsPaths, cgroupMount, bpffs) {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (stat: %v)", p, err)
		}
	}
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), sb.ID) {
			t.Errorf("netns %s left behind", e.Name())
		}
	}
	mounts := must(os.Open("/proc/self/mountinfo"))(t)
	defer mounts.Close()
	sc := bufio.NewScanner(mounts)
	for sc.Scan() {
		if strings.Contains(sc.Text(), sb.ID) {
			t.Errorf("mount left behind: %s", sc.Text())
		}
	}
	// A fresh cgroup2 mount shows the whole hierarchy: the child is gone.
	fresh, err := sandbox.NewCgroup()
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if _, err := os.Stat(filepath.Join(filepath.Dir(fresh.Path()), cgroupName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s left behind (stat: %v)", cgroupName, err)
	}
}

func TestUDPConnectsCallsConnectNTimes(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	res, err := c.client.UDPConnects(t.Context(), ap(podAIP, 8080), 1000)
	if err != nil {
		t.Fatal(err)
	}
	if res.Connects != 1000 || res.Err != "" || res.Elapsed <= 0 {
		t.Errorf("1000 connects to a pod: %+v, want all of them, timed", res)
	}
}

func TestUDPReconnectsMovesOneSocket(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	addrs := []netip.AddrPort{ap(podAIP, 8080), ap(podBIP, 8080), ap(podAIP, 8080)}
	rep, err := c.client.UDPReconnects(t.Context(), addrs)
	if err != nil {
		t.Fatal(err)
	}
	checkProcess(t, c.sb, c.client, rep.Process)
	if len(rep.Results) != len(addrs) {
		t.Fatalf("%d results for %d addresses", len(rep.Results), len(addrs))
	}
	for i, r := range rep.Results {
		want := map[netip.Addr]string{podAIP: "pod-a", podBIP: "pod-b"}[addrs[i].Addr()]
		if r.Err != "" || r.Server != want || r.Peer != addrs[i] || r.From != addrs[i] {
			t.Errorf("exchange %d, connected to %s: %+v, want an answer from %s, with that peer and source", i, addrs[i], r, want)
		}
		if r.Local != rep.Results[0].Local {
			t.Errorf("exchange %d from %s, the first from %s: want one socket", i, r.Local, rep.Results[0].Local)
		}
	}
	if _, err := c.client.UDPReconnects(t.Context(), []netip.AddrPort{ap(podAIP, 8080), netip.MustParseAddrPort("[fd00::1]:8080")}); err == nil {
		t.Error("addresses of two families on one socket: no error")
	}
}

func TestUDPFromKeepsItsSourcePort(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	first, err := c.client.UDPFrom(t.Context(), ap(podAIP, 8080), 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.Err != "" || first.Server != "pod-a" || first.Local.Port() == 0 {
		t.Fatalf("first datagram to pod-a: %+v, want an answer from a kernel-chosen port", first)
	}
	// The server sees the same source twice: one flow, as a sender that
	// keeps its socket makes.
	again, err := c.client.UDPFrom(t.Context(), ap(podAIP, 8080), first.Local.Port())
	if err != nil {
		t.Fatal(err)
	}
	if again.Err != "" || again.Local != first.Local || again.ClientSeen != first.ClientSeen {
		t.Errorf("second datagram from port %d: %+v, want an answer to %s, seen as %s", first.Local.Port(), again, first.Local, first.ClientSeen)
	}
	if _, err := c.client.UDPFrom(t.Context(), netip.MustParseAddrPort("[::ffff:10.0.0.1]:8080"), 40000); err == nil {
		t.Error("a source port to an IPv4-mapped address: no error")
	}
}
