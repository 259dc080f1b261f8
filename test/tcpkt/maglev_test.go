package tcpkt_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/pktest"
)

const (
	npMaglev    = 30020
	maglevFlows = 400
)

// maglevService is a NodePort Service using Maglev with n endpoints on this
// node (delivered without source NAT, so the output names the backend).
func maglevService(n int) service {
	var eps []string
	for i := range n {
		eps = append(eps, at(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, byte(100 + i)}), 8080), thisNode))
	}
	return service{name: "mg", clusterIP: "10.96.0.40", port: 80, proto: model.TCP, nodePort: npMaglev, maglev: true, endpoints: eps}
}

// maglevFlow is flow i from outside to the Maglev NodePort.
func maglevFlow(i int, flags pktest.TCPFlags) []byte {
	src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i%50)}), uint16(20000+i))
	return fromOutside(pktest.TCP(src, np(npMaglev), flags)).Bytes()
}

// backends sends the first packet (flags) of every flow and returns where
// each went.
func (f *fixture) backends(t *testing.T, flags pktest.TCPFlags) []netip.Addr {
	t.Helper()
	out := make([]netip.Addr, maglevFlows)
	for i := range out {
		res, err := pktest.Exec(f.objs.TcIngress, pktest.Case{In: maglevFlow(i, flags), Do: f.ns.Do, SKB: &pktest.SKBContext{Ifindex: f.ifindex}})
		if err != nil {
			t.Fatal(err)
		}
		pkt := pktest.Decode(res.Out)
		if res.Verdict != pktest.TCActOK || pkt.IPv4 == nil {
			t.Fatalf("flow %d: verdict %v, output %s", i, res.Verdict, pkt)
		}
		out[i] = pkt.IPv4.Dst
	}
	return out
}

// TestMaglevPicksByFlowAndMovesFewFlows: with Maglev a flow's backend is a
// function of the flow and the endpoints, the same on every node (here: after
// the connection tracking is forgotten); adding an endpoint moves flows to it
// and hardly any between the others, while established flows keep theirs.
func TestMaglevPicksByFlowAndMovesFewFlows(t *testing.T) {
	f := newFixture(t, loadOptions{})
	f.sync(t, state(maglevService(10)))
	before := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV)
	first := f.backends(t, pktest.SYN)
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
		again := f.backends(t, pktest.SYN)
		for i := range again {
			if again[i] != first[i] {
				t.Errorf("flow %d went to %s, then to %s", i, first[i], again[i])
			}
		}
	})

	f.sync(t, state(maglevService(11)))
	added := netip.AddrFrom4([4]byte{10, 244, 1, 110})

	t.Run("established flows keep their backend across the addition", func(t *testing.T) {
		now := f.backends(t, pktest.ACK)
		for i := range now {
			if now[i] != first[i] {
				t.Errorf("established flow %d moved from %s to %s", i, first[i], now[i])
			}
		}
	})
	t.Run("new flows move to the new endpoint, hardly any elsewhere", func(t *testing.T) {
		f.resetCT(t)
		now := f.backends(t, pktest.SYN)
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
	f := newFixture(t, loadOptions{})
	svc := maglevService(10)
	svc.maglev = false
	f.sync(t, state(svc))
	first := f.backends(t, pktest.SYN)
	f.resetCT(t)
	again := f.backends(t, pktest.SYN)
	same := 0
	for i := range again {
		if again[i] == first[i] {
			same++
		}
	}
	if same > maglevFlows/2 {
		t.Errorf("%d of %d flows replayed to the same backend at random; want about a tenth", same, maglevFlows)
	}
	if n := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV); n != 0 {
		t.Errorf("tc_maglev_selected = %d without Maglev", n)
	}
}

// TestAffinityComesBeforeMaglev: under ClientIP affinity a client's later
// connections keep the backend of its first, which Maglev chose; they would
// spread over the endpoints by Maglev alone (their ports differ). Maglev is
// counted for that first choice only.
func TestAffinityComesBeforeMaglev(t *testing.T) {
	f := newFixture(t, loadOptions{})
	svc := maglevService(10)
	svc.affinity = true
	f.sync(t, state(svc))
	maglev := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV)
	hits := f.counter(t, bpfobj.TcLbMetricLB_M_AFFINITY_HIT)
	const conns = 20
	f.sameBackend(t, np(npMaglev), 41000, conns)
	if got := f.counter(t, bpfobj.TcLbMetricLB_M_MAGLEV) - maglev; got != 1 {
		t.Errorf("tc_maglev_selected counted %d times, want 1 (the first connection)", got)
	}
	if got := f.counter(t, bpfobj.TcLbMetricLB_M_AFFINITY_HIT) - hits; got != conns-1 {
		t.Errorf("affinity hits counted %d times, want %d", got, conns-1)
	}
}
