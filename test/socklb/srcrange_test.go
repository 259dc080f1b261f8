package socklb_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

var (
	// lbUDP and lbOpen are LoadBalancer IPs of a UDP Service with the
	// same source ranges as web, and of a TCP Service without any.
	lbUDP  = netip.MustParseAddr("198.19.0.9")
	lbOpen = netip.MustParseAddr("198.19.0.10")
)

// How a probe ended: "reached" or the errno name the client saw.
const (
	reached  = "reached"
	timedOut = "ETIMEDOUT"
	eperm    = "EPERM"
)

type probeKind int

const (
	probeTCP probeKind = iota
	probeUDP
	probeUDPConnected
)

func (k probeKind) String() string {
	return [...]string{"TCP", "UDP", "connected UDP"}[k]
}

// outcome runs one probe and says how it ended.
func (e *env) outcome(t *testing.T, c *sandbox.Client, kind probeKind, addr netip.AddrPort) string {
	t.Helper()
	var (
		errs   []string
		server string
		err    error
	)
	switch kind {
	case probeTCP:
		var rep sandbox.Report[sandbox.TCPResult]
		rep, err = c.TCP(e.ctx(), addr, 1)
		for _, r := range rep.Results {
			errs, server = append(errs, r.Err), r.Server
		}
	case probeUDP, probeUDPConnected:
		var rep sandbox.Report[sandbox.UDPResult]
		if kind == probeUDP {
			rep, err = c.UDP(e.ctx(), addr, 1)
		} else {
			rep, err = c.UDPConnected(e.ctx(), addr, 1)
		}
		for _, r := range rep.Results {
			errs, server = append(errs, r.Err), r.Server
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 1 {
		t.Fatalf("%d results", len(errs))
	}
	if errs[0] != "" {
		return errs[0]
	}
	if server == "" {
		return "no server named"
	}
	return reached
}

// probe is one attempt of a source range test and how it must end.
type probe struct {
	name   string
	client *sandbox.Client
	kind   probeKind
	addr   netip.AddrPort
	want   string
}

// runProbes runs each probe in a subtest named after it, its kind, its
// client and its address, and checks how it ended.
func (e *env) runProbes(t *testing.T, probes []probe) {
	t.Helper()
	for _, p := range probes {
		t.Run(fmt.Sprintf("%s %s from %s to %s", p.name, p.kind, p.client.Name, p.addr), func(t *testing.T) {
			if got := e.outcome(t, p.client, p.kind, p.addr); got != p.want {
				t.Errorf("got %s, want %s", got, p.want)
			}
		})
	}
}

// rangeClients adds the source range tests' clients: the pods inside
// (10.244.1.200) and outside (10.244.1.220) of their pod range, and the node
// itself. Dropped TCP and lost UDP show as the client's own timeout; a short
// one keeps the tests quick, and nothing there is slow otherwise.
func (e *env) rangeClients(t testing.TB) (inside, outside, node *sandbox.Client) {
	t.Helper()
	inside, err := e.sb.AddClient(e.node, "inside", netip.MustParseAddr("10.244.1.200"))
	if err != nil {
		t.Fatal(err)
	}
	outside, err = e.sb.AddClient(e.node, "outside", netip.MustParseAddr("10.244.1.220"))
	if err != nil {
		t.Fatal(err)
	}
	const wait = time.Second
	return inside.WithTimeout(wait), outside.WithTimeout(wait), e.sb.ClientAt(e.node.Host).WithTimeout(wait)
}

// podRangeProbes are the probes of ranges that hold inside but not outside:
// inside reaches the TCP LoadBalancer IP lb and the UDP one udpLB, over TCP,
// UDP and connected UDP; outside is dropped and loses its datagrams without
// an error.
func podRangeProbes(inside, outside *sandbox.Client, lb, udpLB netip.AddrPort) []probe {
	return []probe{
		{"pod inside the ranges reaches the LoadBalancer IP", inside, probeTCP, lb, reached},
		{"pod inside the ranges reaches the LoadBalancer IP", inside, probeUDP, udpLB, reached},
		{"pod inside the ranges reaches the LoadBalancer IP", inside, probeUDPConnected, udpLB, reached},
		{"pod outside the ranges is dropped", outside, probeTCP, lb, timedOut},
		{"pod outside the ranges loses its datagram without an error", outside, probeUDP, udpLB, timedOut},
		{"pod outside the ranges loses its datagram without an error", outside, probeUDPConnected, udpLB, timedOut},
	}
}

// nodeRangeProbes are the probes of ranges that hold the node but not
// outside: the node reaches lb and udpLB, outside is still dropped.
func nodeRangeProbes(outside, node *sandbox.Client, lb, udpLB netip.AddrPort) []probe {
	return []probe{
		{"the node inside the ranges reaches the LoadBalancer IP", node, probeTCP, lb, reached},
		{"the node inside the ranges reaches the LoadBalancer IP", node, probeUDP, udpLB, reached},
		{"pod outside the ranges is still dropped", outside, probeTCP, lb, timedOut},
	}
}

// noRangeProbes are the probes once the ranges are gone: every pod and the
// node reach lb, and pods reach udpLB.
func noRangeProbes(outside, node *sandbox.Client, lb, udpLB netip.AddrPort) []probe {
	return []probe{
		{"every pod reaches the LoadBalancer IP", outside, probeTCP, lb, reached},
		{"every pod reaches the LoadBalancer IP", outside, probeUDP, udpLB, reached},
		{"the node reaches the LoadBalancer IP", node, probeTCP, lb, reached},
	}
}

func withRanges(cidrs ...string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = cidrs }
}

func loadBalancer(ip netip.Addr) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip.String()}}
	}
}

// TestSourceRangesForPodsAndTheNode holds pods and the node itself to
// loadBalancerSourceRanges when they reach a LoadBalancer IP, as kube-proxy
// does with its firewall chain in PREROUTING and OUTPUT: a client outside
// the ranges is dropped (TCP retransmits its SYN until the client gives up;
// a pod's UDP datagram is lost silently; the node's UDP send() fails with
// EPERM), while NodePorts, ExternalIPs, the ClusterIP and Services without
// ranges stay open to it.
func TestSourceRangesForPodsAndTheNode(t *testing.T) {
	e := newEnv(t, 1)
	inside, outside, node := e.rangeClients(t)

	podRange := "10.244.1.192/28" // holds inside (.200), not outside (.220)
	program := func(ranges ...string) {
		t.Helper()
		e.addExposedWeb([]func(*v1.Service){withRanges(ranges...)}, e.podEPs(0)...)
		e.setService(makeService("dns-lb", "10.96.0.54", 53, v1.ProtocolUDP, intstr.FromString("p"),
			loadBalancer(lbUDP), withRanges(ranges...)))
		e.setSlice(makeSlice("dns-lb", "dns-lb-1", udpPort, v1.ProtocolUDP, e.podEPs(0)...))
		e.setService(makeService("open", "10.96.0.81", 80, v1.ProtocolTCP, intstr.FromString("p"), loadBalancer(lbOpen)))
		e.setSlice(makeSlice("open", "open-1", tcpPort, v1.ProtocolTCP, e.podEPs(0)...))
		e.sync()
	}
	lb := netip.AddrPortFrom(lbIP, 80)
	udpLB := netip.AddrPortFrom(lbUDP, 53)

	t.Run("ranges hold one pod, not the node", func(t *testing.T) {
		program(podRange)
		if !e.loaded.SourceRangeCheck() {
			t.Fatal("egress check not attached while a Service has source ranges")
		}
		before := e.counters()["sock_dropped_source_range"]
		e.runProbes(t, append(podRangeProbes(inside, outside, lb, udpLB),
			probe{"NodePorts bypass the ranges", outside, probeTCP, netip.AddrPortFrom(e.node.IP, nodePort), reached},
			probe{"ExternalIPs bypass the ranges", outside, probeTCP, netip.AddrPortFrom(externalIP, 80), reached},
			probe{"the ClusterIP is not restricted", outside, probeTCP, webVIP, reached},
			probe{"a Service without ranges is not restricted", outside, probeTCP, netip.AddrPortFrom(lbOpen, 80), reached},
			probe{"pod outside the ranges, after its other connections, still dropped", outside, probeTCP, lb, timedOut},
			probe{"the node outside the ranges is dropped", node, probeTCP, lb, timedOut},
			probe{"the node's datagram is refused in its OUTPUT path", node, probeUDP, udpLB, eperm},
			probe{"the node's datagram is refused in its OUTPUT path", node, probeUDPConnected, udpLB, eperm},
			probe{"NodePorts bypass the ranges for the node", node, probeTCP, netip.AddrPortFrom(e.node.IP, nodePort), reached},
		))
		if after := e.counters()["sock_dropped_source_range"]; after <= before {
			t.Errorf("sock_dropped_source_range stayed at %d", after)
		}
	})

	t.Run("ranges hold the node too", func(t *testing.T) {
		program(podRange, "192.168.77.0/24")
		e.runProbes(t, nodeRangeProbes(outside, node, lb, udpLB))
	})

	t.Run("ranges removed", func(t *testing.T) {
		program()
		if e.loaded.SourceRangeCheck() {
			t.Error("egress check still attached without any source ranges")
		}
		e.runProbes(t, noRangeProbes(outside, node, lb, udpLB))
	})
}
