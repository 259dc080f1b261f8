package socklb_test

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// IPv6 frontends, in the sandbox's IPv6 Service CIDR.
var (
	web6VIP  = netip.MustParseAddrPort("[fd00:10:96::80]:80")
	dns6VIP  = netip.MustParseAddrPort("[fd00:10:96::53]:53")
	dead6VIP = netip.MustParseAddrPort("[fd00:10:96::99]:80")
)

// env6 adds to env the IPv6 side of the agent: the dataplane's IPv6
// family, fed by a tracker and a translator of their own, as the agent's
// IPv6 sync loop is. IPv4 Services go through env's.
type env6 struct {
	*env
	tr     *tracker.Tracker
	tl     k8swatch.Translator
	synced bool
}

// everyAddress6 is --nodeport-addresses unset, for IPv6.
var everyAddress6, _ = model.ParseNodePortSpec(nil, true, false)

func newEnv6(t testing.TB, pods int) *env6 {
	t.Helper()
	e := &env6{env: newEnv(t, pods)}
	e.tr = tracker.New(nodeName, model.DefaultOptions, everyAddress6)
	e.tr.SetServicesSynced()
	e.tr.SetEndpointSlicesSynced()
	e.tl.Family = v1.IPv6Protocol
	e.tl.Invalid = func(kind, ns, name, reason string) { t.Errorf("invalid %s %s/%s: %s", kind, ns, name, reason) }
	return e
}

func (e *env6) setService6(svc *v1.Service) {
	svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
	e.tr.UpdateService(k8swatch.ServiceName(svc), e.tl.ServicePorts(svc))
}

func (e *env6) setSlice6(es *discoveryv1.EndpointSlice) {
	es.AddressType = discoveryv1.AddressTypeIPv6
	e.tr.UpdateEndpointSlice(e.tl.EndpointSlice(es))
}

// sync6 programs everything recorded so far through the dataplane's IPv6
// family, which attaches the source range check around it.
func (e *env6) sync6() {
	e.t.Helper()
	e.syncFamily("sync IPv6", e.tr, e.d.IPv6(), &e.synced)
}

// pod6EPs are the IPv6 endpoints of the pods idx.
func (e *env6) pod6EPs(idx ...int) []ep {
	var out []ep
	for _, i := range idx {
		out = append(out, ep{ip: e.pods[i].IP6})
	}
	return out
}

func (e *env6) addWeb6(opts []func(*v1.Service), eps ...ep) {
	e.setService6(makeService("web6", web6VIP.Addr().String(), int32(web6VIP.Port()), v1.ProtocolTCP, intstr.FromString("http"), opts...))
	e.setSlice6(makeSlice("web6", "web6-1", tcpPort, v1.ProtocolTCP, eps...))
	e.sync6()
}

func TestIPv6TCPToClusterIPSpreadsOverEveryBackend(t *testing.T) {
	e := newEnv6(t, 3)
	e.addWeb6(nil, e.pod6EPs(0, 1, 2)...)

	const n = 300
	perPod := e.tcpServers(t, e.client, web6VIP, e.client.IP6, n)
	expectEvenSpread(t, perPod, n, e.podNames(0, 1, 2))
	if c := e.counters()["translated_tcp"]; c < n {
		t.Errorf("translated_tcp = %d after %d connections", c, n)
	}
	// The node's own sockets are translated too.
	node := e.sb.ClientAt(e.node.Host)
	if got := e.tcpServers(t, node, web6VIP, netip.Addr{}, 30); len(got) == 0 {
		t.Error("the node reached no backend")
	}
}

func TestIPv6UDPRepliesComeFromTheClusterIP(t *testing.T) {
	e := newEnv6(t, 2)
	e.setService6(makeService("dns6", dns6VIP.Addr().String(), int32(dns6VIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice6(makeSlice("dns6", "dns6-1", udpPort, v1.ProtocolUDP, e.pod6EPs(0, 1)...))
	e.sync6()

	e.expectUDPFromTheClusterIP(t, dns6VIP, e.client.IP6, 2)
}

func TestIPv6NoEndpointsIsRefusedAtOnce(t *testing.T) {
	e := newEnv6(t, 1)
	e.setService6(makeService("dead6", dead6VIP.Addr().String(), int32(dead6VIP.Port()), v1.ProtocolTCP, intstr.FromInt32(tcpPort)))
	e.setService6(makeService("dead6-udp", dead6VIP.Addr().String(), int32(dead6VIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.sync6()

	before := e.counters()["rejected_no_endpoints"]
	e.expectTCPRefused(t, dead6VIP, 3, "an IPv6 Service without endpoints")
	for _, probe := range []func() (sandbox.Report[sandbox.UDPResult], error){
		func() (sandbox.Report[sandbox.UDPResult], error) { return e.client.UDP(e.ctx(), dead6VIP, 1) },
		func() (sandbox.Report[sandbox.UDPResult], error) { return e.client.UDPConnected(e.ctx(), dead6VIP, 1) },
	} {
		udp, err := probe()
		if err != nil {
			t.Fatal(err)
		}
		if r := udp.Results[0]; r.Err != "ECONNREFUSED" {
			t.Errorf("UDP to an IPv6 Service without endpoints: %+v, want ECONNREFUSED", r)
		}
	}
	if c := e.counters()["rejected_no_endpoints"] - before; c < 5 {
		t.Errorf("rejected_no_endpoints counted %d refusals, want 5", c)
	}
}

func TestIPv6EndpointRemovalTakesABackendOutOfService(t *testing.T) {
	e := newEnv6(t, 2)
	e.addWeb6(nil, e.pod6EPs(0, 1)...)
	if got := e.tcpServers(t, e.client, web6VIP, e.client.IP6, 40); len(got) != 2 {
		t.Fatalf("before the removal connections reached %v, want both pods", got)
	}
	// A UDP socket that sent to the removed backend before leaves it too.
	e.setService6(makeService("dns6", dns6VIP.Addr().String(), int32(dns6VIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice6(makeSlice("dns6", "dns6-1", udpPort, v1.ProtocolUDP, e.pod6EPs(0, 1)...))
	e.sync6()

	e.setSlice6(makeSlice("web6", "web6-1", tcpPort, v1.ProtocolTCP, e.pod6EPs(0)...))
	e.setSlice6(makeSlice("dns6", "dns6-1", udpPort, v1.ProtocolUDP, e.pod6EPs(0)...))
	e.sync6()
	got := e.tcpServers(t, e.client, web6VIP, e.client.IP6, 40)
	if name, ok := only(got); !ok || name != e.pods[0].Name {
		t.Errorf("after removing %s, connections reached %v, want only %s", e.pods[1].Name, got, e.pods[0].Name)
	}
	rep, err := e.client.UDP(e.ctx(), dns6VIP, 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "" || r.Server != e.pods[0].Name || r.From != dns6VIP {
			t.Errorf("datagram after the removal: %+v, want an answer from %s through %s", r, e.pods[0].Name, dns6VIP)
		}
	}
	// Without endpoints the Service refuses.
	e.setSlice6(makeSlice("web6", "web6-1", tcpPort, v1.ProtocolTCP))
	e.sync6()
	rep2, err := e.client.TCP(e.ctx(), web6VIP, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep2.Results[0]; r.Err != "ECONNREFUSED" {
		t.Errorf("connect after the last endpoint left: %+v, want ECONNREFUSED", r)
	}
}

func TestIPv6SessionAffinityKeepsAClientOnOneBackend(t *testing.T) {
	e := newEnv6(t, 3)
	e.addWeb6([]func(*v1.Service){clientIP(600)}, e.pod6EPs(0, 1, 2)...)
	other, err := e.sb.AddClient(e.node, "client-2", netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	first := e.tcpServers(t, e.client, web6VIP, e.client.IP6, 20)
	name, ok := only(first)
	if !ok {
		t.Fatalf("ClientIP affinity: connections of one client reached %v, want one pod", first)
	}
	// Another client (another network namespace) keeps its own choice.
	second := e.tcpServers(t, other, web6VIP, other.IP6, 20)
	if _, ok := only(second); !ok {
		t.Errorf("ClientIP affinity: the second client's connections reached %v, want one pod", second)
	}
	if c := e.counters()["affinity_hit"]; c < 38 {
		t.Errorf("affinity_hit = %d after 40 connections of two clients, want at least 38", c)
	}
	// Its backend gone, the client is moved to another and stays there.
	var rest []int
	for i, p := range e.pods {
		if p.Name != name {
			rest = append(rest, i)
		}
	}
	e.setSlice6(makeSlice("web6", "web6-1", tcpPort, v1.ProtocolTCP, e.pod6EPs(rest...)...))
	e.sync6()
	moved := e.tcpServers(t, e.client, web6VIP, e.client.IP6, 20)
	if to, ok := only(moved); !ok || to == name {
		t.Errorf("after %s left, the client's connections reached %v, want one other pod", name, moved)
	}
}

// mapped is the IPv4-mapped IPv6 form of an IPv4 frontend, as an AF_INET6
// socket names it.
func mapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
}

// Dual-stack clients (Java's, for one) reach IPv4 Services from AF_INET6
// sockets through IPv4-mapped addresses: the AF_INET6 hooks translate them
// through the IPv4 maps, and the socket sees the mapped ClusterIP as its
// peer and as the source of replies.
func TestIPv4MappedAddressesOnIPv6SocketsReachIPv4Services(t *testing.T) {
	e := newEnv6(t, 2)
	e.addWeb(e.podEPs(0, 1)...)
	e.setService(makeService("dns", dnsVIP.Addr().String(), int32(dnsVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP, e.podEPs(0, 1)...))
	e.setService(makeService("dead", deadVIP.Addr().String(), int32(deadVIP.Port()), v1.ProtocolTCP, intstr.FromInt32(tcpPort)))
	e.sync()
	web, dns, dead := mapped(webVIP), mapped(dnsVIP), mapped(deadVIP)

	t.Run("TCP", func(t *testing.T) {
		got := e.tcpServers(t, e.client, web, e.client.IP, 40)
		if len(got) != 2 {
			t.Errorf("connections to %s reached %v, want both pods", web, got)
		}
	})
	t.Run("UDP unconnected", func(t *testing.T) {
		e.expectUDPReplies(t, dns, "the mapped ClusterIP", netip.Addr{}, 30, 2)
	})
	t.Run("UDP connected", func(t *testing.T) {
		e.expectUDPConnectedReplies(t, dns, "the mapped ClusterIP", 10)
	})
	t.Run("no endpoints", func(t *testing.T) {
		e.expectTCPRefused(t, dead, 2, "a mapped ClusterIP without endpoints")
	})
}

// TestIPv6SourceRangesForPodsAndTheNode is TestSourceRangesForPodsAndTheNode
// over IPv6: pods and the node reaching an IPv6 LoadBalancer IP are held to
// its IPv6 loadBalancerSourceRanges by the egress check of their sockets'
// IPv6 packets.
func TestIPv6SourceRangesForPodsAndTheNode(t *testing.T) {
	e := newEnv6(t, 1)
	e.tr.UpdateNode(model.Node{Name: nodeName, Addrs: []netip.Addr{e.node.IP6}})
	e.tr.SetLocalAddrs([]netip.Addr{e.node.IP6})
	inside, outside, node := e.rangeClients(t)

	lb := netip.MustParseAddrPort("[fd00:198:19::5]:80")
	udpLB := netip.MustParseAddrPort("[fd00:198:19::9]:53")
	open := netip.MustParseAddrPort("[fd00:198:19::10]:80")
	podRange := "fd00:10:244:1::200/124" // holds inside (::200), not outside (::220)
	program := func(ranges ...string) {
		t.Helper()
		// An IPv4 range is not the IPv6 LoadBalancer IP's.
		ranges = append(ranges, "0.0.0.0/0")
		e.addWeb6([]func(*v1.Service){loadBalancer(lb.Addr()), withRanges(ranges...)}, e.pod6EPs(0)...)
		e.setService6(makeService("dns-lb6", "fd00:10:96::54", 53, v1.ProtocolUDP, intstr.FromString("p"),
			loadBalancer(udpLB.Addr()), withRanges(ranges...)))
		e.setSlice6(makeSlice("dns-lb6", "dns-lb6-1", udpPort, v1.ProtocolUDP, e.pod6EPs(0)...))
		e.setService6(makeService("open6", "fd00:10:96::81", 80, v1.ProtocolTCP, intstr.FromString("p"), loadBalancer(open.Addr())))
		e.setSlice6(makeSlice("open6", "open6-1", tcpPort, v1.ProtocolTCP, e.pod6EPs(0)...))
		e.sync6()
	}

	t.Run("ranges hold one pod, not the node", func(t *testing.T) {
		program(podRange)
		if !e.loaded.SourceRangeCheck() {
			t.Fatal("egress check not attached while a Service has IPv6 source ranges")
		}
		before := e.counters()["sock_dropped_source_range"]
		e.runProbes(t, append(podRangeProbes(inside, outside, lb, udpLB),
			probe{"the ClusterIP is not restricted", outside, probeTCP, web6VIP, reached},
			probe{"a Service without ranges is not restricted", outside, probeTCP, open, reached},
			probe{"the node outside the ranges is dropped", node, probeTCP, lb, timedOut},
			probe{"the node's datagram is refused in its OUTPUT path", node, probeUDP, udpLB, eperm},
		))
		if after := e.counters()["sock_dropped_source_range"]; after <= before {
			t.Errorf("sock_dropped_source_range stayed at %d", after)
		}
	})

	t.Run("ranges hold the node too", func(t *testing.T) {
		program(podRange, "fd00:192:168:77::/64")
		e.runProbes(t, nodeRangeProbes(outside, node, lb, udpLB))
	})

	t.Run("ranges removed", func(t *testing.T) {
		e.addWeb6([]func(*v1.Service){loadBalancer(lb.Addr())}, e.pod6EPs(0)...)
		e.setService6(makeService("dns-lb6", "fd00:10:96::54", 53, v1.ProtocolUDP, intstr.FromString("p"), loadBalancer(udpLB.Addr())))
		e.sync6()
		if e.loaded.SourceRangeCheck() {
			t.Error("egress check still attached without any source ranges")
		}
		e.runProbes(t, noRangeProbes(outside, node, lb, udpLB))
	})
}

// TestIPv6NewConnectionsFollowEndpointChanges is
// TestNewConnectionsFollowEndpointChanges over IPv6: new connections go to
// the endpoints a change leaves (ready ones first, serving-terminating ones
// when none is ready, never not-ready ones), while a connection opened
// before keeps working.
func TestIPv6NewConnectionsFollowEndpointChanges(t *testing.T) {
	e := newEnv6(t, 3)
	e.addWeb6(nil, e.pod6EPs(0, 1)...)
	hold := e.hold(web6VIP)
	e.followEndpointChanges(t, web6VIP, e.client.IP6, hold, func(i int) netip.Addr { return e.pods[i].IP6 }, func(eps []ep) {
		e.setSlice6(makeSlice("web6", "web6-1", tcpPort, v1.ProtocolTCP, eps...))
		e.sync6()
	})
}

// Datagrams from one unconnected socket stay on one backend over IPv6 and
// through an IPv4-mapped ClusterIP, as over IPv4.
func TestIPv6UDPFlowStaysOnOneBackend(t *testing.T) {
	e := newEnv6(t, 3)
	e.setService6(makeService("dns6", dns6VIP.Addr().String(), int32(dns6VIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice6(makeSlice("dns6", "dns6-1", udpPort, v1.ProtocolUDP, e.pod6EPs(0, 1, 2)...))
	e.sync6()
	e.setService(makeService("dns", dnsVIP.Addr().String(), int32(dnsVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
	e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP, e.podEPs(0, 1, 2)...))
	e.sync()
	for _, vip := range []netip.AddrPort{dns6VIP, mapped(dnsVIP)} {
		t.Run(vip.String(), func(t *testing.T) {
			before := e.counters()["udp_sticky"]
			got := e.udpOneSocketServers(t, vip, 30)
			if _, ok := only(got); !ok {
				t.Errorf("one socket's datagrams were spread over %v", got)
			}
			if c := e.counters()["udp_sticky"] - before; c < 29 {
				t.Errorf("udp_sticky counted %d, want the 29 datagrams after the first", c)
			}
		})
	}
}
