package tcpkt_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

const (
	npMaglev    = 30020
	maglevFlows = 400
)

// maglevFamily is what the Maglev tests need of an address family: a
// node of the family (the TC programs with its writer), its Services'
// addresses and its flows from outside. The tests run once per family.
type maglevFamily struct {
	name string
	// newNode makes a node: TC programs, maps and writer of their own.
	newNode func(t *testing.T) *maglevNode
	// clusterIP is the Maglev Service's, other another Service's.
	clusterIP, other string
	// endpoint is local endpoint i (no neighbour entry: the output is
	// handed to the stack, naming the backend).
	endpoint func(i int) netip.Addr
	// client is external client i.
	client func(i int) netip.Addr
	// packet is a TCP segment from outside with flags.
	packet func(src, dst netip.AddrPort, flags pktest.TCPFlags) []byte
	// nodePort is the node's address with port.
	nodePort func(port uint16) netip.AddrPort
}

// maglevNode is a node of a family.
type maglevNode struct {
	*fixture
	// sync programs svcs as the agent does.
	sync func(t *testing.T, svcs ...service)
	// resetCT forgets the family's tracked flows.
	resetCT func(t *testing.T)
}

var maglevFamilies = []maglevFamily{
	{
		name: "IPv4",
		newNode: func(t *testing.T) *maglevNode {
			f := newFixture(t, loadOptions{})
			return &maglevNode{
				fixture: f,
				sync:    func(t *testing.T, svcs ...service) { f.sync(t, state(svcs...)) },
				resetCT: func(t *testing.T) { f.resetCT(t) },
			}
		},
		clusterIP: "10.96.0.40", other: "10.96.0.41",
		endpoint: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 1, byte(100 + i)}) },
		client:   func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}) },
		packet: func(src, dst netip.AddrPort, flags pktest.TCPFlags) []byte {
			return fromOutside(pktest.TCP(src, dst, flags)).Bytes()
		},
		nodePort: np,
	},
	{
		name: "IPv6",
		newNode: func(t *testing.T) *maglevNode {
			f := newFixture6(t, loadOptions{})
			return &maglevNode{
				fixture: f.fixture,
				sync: func(t *testing.T, svcs ...service) {
					st := state(svcs...)
					st.Node.Addrs = []netip.Addr{node6}
					f.sync6(t, st)
				},
				resetCT: func(t *testing.T) { f.resetCT6(t) },
			}
		},
		clusterIP: "fd00:96::40", other: "fd00:96::41",
		endpoint: func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:244:1::%x", 0x100+i)) },
		// Clients of one /64 that differ in the last word only, where
		// a hash folding the address badly would lose them.
		client: func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("2001:db8:18::%x", 0x10+i)) },
		packet: func(src, dst netip.AddrPort, flags pktest.TCPFlags) []byte {
			return fromOutside(pktest.TCP6(src, dst, flags)).Bytes()
		},
		nodePort: np6,
	},
}

// forEachFamily runs test for each family.
func forEachFamily(t *testing.T, test func(t *testing.T, fam maglevFamily)) {
	for _, fam := range maglevFamilies {
		t.Run(fam.name, func(t *testing.T) { test(t, fam) })
	}
}

// maglevService is a NodePort Service using Maglev with n endpoints on
// this node (delivered without source NAT, so the output names the
// backend).
func (fam maglevFamily) maglevService(n int) service {
	var eps []string
	for i := range n {
		eps = append(eps, at(netip.AddrPortFrom(fam.endpoint(i), 8080), thisNode))
	}
	return service{name: "mg", clusterIP: fam.clusterIP, port: 80, proto: model.TCP, nodePort: npMaglev, maglev: true, endpoints: eps}
}

// maglevFlow is flow i from outside to the Maglev NodePort: 50 clients,
// each from several ports.
func (fam maglevFamily) maglevFlow(i int, flags pktest.TCPFlags) []byte {
	return fam.packet(netip.AddrPortFrom(fam.client(i%50), uint16(20000+i)), fam.nodePort(npMaglev), flags)
}

// backends sends the first packet (flags) of every flow and returns where
// each went.
func (n *maglevNode) backends(t *testing.T, fam maglevFamily, flags pktest.TCPFlags) []netip.Addr {
	t.Helper()
	out := make([]netip.Addr, maglevFlows)
	for i := range out {
		out[i] = n.localBackend(t, fam.maglevFlow(i, flags))
	}
	return out
}

// localBackend runs in through tc_ingress and returns the destination of
// the output, which must be handed to the node's stack (a local backend).
func (f *fixture) localBackend(t *testing.T, in []byte) netip.Addr {
	t.Helper()
	res, err := pktest.Exec(f.objs.TcIngress, pktest.Case{In: in, Do: f.ns.Do, SKB: &pktest.SKBContext{Ifindex: f.ifindex}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict == pktest.TCActOK {
		if pkt := pktest.Decode(res.Out); pkt.IPv4 != nil {
			return pkt.IPv4.Dst
		}
		out := gopacket.NewPacket(res.Out, layers.LayerTypeEthernet, gopacket.Default)
		if ip, ok := out.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
			if a, ok := netip.AddrFromSlice(ip.DstIP); ok {
				return a
			}
		}
	}
	t.Fatalf("verdict %v, output %s", res.Verdict, pktest.Decode(res.Out))
	return netip.Addr{}
}

// TestMaglevPicksByFlowAndMovesFewFlows: with Maglev a flow's backend is a
// function of the flow and the endpoints, the same on every node (here:
// after the connection tracking is forgotten, and on a second node whose
// writer numbered the backends otherwise); adding an endpoint moves flows
// to it and hardly any between the others, while established flows keep
// theirs. For each family.
func TestMaglevPicksByFlowAndMovesFewFlows(t *testing.T) {
	forEachFamily(t, testMaglevPicksByFlow)
}

func testMaglevPicksByFlow(t *testing.T, fam maglevFamily) {
	f := fam.newNode(t)
	f.sync(t, fam.maglevService(10))
	before := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV)
	first := f.backends(t, fam, pktest.SYN)
	if got := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV) - before; got != maglevFlows {
		t.Errorf("tc_maglev_selected counted %d of %d new flows", got, maglevFlows)
	}
	share := map[netip.Addr]int{}
	for _, b := range first {
		share[b]++
	}
	if len(share) != 10 {
		t.Errorf("%d flows reached %d endpoints, want all 10: %v", maglevFlows, len(share), share)
	}

	t.Run("the same flows on another node pick the same backends", func(t *testing.T) {
		f.resetCT(t)
		again := f.backends(t, fam, pktest.SYN)
		for i := range again {
			if again[i] != first[i] {
				t.Errorf("flow %d went to %s, then to %s", i, first[i], again[i])
			}
		}
	})
	t.Run("a second node whose backend ids differ picks the same backends", func(t *testing.T) {
		g := fam.newNode(t)
		// Another Service's endpoints first: the Maglev Service's
		// backends get other ids on this node.
		other := service{name: "other", clusterIP: fam.other, port: 81, proto: model.TCP}
		for i := 20; i < 23; i++ {
			other.endpoints = append(other.endpoints, at(netip.AddrPortFrom(fam.endpoint(i), 8080), otherNode))
		}
		g.sync(t, other)
		g.sync(t, other, fam.maglevService(10))
		there := g.backends(t, fam, pktest.SYN)
		for i := range there {
			if there[i] != first[i] {
				t.Errorf("flow %d went to %s on one node, to %s on the other", i, first[i], there[i])
			}
		}
	})

	f.sync(t, fam.maglevService(11))
	added := fam.endpoint(10)

	t.Run("established flows keep their backend across the addition", func(t *testing.T) {
		now := f.backends(t, fam, pktest.ACK)
		for i := range now {
			if now[i] != first[i] {
				t.Errorf("established flow %d moved from %s to %s", i, first[i], now[i])
			}
		}
	})
	t.Run("new flows move to the new endpoint, hardly any elsewhere", func(t *testing.T) {
		f.resetCT(t)
		now := f.backends(t, fam, pktest.SYN)
		toNew, elsewhere := 0, 0
		for i := range now {
			switch {
			case now[i] == first[i]:
			case now[i] == added:
				toNew++
			default:
				elsewhere++
			}
		}
		t.Logf("%d of %d flows moved to the new endpoint, %d between the others", toNew, maglevFlows, elsewhere)
		if toNew == 0 {
			t.Errorf("no flow moved to the added endpoint")
		}
		// Maglev's table changes by about 1/(N+1) towards the new
		// backend and by a few per mille between the others.
		if limit := maglevFlows * 2 / 100; elsewhere > limit {
			t.Errorf("%d flows moved between endpoints that stayed, want at most %d", elsewhere, limit)
		}
	})
}

// Random selection is the default: without the Maglev setting the same
// flows, replayed, do not keep their backends (the test above would be
// meaningless if they did).
func TestWithoutMaglevFlowsArePickedAtRandom(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam maglevFamily) {
		f := fam.newNode(t)
		svc := fam.maglevService(10)
		svc.maglev = false
		f.sync(t, svc)
		f.expectRandom(t, fam, "without Maglev")
	})
}

// expectRandom checks that flows replayed after their tracking is
// forgotten mostly change backends (about nine in ten, at random among
// ten), and that Maglev chose none of them; why says what the Service
// lacks.
func (f *maglevNode) expectRandom(t *testing.T, fam maglevFamily, why string) {
	t.Helper()
	first := f.backends(t, fam, pktest.SYN)
	f.resetCT(t)
	again := f.backends(t, fam, pktest.SYN)
	same := 0
	for i := range again {
		if again[i] == first[i] {
			same++
		}
	}
	if same > maglevFlows/2 {
		t.Errorf("%d of %d flows replayed to the same backend %s; want about a tenth (at random)", same, maglevFlows, why)
	}
	if n := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV); n != 0 {
		t.Errorf("tc_maglev_selected = %d %s", n, why)
	}
}

// TestATableIsLookedUpOnlyForFrontendsThatAskForIt: the programs hash a
// new flow and look a Maglev table up only for a frontend with
// SVC_F_MAGLEV (the writer sets it on the external frontends of a
// ServicePort whose table it wrote). With the flag cleared and the table
// left in place, flows are picked at random and Maglev is never counted.
func TestATableIsLookedUpOnlyForFrontendsThatAskForIt(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam maglevFamily) {
		f := fam.newNode(t)
		f.sync(t, fam.maglevService(10))
		services := f.objs.Lb4ServicesV1
		if fam.name == "IPv6" {
			services = f.objs.Lb6ServicesV1
		}
		cleared := 0
		var (
			key []byte
			val bpfobj.TcLb4Service
		)
		it := services.Iterate()
		for it.Next(&key, &val) {
			if val.Flags&maps.FlagMaglev == 0 {
				continue
			}
			val.Flags &^= maps.FlagMaglev
			if err := services.Put(key, val); err != nil {
				t.Fatal(err)
			}
			cleared++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if cleared == 0 {
			t.Fatal("the writer set SVC_F_MAGLEV on no frontend of the Maglev Service")
		}
		f.expectRandom(t, fam, "without SVC_F_MAGLEV")
	})
}

// TestAffinityComesBeforeMaglev: under ClientIP affinity a client's later
// connections keep the backend of its first, which Maglev chose; they would
// spread over the endpoints by Maglev alone (their ports differ). Maglev is
// counted for that first choice only.
func TestAffinityComesBeforeMaglev(t *testing.T) {
	forEachFamily(t, func(t *testing.T, fam maglevFamily) {
		f := fam.newNode(t)
		svc := fam.maglevService(10)
		svc.affinity = true
		f.sync(t, svc)
		maglev := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV)
		hits := f.counter(t, bpfobj.TcLbMetricLB_M_AFFINITY_HIT)
		const conns = 20
		f.sameBackend(t, conns, func(i int) []byte {
			return fam.packet(netip.AddrPortFrom(fam.client(0), uint16(41000+i)), fam.nodePort(npMaglev), pktest.SYN)
		})
		if got := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV) - maglev; got != 1 {
			t.Errorf("tc_maglev_selected counted %d times, want 1 (the first connection)", got)
		}
		if got := f.counter(t, bpfobj.TcLbMetricLB_M_AFFINITY_HIT) - hits; got != conns-1 {
			t.Errorf("affinity hits counted %d times, want %d", got, conns-1)
		}
	})
}
