package tclb_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestPodsTranslatedPerPacket: a pod whose sockets no socket program
// translates (a meshed pod, or every pod where the agent translates only
// the node's own sockets) reaches Services through the program at its
// device on the node, as kube-proxy's rules serve it: ClusterIPs, NodePorts
// and external IPs, TCP and UDP, the replies coming from the frontend, a
// Service without endpoints refused. The backend sees the pod's own
// address where kube-proxy keeps it (ClusterIPs, policy Local
// short-circuited) and the node's where it masquerades: the pod reaching
// itself through a Service (a hairpin: the node's bridge address), and
// external frontends under policy Cluster. Both families, with both attach
// modes.
func TestPodsTranslatedPerPacket(t *testing.T) {
	for _, mode := range []string{loader.TCAttachTCX, loader.TCAttachClsact} {
		t.Run(mode, func(t *testing.T) {
			if mode == loader.TCAttachTCX {
				requireTCX(t)
			}
			e := newTopology(t)
			a, b := e.nodes[0], e.nodes[1]
			podA := e.pods["pod-a"]
			e.attachDevices(a, mode, []loader.TCDevice{
				{Name: sandbox.IfaceName, SNAT: a.IP, SNAT6: a.IP6},
				{Name: podA.HostVeth, SNAT: a.Gateway, SNAT6: a.Gateway6, Pod: true},
			})
			e.attach(b, mode, false)
			e.sync(scenario()...)
			e.sync6(scenario()...)
			for _, fam := range []string{"IPv4", "IPv6"} {
				t.Run(fam, func(t *testing.T) { testPodPerPacket(t, e, fam == "IPv6") })
			}
		})
	}
}

func testPodPerPacket(t *testing.T, e *env, v6 bool) {
	ip, at := family(v6)
	a := e.nodes[0]
	podA := e.pods["pod-a"]
	client := e.sb.ClientAt(podA.Host)
	newFlows, masqueraded := e.counter(a, bpfobj.TcLbMetricLB_M_TC_POD_NEW), e.counter(a, bpfobj.TcLbMetricLB_M_TC_POD_SNAT)

	for _, tc := range []struct {
		name       string
		to         netip.AddrPort
		server     string
		clientSeen netip.Addr
	}{
		{"ClusterIP, backend on the other node", at("10.96.0.11", 80), "pod-b", ip(podA.IP)},
		{"NodePort of its own node, backend on the other node: masqueraded", netip.AddrPortFrom(ip(a.IP), 30011), "pod-b", ip(a.IP)},
		{"ExternalIP: masqueraded", netip.AddrPortFrom(ip(extIP), 80), "pod-b", ip(a.IP)},
		{"NodePort of its own node under policy Local without a local endpoint: every endpoint, as from inside", netip.AddrPortFrom(ip(a.IP), 30014), "pod-b", ip(podA.IP)},
		{"ClusterIP of the pod itself: hairpin, shown the bridge address", at("10.96.0.10", 80), "pod-a", ip(a.Gateway)},
		{"NodePort of its own node to itself: hairpin", netip.AddrPortFrom(ip(a.IP), 30010), "pod-a", ip(a.Gateway)},
		{"LoadBalancer IP to itself: hairpin", netip.AddrPortFrom(ip(lbIP), 80), "pod-a", ip(a.Gateway)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := client.TCP(e.ctx(), tc.to, 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				if r.Err != "" || r.Server != tc.server || r.ClientSeen.Addr() != tc.clientSeen || r.Peer != tc.to {
					t.Errorf("got %+v; want served by %s, who sees %s, the socket's peer %s", r, tc.server, tc.clientSeen, tc.to)
				}
			}
		})
	}
	t.Run("UDP to a ClusterIP: the replies come from it", func(t *testing.T) {
		to := at("10.96.0.12", 53)
		for _, connected := range []bool{false, true} {
			probe := client.UDP
			if connected {
				probe = client.UDPConnected
			}
			rep, err := probe(e.ctx(), to, 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				if r.Err != "" || r.Server != "pod-b" || r.ClientSeen.Addr() != ip(podA.IP) || r.From != to {
					t.Errorf("connected %v: got %+v; want pod-b seeing %s, the reply from %s", connected, r, ip(podA.IP), to)
				}
			}
		}
	})
	t.Run("a UDP socket connected through the ClusterIP, straight to the pod, then through the ClusterIP again", func(t *testing.T) {
		vip := at("10.96.0.12", 53)
		direct := netip.AddrPortFrom(ip(e.pods["pod-b"].IP), udpPort)
		rep, err := client.UDPReconnects(e.ctx(), []netip.AddrPort{vip, direct, vip})
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []netip.AddrPort{vip, direct, vip} {
			if i >= len(rep.Results) {
				t.Fatalf("%d results, want 3", len(rep.Results))
			}
			if r := rep.Results[i]; r.Err != "" || r.Server != "pod-b" || r.From != want {
				t.Errorf("exchange %d: got %+v; want pod-b answering from %s", i+1, r, want)
			}
		}
	})
	t.Run("a Service without endpoints refuses", func(t *testing.T) {
		rep, err := client.TCP(e.ctx(), at("10.96.0.15", 80), 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			if r.Err != "ECONNREFUSED" {
				t.Errorf("got %+v, want ECONNREFUSED", r)
			}
		}
	})
	t.Run("a held connection keeps its backend and its peer", func(t *testing.T) {
		to := at("10.96.0.11", 80)
		h, err := client.Hold(e.ctx(), to)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		for range 3 {
			if err := h.Ping(); err != nil {
				t.Fatal(err)
			}
		}
		if peer, err := h.Peer(); err != nil || peer != to {
			t.Errorf("peer %s, %v; want %s", peer, err, to)
		}
	})
	if n := e.counter(a, bpfobj.TcLbMetricLB_M_TC_POD_NEW); n <= newFlows {
		t.Errorf("node-a counted no new pod flow (%d before, %d after)", newFlows, n)
	}
	if n := e.counter(a, bpfobj.TcLbMetricLB_M_TC_POD_SNAT); n < masqueraded+15 {
		t.Errorf("node-a counted %d masqueraded pod flows, want at least 15", n-masqueraded)
	}
}

// TestPodHeldConnectionOutlivesItsEndpoint: a pod's connection through a
// ClusterIP, translated per packet, goes on while its endpoint fails
// readiness and then terminates, as long as the EndpointSlice lists it, as
// kube-proxy's conntrack entry keeps it; new connections go to the ready
// endpoint.
func TestPodHeldConnectionOutlivesItsEndpoint(t *testing.T) {
	e := newTopology(t)
	a := e.nodes[0]
	podA := e.pods["pod-a"]
	e.attachDevices(a, loader.TCAttachAuto, []loader.TCDevice{
		{Name: sandbox.IfaceName, SNAT: a.IP, SNAT6: a.IP6},
		{Name: podA.HostVeth, SNAT: a.Gateway, SNAT6: a.Gateway6, Pod: true},
	})
	e.attach(e.nodes[1], loader.TCAttachAuto, false)
	web := service{name: "web", clusterIP: "10.96.0.30", proto: model.TCP, port: 80}
	vip := netip.MustParseAddrPort("10.96.0.30:80")
	client := e.sb.ClientAt(podA.Host)
	step := func(name string, change func(*service)) {
		t.Helper()
		s := web
		change(&s)
		e.sync(s)
		t.Logf("%s", name)
	}
	step("pod-b ready", func(s *service) { s.endpoints = []string{"pod-b"} })
	h, err := client.Hold(e.ctx(), vip)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, st := range []struct {
		name   string
		change func(*service)
	}{
		{"pod-b not ready, pod-a ready", func(s *service) { s.notReady, s.endpoints = []string{"pod-b"}, []string{"pod-a"} }},
		{"pod-b terminating, pod-a ready", func(s *service) { s.gone, s.endpoints = []string{"pod-b"}, []string{"pod-a"} }},
	} {
		step(st.name, st.change)
		if err := h.Ping(); err != nil {
			t.Fatalf("%s: the held connection broke: %v", st.name, err)
		}
		e.expectServed(t, client, vip, 3, "pod-a", netip.Addr{})
	}
}
