package tclb_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Where the meshed pod's outbound TCP is redirected, and the mark its
// proxy's own connections carry (Istio's: port 15001, user 1337).
const (
	meshPort = 15001
	meshMark = 1337
)

// TestMeshedPodSeesTheService: a pod with a service mesh's sidecar (its
// outbound TCP redirected by its own iptables rules to a proxy that reads
// SO_ORIGINAL_DST, as Istio's and Linkerd's do) connects to a ClusterIP.
//   - When the socket programs translate every socket, the proxy is told the
//     backend's address and cannot match the Service: the known limit of
//     socket load balancing, which the setting below exists for.
//   - When they translate only the node's own sockets, the proxy is told
//     the ClusterIP and port; its own connection to the ClusterIP is
//     translated per packet at the pod's device and reaches the backend,
//     which sees the pod; the pod's socket has the ClusterIP as its peer.
//     The node's own sockets are still translated at connect().
//
// Both families.
func TestMeshedPodSeesTheService(t *testing.T) {
	for _, nodeOnly := range []bool{false, true} {
		name := "every socket"
		if nodeOnly {
			name = "node sockets only"
		}
		t.Run(name, func(t *testing.T) {
			e := newTopology(t)
			a, b := e.nodes[0], e.nodes[1]
			podA, podB := e.pods["pod-a"], e.pods["pod-b"]
			e.attachDevices(a, loader.TCAttachAuto, []loader.TCDevice{
				{Name: sandbox.IfaceName, SNAT: a.IP, SNAT6: a.IP6},
				{Name: podA.HostVeth, SNAT: a.Gateway, SNAT6: a.Gateway6, Pod: true},
			})
			e.attach(b, loader.TCAttachAuto, false)
			sock := e.loadSockets(a, nodeOnly)
			e.sync(scenario()...)
			e.sync6(scenario()...)
			proxy, err := podA.StartRedirectProxy(meshPort, meshMark)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			pod, node := e.sb.ClientAt(podA.Host), e.sb.ClientAt(a.Host)

			for _, v6 := range []bool{false, true} {
				ip := func(x netip.Addr) netip.Addr {
					if v6 {
						return sandbox.IPv6Of(x)
					}
					return x
				}
				vip := netip.AddrPortFrom(ip(netip.MustParseAddr("10.96.0.11")), 80)
				backend := netip.AddrPortFrom(ip(podB.IP), tcpPort)
				before := proxy.Originals()
				rep, err := pod.TCP(e.ctx(), vip, 3)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rep.Results {
					if r.Err != "" || r.Server != "pod-b" || r.ClientSeen.Addr() != ip(podA.IP) || r.Peer != vip {
						t.Errorf("pod to %s through its proxy: got %+v; want pod-b seeing %s, the peer %s", vip, r, ip(podA.IP), vip)
					}
				}
				all := proxy.Originals()
				if errs := proxy.Failures(); len(errs) > 0 {
					t.Errorf("proxy: %v", errors.Join(errs...))
				}
				want := vip
				if !nodeOnly {
					want = backend
				}
				if got := all[len(before):]; len(got) != 3 || slices.ContainsFunc(got, func(o netip.AddrPort) bool { return o != want }) {
					t.Errorf("the proxy was told %v; want %s three times", got, want)
				}

				translated := sockCounter(t, sock, bpfobj.SockLbMetricLB_M_XLATE_TCP)
				rep, err = node.TCP(e.ctx(), vip, 2)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rep.Results {
					if r.Err != "" || r.Server != "pod-b" || r.Peer != vip {
						t.Errorf("node to %s: got %+v; want pod-b, the peer %s", vip, r, vip)
					}
				}
				if n := sockCounter(t, sock, bpfobj.SockLbMetricLB_M_XLATE_TCP); n < translated+2 {
					t.Errorf("the node's connects were not translated at connect(): %d translated, want 2", n-translated)
				}
			}
		})
	}
}

// loadSockets loads the socket programs of node n's agent onto the
// sandbox's cgroup, sharing the maps the TC programs pinned, with
// nodeOnly as the agent's choice of whose sockets they translate.
func (e *env) loadSockets(n *node, nodeOnly bool) *loader.Loaded {
	t := e.t
	t.Helper()
	var l *loader.Loaded
	err := n.NS.Do(func() error {
		cookie, err := loader.NetnsCookie()
		if err != nil {
			return err
		}
		l, err = loader.Load(loader.Config{
			BPFFSPath: filepath.Join(e.sb.BPFFS.Path(), n.Name), CgroupPath: e.sb.Cgroup.Path(), Sizes: small,
			NodeNetnsCookie: cookie, NodeSocketsOnly: nodeOnly,
		})
		return err
	})
	if err != nil {
		t.Fatalf("load the socket programs of %s: %v", n.Name, err)
	}
	t.Cleanup(l.Close)
	return l
}

func sockCounter(t *testing.T, l *loader.Loaded, m bpfobj.SockLbMetric) uint64 {
	t.Helper()
	c, err := l.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c[m]
}

// TestAgentTranslatesPodsPerPacket: the agent with --socket-lb-scope=node
// leaves pods' sockets alone and attaches the per-packet programs to their
// devices, also to a pod's that appears after it started: a meshed pod's
// proxy sees the ClusterIP, its connection reaches the backend, a pod
// reaches itself through its Service (shown the bridge address), a new pod
// reaches Services, and the node's own sockets are still translated.
func TestAgentTranslatesPodsPerPacket(t *testing.T) {
	e := newTopology(t)
	a := e.nodes[0]
	podA := e.pods["pod-a"]
	dir := t.TempDir()
	e.writeAgentManifests(t, dir)
	cg, err := e.sb.AddCgroup("agent")
	if err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(e.sb.BPFFS.Path(), "agent")
	t.Cleanup(func() { agent.Cleanup(context.Background(), a.NS.Path(), bpffs) })
	proc := e.startAgent(t, dir, bpffs, cg, "--socket-lb-scope", "node")
	if err := proc.WaitLog(time.Minute, []string{`"added":["` + podA.HostVeth + `"]`}); err != nil {
		t.Fatalf("agent did not attach to pod-a's device %s: %v\n%s", podA.HostVeth, err, proc.Logs())
	}
	proxy, err := podA.StartRedirectProxy(meshPort, meshMark)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })

	remote := netip.MustParseAddrPort("10.96.0.80:80")
	own := netip.MustParseAddrPort("10.96.0.81:80")
	e.expectAnswers(e.sb.ClientAt(podA.Host).InCgroup(cg), remote, "pod-b", podA.IP)
	expectTold(t, proxy, 0, remote)
	e.expectAnswers(e.sb.ClientAt(podA.Host).InCgroup(cg), own, "pod-a", a.Gateway)
	e.expectAnswers(e.sb.ClientAt(a.Host).InCgroup(cg), remote, "pod-b", a.IP)

	podC, err := e.sb.AddServingPod(a.Node, "pod-c", netip.Addr{}, tcpPort, udpPort)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.WaitLog(time.Minute, []string{`"added":["` + podC.HostVeth + `"]`}); err != nil {
		t.Fatalf("agent did not attach to the new pod's device %s: %v\n%s", podC.HostVeth, err, proc.Logs())
	}
	e.expectAnswers(e.sb.ClientAt(podC.Host).InCgroup(cg), remote, "pod-b", podC.IP)
	proc.Terminate(t, 15*time.Second)
}

// expectAnswers makes three TCP connections from c to to, each answered
// by server, which sees the client address seen, while c sees to as its
// peer.
func (e *env) expectAnswers(c *sandbox.Client, to netip.AddrPort, server string, seen netip.Addr) {
	t := e.t
	t.Helper()
	rep, err := c.TCP(e.ctx(), to, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "" || r.Server != server || r.ClientSeen.Addr() != seen || r.Peer != to {
			t.Errorf("%s to %s: got %+v; want %s seeing %s, the peer %s", c.Name, to, r, server, seen, to)
		}
	}
}

// expectTold checks that p was told want as the original destination of
// the three connections it took since its since-th.
func expectTold(t testing.TB, p *sandbox.RedirectProxy, since int, want netip.AddrPort) {
	t.Helper()
	got := p.Originals()[since:]
	if errs := p.Failures(); len(errs) > 0 || len(got) != 3 || slices.ContainsFunc(got, func(o netip.AddrPort) bool { return o != want }) {
		t.Errorf("the proxy was told %v (%v); want %s three times", got, errors.Join(errs...), want)
	}
}
