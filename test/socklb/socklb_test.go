package socklb_test

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
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
	// The socket was translated before the SYN: the pod sees the client's
	// own address, on the pod's IP and target port, and getpeername() the
	// ClusterIP.
	perPod := e.tcpServers(t, e.client, webVIP, e.client.IP, n)
	expectEvenSpread(t, perPod, n, e.podNames(0, 1, 2))
}

func TestUDPRepliesComeFromTheClusterIP(t *testing.T) {
	e := newEnv(t, 2)
	e.setService(makeService("dns", dnsVIP.Addr().String(), int32(dnsVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP, e.podEPs(0, 1)...))
	e.sync()

	e.expectUDPFromTheClusterIP(t, dnsVIP, netip.Addr{}, 2)
}

func TestNoEndpointsIsRefusedAtOnce(t *testing.T) {
	e := newEnv(t, 1)
	e.setService(makeService("dead", deadVIP.Addr().String(), int32(deadVIP.Port()), v1.ProtocolTCP, intstr.FromInt32(tcpPort)))
	e.setService(makeService("dead-udp", deadVIP.Addr().String(), int32(deadVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.sync()

	e.expectTCPRefused(t, deadVIP, 3, "a Service without endpoints")
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

	e.followEndpointChanges(t, webVIP, e.client.IP, hold, func(i int) netip.Addr { return e.pods[i].IP }, func(eps []ep) {
		e.setSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, eps...))
		e.sync()
	})
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
	if _, ok := only(e.udpOneSocketServers(t, dnsVIP, 30)); !ok {
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
