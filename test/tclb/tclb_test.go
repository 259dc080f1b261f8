// Package tclb_test runs real traffic from a client outside the cluster
// through the TC programs: two nodes with pods on both, a router, and an
// external client, each in its own network namespace. The programs attach to
// the nodes' uplinks (inside their namespaces), with tcx and with clsact
// filters, and are programmed by the same maps writer as the agent.
package tclb_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func TestMain(m *testing.M) { agent.Main(m) }

const (
	tcpPort = 8080
	udpPort = 5353
)

// node is a sandbox node with the TC programs on its uplink.
type node struct {
	*sandbox.Node
	tc *loader.TCLoaded
	w  *maps.Writer
	// w6 writes the IPv6 maps (sync6).
	w6 *maps.Writer
}

type env struct {
	t      testing.TB
	sb     *sandbox.Sandbox
	nodes  []*node
	pods   map[string]*sandbox.Pod
	client *sandbox.Client
	// other is a second client outside, for source ranges.
	other *sandbox.Client
	// snatMin and snatMax are the source NAT port range attach gives the
	// programs; zero for the default.
	snatMin, snatMax uint16
}

var small = loader.MapSizes{Services: 4096, Backends: 4096, RevNat: 4096, SockRevNat: 4096, Affinity: 4096}

// newEnv builds node-a and node-b with pod-a (on node-a) and pod-b (on
// node-b) serving TCP and UDP, an external client, and routes on the router
// for the LoadBalancer and external IPs to node-a.
func newEnv(t *testing.T, mode string) *env {
	t.Helper()
	e := newTopology(t)
	for _, n := range e.nodes {
		e.attach(n, mode, false)
	}
	return e
}

// newTopology builds the namespaces, pods and clients of newEnv and
// attaches nothing.
func newTopology(t testing.TB) *env {
	t.Helper()
	sb := sandbox.ForTest(t)
	e := &env{t: t, sb: sb, pods: map[string]*sandbox.Pod{}}
	for _, name := range []string{"node-a", "node-b"} {
		n, err := sb.AddNode(name)
		if err != nil {
			t.Fatal(err)
		}
		e.nodes = append(e.nodes, &node{Node: n})
		pod, err := sb.AddServingPod(n, "pod-"+name[len(name)-1:], netip.Addr{}, tcpPort, udpPort)
		if err != nil {
			t.Fatal(err)
		}
		e.pods[pod.Name] = pod
	}
	client, err := sb.AddExternalClient("outside", netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	e.client = client
	if e.other, err = sb.AddExternalClient("elsewhere", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	for _, lb := range []netip.Prefix{sandbox.LoadBalancerCIDR, sandbox.LoadBalancerCIDR6} {
		if err := sb.RouteToNode(lb, e.nodes[0].Node); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// attach loads the TC programs onto the node's uplink (and with bridge
// onto its pod bridge too) with maps pinned in a directory of its own, as
// the node's agent would.
func (e *env) attach(n *node, mode string, bridge bool) {
	e.t.Helper()
	devs := []loader.TCDevice{{Name: sandbox.IfaceName, SNAT: n.IP, SNAT6: n.IP6}}
	if bridge {
		devs = append(devs, loader.TCDevice{Name: sandbox.BridgeName, SNAT: n.Gateway, SNAT6: n.Gateway6})
	}
	e.attachDevices(n, mode, devs)
}

// attachDevices is attach to the devices devs.
func (e *env) attachDevices(n *node, mode string, devs []loader.TCDevice) {
	t := e.t
	t.Helper()
	bpffs := filepath.Join(e.sb.BPFFS.Path(), n.Name)
	err := n.NS.Do(func() error {
		var err error
		n.tc, err = loader.LoadTC(loader.TCConfig{
			BPFFSPath: bpffs, Sizes: small, ConntrackSize: 4096, Attach: mode, Devices: devs,
			SNATPortMin: e.snatMin, SNATPortMax: e.snatMax,
		})
		return err
	})
	if err != nil {
		t.Fatalf("attach to %s: %v", n.Name, err)
	}
	t.Cleanup(func() {
		n.tc.Close()
		if err := loader.Cleanup(bpffs); err != nil {
			t.Errorf("cleanup %s: %v", n.Name, err)
		}
		if err := n.NS.Do(loader.CleanupTC); err != nil {
			t.Errorf("cleanup %s: %v", n.Name, err)
		}
	})
	if mode != loader.TCAttachAuto && n.tc.Mode != mode {
		t.Fatalf("attached with %s, want %s", n.tc.Mode, mode)
	}
	o := &n.tc.Objects
	n.w, err = maps.NewWriter(maps.Maps{
		Services: maps.FromKernel[maps.ServiceKey, maps.ServiceValue](o.Lb4ServicesV1),
		Backends: maps.FromKernel[uint32, maps.BackendValue](o.Lb4BackendsV1),
		RevNat:   maps.FromKernel[uint32, maps.RevNatValue](o.Lb4RevnatV1),
		Members:  maps.FromKernel[maps.MemberKey, uint8](o.Lb4MembersV1),

		SourceRanges: maps.FromKernel[maps.SourceRangeKey, uint8](o.Lb4SourceRangesV1),
		PortFilter:   maps.FromKernel[uint32, uint32](o.Lb4ExtPortsV1),
		RemovedAt:    maps.FromKernel[uint32, uint32](o.LbRemovedAtV1),
	}, maps.Limits{Backends: small.Backends, RevNat: small.RevNat})
	if err != nil {
		t.Fatal(err)
	}
	n.w6, err = maps.NewWriter6(maps.Maps6{
		Services:     maps.FromKernel[maps.Service6Key, maps.ServiceValue](o.Lb6ServicesV1),
		Backends:     maps.FromKernel[uint32, maps.Backend6Value](o.Lb6BackendsV1),
		RevNat:       maps.FromKernel[uint32, maps.RevNat6Value](o.Lb6RevnatV1),
		Members:      maps.FromKernel[maps.MemberKey, uint8](o.Lb6MembersV1),
		SourceRanges: maps.FromKernel[maps.SourceRange6Key, uint8](o.Lb6SourceRangesV1),
		PortFilter:   maps.FromKernel[uint32, uint32](o.Lb6ExtPortsV1),
		RemovedAt:    maps.FromKernel[uint32, uint32](o.LbRemovedAtV1),
	}, maps.Limits{Backends: small.Backends, RevNat: small.RevNat})
	if err != nil {
		t.Fatal(err)
	}
}

// service describes one ServicePort; endpoints name pods.
type service struct {
	name      string
	clusterIP string
	proto     model.Protocol
	port      uint16
	nodePort  uint16
	extIPs    []netip.Addr
	lbIPs     []netip.Addr
	ranges    []netip.Prefix
	etpLocal  bool
	endpoints []string
	// terminating name pods whose endpoints are terminating but still
	// serving, as during a rollout; notReady pods that fail readiness, and
	// gone pods terminating and no longer serving.
	terminating, notReady, gone []string
	// target overrides the pods' port (tcpPort or udpPort).
	target uint16
}

// sync programs the Services on both nodes, each with its own name and
// address, so that each sees its own pods as local.
func (e *env) sync(svcs ...service) { e.syncFamily(false, svcs...) }

// sync6 is sync for the IPv6 twins of svcs (sandbox.IPv6Of): their
// ClusterIPs, external and LoadBalancer IPs, source ranges and pods'
// addresses, on the nodes' IPv6 addresses.
func (e *env) sync6(svcs ...service) { e.syncFamily(true, svcs...) }

func (e *env) syncFamily(v6 bool, svcs ...service) {
	e.t.Helper()
	for _, n := range e.nodes {
		w := n.w
		if v6 {
			w = n.w6
		}
		if err := w.Sync(model.Update{State: e.state(n, v6, svcs...), Full: true}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// state is the model of svcs as node n's agent sees it (v6: their IPv6
// twins, as sync6 says).
func (e *env) state(n *node, v6 bool, svcs ...service) *model.State {
	twin := func(a netip.Addr) netip.Addr {
		if v6 {
			return sandbox.IPv6Of(a)
		}
		return a
	}
	twins := func(as []netip.Addr) []netip.Addr {
		var out []netip.Addr
		for _, a := range as {
			out = append(out, twin(a))
		}
		return out
	}
	st := &model.State{Node: model.Node{Name: n.Name, Addrs: []netip.Addr{twin(n.IP)}}, Services: map[model.ServicePortName]*model.Service{}}
	for _, s := range svcs {
		var ranges []netip.Prefix
		for _, r := range s.ranges {
			bits := r.Bits()
			if v6 {
				bits += 96
			}
			ranges = append(ranges, netip.PrefixFrom(twin(r.Addr()), bits))
		}
		sp := builders.ModelServicePort("default", s.name, s.proto, twin(netip.MustParseAddr(s.clusterIP)), s.port, func(sp *model.ServicePort) {
			sp.NodePort = s.nodePort
			sp.ExternalIPs, sp.LoadBalancerIPs, sp.LoadBalancerSourceRanges = twins(s.extIPs), twins(s.lbIPs), ranges
			if s.etpLocal {
				sp.ExternalPolicy = model.PolicyLocal
			}
		})
		target := uint16(tcpPort)
		if s.proto == model.UDP {
			target = udpPort
		}
		if s.target != 0 {
			target = s.target
		}
		var eps []model.Endpoint
		for _, name := range s.endpoints {
			pod := e.pods[name]
			eps = append(eps, builders.ModelEndpoint(netip.AddrPortFrom(twin(pod.IP), target), pod.Node.Name))
		}
		for _, name := range s.terminating {
			pod := e.pods[name]
			eps = append(eps, builders.ModelEndpoint(netip.AddrPortFrom(twin(pod.IP), target), pod.Node.Name, builders.ModelTerminating))
		}
		for _, name := range s.notReady {
			pod := e.pods[name]
			eps = append(eps, builders.ModelEndpoint(netip.AddrPortFrom(twin(pod.IP), target), pod.Node.Name,
				func(ep *model.Endpoint) { ep.Ready, ep.Serving, ep.Terminating = false, false, false }))
		}
		for _, name := range s.gone {
			pod := e.pods[name]
			eps = append(eps, builders.ModelEndpoint(netip.AddrPortFrom(twin(pod.IP), target), pod.Node.Name,
				func(ep *model.Endpoint) { ep.Ready, ep.Serving, ep.Terminating = false, false, true }))
		}
		st.Services[sp.Name] = builders.ModelService(sp, eps, &st.Node)
	}
	// Every node address gets NodePorts, a loopback one for the node's
	// own sockets, as with the agent's defaults.
	spec := everyAddress
	if v6 {
		spec = everyAddress6
	}
	st.Node.NodePorts = spec.Resolve(&st.Node, st.Node.Addrs)
	return st
}

// family gives the functions that name a scenario's address (ip) and a
// ClusterIP's address and port (at) in the family v6 says: the IPv6 twin
// (sandbox.IPv6Of) or the address itself.
func family(v6 bool) (ip func(netip.Addr) netip.Addr, at func(clusterIP string, port uint16) netip.AddrPort) {
	ip = func(a netip.Addr) netip.Addr {
		if v6 {
			return sandbox.IPv6Of(a)
		}
		return a
	}
	at = func(s string, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(ip(netip.MustParseAddr(s)), port)
	}
	return ip, at
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e.t.Cleanup(cancel)
	return ctx
}

// expectRefused connects n times from the client to to and checks that
// every connect() is refused.
func (e *env) expectRefused(t *testing.T, to netip.AddrPort, n int) {
	t.Helper()
	rep, err := e.client.TCP(e.ctx(), to, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "ECONNREFUSED" {
			t.Errorf("%s: got %+v, want ECONNREFUSED", to, r)
		}
	}
}

// expectTimedOut connects once from c to to, giving up after a second, and
// checks that the connect() timed out: the SYN was dropped.
func (e *env) expectTimedOut(t *testing.T, c *sandbox.Client, to netip.AddrPort) {
	t.Helper()
	rep, err := c.WithTimeout(time.Second).TCP(e.ctx(), to, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Results[0]; r.Err != "ETIMEDOUT" {
		t.Errorf("%s from %s: got %+v, want ETIMEDOUT (the SYN dropped)", to, c.Name, r)
	}
}

// expectDropped is expectTimedOut that also checks that node n counted the
// drop in its metric m, which failures call what ("drop", "source range
// drop").
func (e *env) expectDropped(t *testing.T, c *sandbox.Client, to netip.AddrPort, n *node, m bpfobj.TcLbMetric, what string) {
	t.Helper()
	before := e.counter(n, m)
	e.expectTimedOut(t, c, to)
	if e.counter(n, m) == before {
		t.Errorf("%s counted no %s", n.Name, what)
	}
}

// expectServed connects n times from c to to and checks that every
// connection is served by server, which sees the client as clientSeen
// unless that is the zero Addr.
func (e *env) expectServed(t *testing.T, c *sandbox.Client, to netip.AddrPort, n int, server string, clientSeen netip.Addr) {
	t.Helper()
	rep, err := c.TCP(e.ctx(), to, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "" || r.Server != server {
			t.Errorf("%s from %s: got %+v, want one served by %s", to, c.Name, r, server)
		} else if clientSeen.IsValid() && r.ClientSeen.Addr() != clientSeen {
			t.Errorf("%s from %s: got %+v, want %s seeing %s", to, c.Name, r, server, clientSeen)
		}
	}
}

func (e *env) counter(n *node, m bpfobj.TcLbMetric) uint64 {
	e.t.Helper()
	var perCPU []uint64
	if err := n.tc.Objects.LbMetricsV1.Lookup(uint32(m), &perCPU); err != nil {
		e.t.Fatal(err)
	}
	var sum uint64
	for _, v := range perCPU {
		sum += v
	}
	return sum
}

var (
	lbIP     = netip.MustParseAddr("198.19.0.20")
	extIP    = netip.MustParseAddr("198.19.0.10")
	rangedIP = netip.MustParseAddr("198.19.0.30")
)

// The Services of the scenario; each has its own NodePort.
func scenario() []service {
	return []service{
		{name: "to-pod-a", clusterIP: "10.96.0.10", proto: model.TCP, port: 80, nodePort: 30010, endpoints: []string{"pod-a"}},
		{name: "to-pod-b", clusterIP: "10.96.0.11", proto: model.TCP, port: 80, nodePort: 30011, endpoints: []string{"pod-b"}, extIPs: []netip.Addr{extIP}},
		{name: "dns-pod-b", clusterIP: "10.96.0.12", proto: model.UDP, port: 53, nodePort: 30012, endpoints: []string{"pod-b"}},
		{name: "local", clusterIP: "10.96.0.13", proto: model.TCP, port: 80, nodePort: 30013, etpLocal: true, endpoints: []string{"pod-a", "pod-b"}},
		{name: "local-b-only", clusterIP: "10.96.0.14", proto: model.TCP, port: 80, nodePort: 30014, etpLocal: true, endpoints: []string{"pod-b"}},
		{name: "dead", clusterIP: "10.96.0.15", proto: model.TCP, port: 80, nodePort: 30015},
		{name: "dead-udp", clusterIP: "10.96.0.15", proto: model.UDP, port: 53, nodePort: 30015},
		{name: "lb", clusterIP: "10.96.0.16", proto: model.TCP, port: 80, lbIPs: []netip.Addr{lbIP}, endpoints: []string{"pod-a"}},
		// Pods listen on no UDP port 5454: they answer port unreachable.
		{name: "closed-a", clusterIP: "10.96.0.18", proto: model.UDP, port: 53, nodePort: 30018, target: 5454, endpoints: []string{"pod-a"}},
		{name: "closed-b", clusterIP: "10.96.0.19", proto: model.UDP, port: 53, nodePort: 30019, target: 5454, endpoints: []string{"pod-b"}},
		// Only the first external client (198.18.0.10) is in the range.
		{name: "ranged", clusterIP: "10.96.0.17", proto: model.TCP, port: 80, nodePort: 30017, lbIPs: []netip.Addr{rangedIP},
			ranges: []netip.Prefix{netip.MustParsePrefix("198.18.0.10/32")}, endpoints: []string{"pod-b"}},
	}
}

// TestExternalTraffic: what a client outside the cluster sees through
// NodePorts, an ExternalIP and a LoadBalancer IP, with both attach modes.
func TestExternalTraffic(t *testing.T) {
	for _, mode := range []string{loader.TCAttachTCX, loader.TCAttachClsact} {
		t.Run(mode, func(t *testing.T) {
			if mode == loader.TCAttachTCX {
				requireTCX(t)
			}
			e := newEnv(t, mode)
			e.sync(scenario()...)
			a, b := e.nodes[0], e.nodes[1]
			outside := e.client.IP

			tcp := []struct {
				name       string
				to         netip.AddrPort
				server     string
				clientSeen netip.Addr
			}{
				{"NodePort, backend on the node: delivered, client address kept", netip.AddrPortFrom(a.IP, 30010), "pod-a", outside},
				{"NodePort, backend on the other node: source NAT to the node", netip.AddrPortFrom(a.IP, 30011), "pod-b", a.IP},
				{"NodePort on the other node, backend on node-a", netip.AddrPortFrom(b.IP, 30010), "pod-a", b.IP},
				{"externalTrafficPolicy=Local on node-a: its own pod, client address kept", netip.AddrPortFrom(a.IP, 30013), "pod-a", outside},
				{"externalTrafficPolicy=Local on node-b: its own pod, client address kept", netip.AddrPortFrom(b.IP, 30013), "pod-b", outside},
				{"ExternalIP routed to node-a, backend on node-b", netip.AddrPortFrom(extIP, 80), "pod-b", a.IP},
				{"LoadBalancer IP routed to node-a, backend on node-a", netip.AddrPortFrom(lbIP, 80), "pod-a", outside},
			}
			for _, tc := range tcp {
				t.Run(tc.name, func(t *testing.T) {
					rep, err := e.client.TCP(e.ctx(), tc.to, 5)
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range rep.Results {
						if r.Err != "" || r.Server != tc.server || r.ClientSeen.Addr() != tc.clientSeen || r.Peer != tc.to {
							t.Errorf("got %+v; want served by %s, who sees %s, the client's peer %s", r, tc.server, tc.clientSeen, tc.to)
						}
					}
				})
			}
			t.Run("UDP NodePort, backend on the other node: the reply comes from the NodePort", func(t *testing.T) {
				to := netip.AddrPortFrom(a.IP, 30012)
				rep, err := e.client.UDPConnected(e.ctx(), to, 5)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rep.Results {
					if r.Err != "" || r.Server != "pod-b" || r.From != to || r.ClientSeen.Addr() != a.IP {
						t.Errorf("got %+v; want an answer of pod-b from %s that saw %s", r, to, a.IP)
					}
				}
			})
			t.Run("no endpoints: TCP connect refused", func(t *testing.T) {
				e.expectRefused(t, netip.AddrPortFrom(a.IP, 30015), 3)
			})
			t.Run("no endpoints: connected UDP refused", func(t *testing.T) {
				rep, err := e.client.UDPConnected(e.ctx(), netip.AddrPortFrom(a.IP, 30015), 1)
				if err != nil {
					t.Fatal(err)
				}
				if r := rep.Results[0]; r.Err != "ECONNREFUSED" {
					t.Errorf("got %+v, want ECONNREFUSED", r)
				}
			})
			for _, np := range []uint16{30018, 30019} {
				t.Run(fmt.Sprintf("UDP to a port the pod does not listen on (NodePort %d): the pod's port unreachable reaches the client", np), func(t *testing.T) {
					rep, err := e.client.UDPConnected(e.ctx(), netip.AddrPortFrom(a.IP, np), 1)
					if err != nil {
						t.Fatal(err)
					}
					if r := rep.Results[0]; r.Err != "ECONNREFUSED" {
						t.Errorf("got %+v, want ECONNREFUSED", r)
					}
				})
			}
			t.Run("externalTrafficPolicy=Local on a node without endpoints: dropped", func(t *testing.T) {
				e.expectDropped(t, e.client, netip.AddrPortFrom(a.IP, 30014), a, bpfobj.TcLbMetricLB_M_DROP, "drop")
				// node-b has the endpoint and serves the same NodePort.
				e.expectServed(t, e.client, netip.AddrPortFrom(b.IP, 30014), 1, "pod-b", outside)
			})
			t.Run("loadBalancerSourceRanges: the client inside is served", func(t *testing.T) {
				e.expectServed(t, e.client, netip.AddrPortFrom(rangedIP, 80), 2, "pod-b", netip.Addr{})
			})
			t.Run("loadBalancerSourceRanges: a client outside is dropped, but not at the NodePort", func(t *testing.T) {
				e.expectDropped(t, e.other, netip.AddrPortFrom(rangedIP, 80), a, bpfobj.TcLbMetricLB_M_TC_SOURCE_RANGE, "source range drop")
				e.expectServed(t, e.other, netip.AddrPortFrom(a.IP, 30017), 1, "pod-b", netip.Addr{})
			})
			t.Run("traffic that is not for a Service passes", func(t *testing.T) {
				// The router routes pod addresses to the nodes: a
				// client reaching a pod directly is not translated.
				rep, err := e.client.TCP(e.ctx(), netip.AddrPortFrom(e.pods["pod-b"].IP, tcpPort), 2)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rep.Results {
					if r.Err != "" || r.Server != "pod-b" || r.ClientSeen.Addr() != outside {
						t.Errorf("got %+v, want pod-b seeing %s", r, outside)
					}
				}
			})
		})
	}
}

// TestMasqueradeWithPodBridge: with the programs on the pod bridge as well,
// externalTrafficPolicy=Cluster traffic to a pod on the node is
// masqueraded to the node's bridge address, as kube-proxy does; policy Local
// keeps the client's address, and pods' own traffic through the bridge
// passes untouched.
func TestMasqueradeWithPodBridge(t *testing.T) {
	e := newTopology(t)
	for _, n := range e.nodes {
		e.attach(n, loader.TCAttachAuto, true)
	}
	e.sync(scenario()...)
	a := e.nodes[0]
	outside := e.client.IP
	for _, tc := range []struct {
		name       string
		to         netip.AddrPort
		server     string
		clientSeen netip.Addr
	}{
		{"policy Cluster, backend on the node: the pod sees the bridge address", netip.AddrPortFrom(a.IP, 30010), "pod-a", a.Gateway},
		{"policy Cluster, backend on the other node: the pod sees the node", netip.AddrPortFrom(a.IP, 30011), "pod-b", a.IP},
		{"policy Local: the pod sees the client", netip.AddrPortFrom(a.IP, 30013), "pod-a", outside},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := e.client.TCP(e.ctx(), tc.to, 5)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				if r.Err != "" || r.Server != tc.server || r.ClientSeen.Addr() != tc.clientSeen || r.Peer != tc.to {
					t.Errorf("got %+v; want served by %s, who sees %s", r, tc.server, tc.clientSeen)
				}
			}
		})
	}
	t.Run("a pod's own traffic through the bridge passes", func(t *testing.T) {
		c, err := e.sb.AddClient(a.Node, "pod-client", netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		to := netip.AddrPortFrom(e.pods["pod-b"].IP, tcpPort)
		rep, err := c.TCP(e.ctx(), to, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			if r.Err != "" || r.Server != "pod-b" || r.ClientSeen.Addr() != c.IP {
				t.Errorf("got %+v, want pod-b seeing %s", r, c.IP)
			}
		}
	})
}

// requireTCX skips the tcx variant on kernels without tcx (6.1), where the
// clsact variant covers TC; the probe attaches for real, so it cannot hide
// a loader bug.
func requireTCX(t *testing.T) {
	t.Helper()
	sandbox.RequireRoot(t)
	switch err := loader.ProbeTCX(); {
	case errors.Is(err, ebpf.ErrNotSupported):
		t.Skipf("kernel without tcx, the clsact variant covers TC here: %v", err)
	case err != nil:
		t.Fatal(err)
	}
}

// everyAddress is --nodeport-addresses unset, with
// --iptables-localhost-nodeports (the agent's defaults).
var everyAddress, _ = model.ParseNodePortSpec(nil, false, true)

// everyAddress6 is everyAddress for the IPv6 family.
var everyAddress6, _ = model.ParseNodePortSpec(nil, true, true)
