package socklb_test

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

var (
	webVIP  = netip.MustParseAddrPort("10.96.0.80:80")
	dnsVIP  = netip.MustParseAddrPort("10.96.0.53:53")
	deadVIP = netip.MustParseAddrPort("10.96.0.99:80")
)

// web is a TCP Service whose target port is named: the number comes from
// the EndpointSlice.
func (e *env) addWeb(eps ...ep) {
	e.setService(makeService("web", webVIP.Addr().String(), int32(webVIP.Port()), v1.ProtocolTCP, intstr.FromString("http")))
	e.setSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, eps...))
	e.sync()
}

func (e *env) podNames(idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, e.pods[i].Name)
	}
	return out
}

func TestTCPToClusterIPSpreadsOverEveryBackend(t *testing.T) {
	e := newEnv(t, 3)
	e.addWeb(e.podEPs(0, 1, 2)...)

	const n = 300
	rep, err := e.client.TCP(e.ctx(), webVIP, n)
	if err != nil {
		t.Fatal(err)
	}
	perPod := map[string]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Fatalf("connection failed: %+v", r)
		}
		perPod[r.Server]++
		// The socket was translated before the SYN: the pod sees the
		// client's own address, on the pod's IP and target port.
		if r.ClientSeen.Addr() != e.client.IP {
			t.Errorf("server saw client %s, want %s", r.ClientSeen, e.client.IP)
		}
		if r.Peer != webVIP {
			t.Errorf("getpeername() = %s, want the ClusterIP %s", r.Peer, webVIP)
		}
	}
	// Each of three backends gets a third: 100 +- 40 is five standard
	// deviations, so a fair random choice fails this about once in 10^6.
	for _, name := range e.podNames(0, 1, 2) {
		if c := perPod[name]; c < 60 || c > 140 {
			t.Errorf("%s got %d of %d connections, want about %d: %v", name, c, n, n/3, perPod)
		}
	}
	if len(perPod) != 3 {
		t.Errorf("connections reached %v, want exactly the three backends", perPod)
	}
}

func TestUDPRepliesComeFromTheClusterIP(t *testing.T) {
	e := newEnv(t, 2)
	e.setService(makeService("dns", dnsVIP.Addr().String(), int32(dnsVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP, e.podEPs(0, 1)...))
	e.sync()

	t.Run("unconnected sendto", func(t *testing.T) {
		rep, err := e.client.UDP(e.ctx(), dnsVIP, 40)
		if err != nil {
			t.Fatal(err)
		}
		servers := map[string]int{}
		for _, r := range rep.Results {
			if r.Err != "" {
				t.Fatalf("no reply: %+v", r)
			}
			if r.From != dnsVIP {
				t.Errorf("reply came from %s, want the ClusterIP %s", r.From, dnsVIP)
			}
			servers[r.Server]++
		}
		if len(servers) != 2 {
			t.Errorf("datagrams reached %v, want both backends", servers)
		}
	})
	t.Run("connected send", func(t *testing.T) {
		rep, err := e.client.UDPConnected(e.ctx(), dnsVIP, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			if r.Err != "" {
				t.Fatalf("no reply: %+v", r)
			}
			if r.Peer != dnsVIP || r.From != dnsVIP {
				t.Errorf("getpeername() = %s, reply from %s; want the ClusterIP %s for both", r.Peer, r.From, dnsVIP)
			}
		}
	})
}

func TestNoEndpointsIsRefusedAtOnce(t *testing.T) {
	e := newEnv(t, 1)
	e.setService(makeService("dead", deadVIP.Addr().String(), int32(deadVIP.Port()), v1.ProtocolTCP, intstr.FromInt32(tcpPort)))
	e.setService(makeService("dead-udp", deadVIP.Addr().String(), int32(deadVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.sync()

	tcp, err := e.client.TCP(e.ctx(), deadVIP, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range tcp.Results {
		// ECONNREFUSED comes from connect() itself: a timeout would be
		// reported as ETIMEDOUT after the probe's 2s.
		if r.Err != "ECONNREFUSED" {
			t.Errorf("connect to a Service without endpoints: %+v, want ECONNREFUSED", r)
		}
		t.Logf("refused after %v", r.Elapsed)
	}
	udp, err := e.client.UDP(e.ctx(), deadVIP, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r := udp.Results[0]; r.Err != "ECONNREFUSED" {
		t.Errorf("sendto a Service without endpoints: %+v, want ECONNREFUSED", r)
	}
	if c := e.counters()["rejected_no_endpoints"]; c < 4 {
		t.Errorf("rejected_no_endpoints counter = %d, want at least 4", c)
	}
}

// The node's own datagrams to a Service that refuses them fail with EPERM,
// as kube-proxy's REJECT and DROP in the OUTPUT path make them fail; its TCP
// connections and a pod's datagrams are refused as from anywhere else.
func TestUDPFromTheNodeToARefusingServiceIsEPERM(t *testing.T) {
	e := newEnv(t, 1)
	e.setService(makeService("dead-udp", deadVIP.Addr().String(), int32(deadVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setService(makeService("dead", deadVIP.Addr().String(), int32(deadVIP.Port()), v1.ProtocolTCP, intstr.FromInt32(tcpPort)))
	// internalTrafficPolicy=Local whose only endpoint is on another node.
	e.setService(makeService("local-udp", dnsVIP.Addr().String(), int32(dnsVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort),
		builders.InternalLocal()))
	es := makeSlice("local-udp", "local-udp-1", udpPort, v1.ProtocolUDP, e.podEPs(0)...)
	es.Endpoints[0].NodeName = ptr.To("other-node")
	e.setSlice(es)
	e.sync()

	udp := func(c *sandbox.Client, addr netip.AddrPort) (sandbox.Report[sandbox.UDPResult], error) {
		return c.UDP(e.ctx(), addr, 1)
	}
	udpConnected := func(c *sandbox.Client, addr netip.AddrPort) (sandbox.Report[sandbox.UDPResult], error) {
		return c.UDPConnected(e.ctx(), addr, 1)
	}
	node := e.sb.ClientAt(e.node.Host)
	for _, tc := range []struct {
		name   string
		client *sandbox.Client
		probe  func(*sandbox.Client, netip.AddrPort) (sandbox.Report[sandbox.UDPResult], error)
		addr   netip.AddrPort
		want   string
	}{
		{"node, unconnected UDP, no endpoints", node, udp, deadVIP, "EPERM"},
		{"node, connected UDP, no endpoints", node, udpConnected, deadVIP, "EPERM"},
		{"node, UDP, policy Local without a local endpoint", node, udpConnected, dnsVIP, "EPERM"},
		{"pod, connected UDP, no endpoints", e.client, udpConnected, deadVIP, "ECONNREFUSED"},
		{"pod, connected UDP, policy Local without a local endpoint", e.client, udpConnected, dnsVIP, "ETIMEDOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := tc.probe(tc.client, tc.addr)
			if err != nil {
				t.Fatal(err)
			}
			if r := rep.Results[0]; r.Err != tc.want {
				t.Errorf("%s: %+v, want error %s", tc.addr, r, tc.want)
			}
		})
	}
	t.Run("node, TCP, no endpoints", func(t *testing.T) {
		rep, err := node.TCP(e.ctx(), deadVIP, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Results[0]; r.Err != "ECONNREFUSED" {
			t.Errorf("%s: %+v, want ECONNREFUSED", deadVIP, r)
		}
	})
}

func TestNewConnectionsFollowEndpointChanges(t *testing.T) {
	e := newEnv(t, 3)
	e.addWeb(e.podEPs(0, 1)...)
	hold := e.hold(webVIP)

	steps := []struct {
		name string
		eps  []ep
		want []string
	}{
		{"endpoint added", e.podEPs(0, 1, 2), e.podNames(0, 1, 2)},
		{"endpoint removed", e.podEPs(1, 2), e.podNames(1, 2)},
		{"one turns terminating: ready ones only", []ep{{e.pods[1].IP, terminating}, {e.pods[2].IP, ready}}, e.podNames(2)},
		{"not-ready endpoints are never used", []ep{{e.pods[0].IP, notReady}, {e.pods[1].IP, terminating}, {e.pods[2].IP, ready}}, e.podNames(2)},
		{"all terminating: serving-terminating fallback", []ep{{e.pods[1].IP, terminating}, {e.pods[2].IP, terminating}}, e.podNames(1, 2)},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			e.setSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, step.eps...))
			e.sync()
			rep, err := e.client.TCP(e.ctx(), webVIP, 60)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, r := range rep.Results {
				if r.Err != "" {
					t.Fatalf("connection failed: %+v", r)
				}
				got[r.Server] = true
			}
			var names []string
			for n := range got {
				names = append(names, n)
			}
			slices.Sort(names)
			if !slices.Equal(names, step.want) {
				t.Errorf("60 new connections reached %v, want exactly %v", names, step.want)
			}
			hold.check(t)
		})
	}
	t.Run("no endpoints left: refused", func(t *testing.T) {
		e.deleteSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP))
		e.sync()
		rep, err := e.client.TCP(e.ctx(), webVIP, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Results[0]; r.Err != "ECONNREFUSED" {
			t.Errorf("got %+v, want ECONNREFUSED", r)
		}
		// A connection made before keeps working even now.
		hold.check(t)
	})
}

func TestNonServiceTrafficIsUntouched(t *testing.T) {
	e := newEnv(t, 1)
	e.addWeb(e.podEPs(0)...)
	before := e.counters()

	direct := netip.AddrPortFrom(e.pods[0].IP, tcpPort)
	rep, err := e.client.TCP(e.ctx(), direct, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "" || r.Server != e.pods[0].Name || r.Peer != direct {
			t.Errorf("direct connection to a pod: %+v, want %s answering as %s", r, e.pods[0].Name, direct)
		}
	}
	// The ClusterIP on a port the Service does not have is not a frontend:
	// it is routed like any address, and this sandbox routes it nowhere.
	otherPort := netip.AddrPortFrom(webVIP.Addr(), 81)
	rep, err = e.client.TCP(e.ctx(), otherPort, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Results[0]; r.Server != "" || r.Err == "ECONNREFUSED" || r.Err == "" {
		t.Errorf("ClusterIP on another port: %+v, want it routed untranslated (unreachable)", r)
	}
	// UDP to the TCP Service's port is not a frontend either.
	urep, err := e.client.UDP(e.ctx(), webVIP, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r := urep.Results[0]; r.Server != "" {
		t.Errorf("UDP to a TCP-only Service port reached %s", r.Server)
	}
	after := e.counters()
	if after["translated_tcp"] != before["translated_tcp"] || after["translated_udp"] != before["translated_udp"] {
		t.Errorf("non-service traffic was translated: counters before %v after %v", before, after)
	}
}

// TestUDPFlowStaysOnOneBackend: datagrams from one unconnected socket to a
// ClusterIP stay on one backend, as a conntrack entry keeps them in
// kube-proxy. (That the choice ends with the backend's selection is the
// membership check affinity shares; see the affinity tests.)
func TestUDPFlowStaysOnOneBackend(t *testing.T) {
	e := newEnv(t, 3)
	e.setService(makeService("dns", dnsVIP.Addr().String(), int32(dnsVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP, e.podEPs(0, 1, 2)...))
	e.sync()
	flow := func() map[string]int {
		rep, err := e.client.UDPOneSocket(e.ctx(), dnsVIP, 30)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, r := range rep.Results {
			if r.Err != "" || r.From != dnsVIP {
				t.Fatalf("datagram: %+v", r)
			}
			got[r.Server]++
		}
		return got
	}
	if _, ok := only(flow()); !ok {
		t.Fatal("one socket's datagrams were spread over backends")
	}
	// Separate sockets are separate flows: they spread.
	rep, err := e.client.UDP(e.ctx(), dnsVIP, 60)
	if err != nil {
		t.Fatal(err)
	}
	spread := map[string]bool{}
	for _, r := range rep.Results {
		spread[r.Server] = true
	}
	if len(spread) != 3 {
		t.Errorf("60 sockets reached %v, want all three backends", spread)
	}
	if c := e.counters()["udp_sticky"]; c < 29 {
		t.Errorf("udp_sticky = %d, want the 29 datagrams after the first", c)
	}
}
