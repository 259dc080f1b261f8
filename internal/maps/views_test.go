package maps

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// A NodePort flow under source NAT as the TC programs record it: the
// client's entry (to the NodePort, rewritten to the backend, from the
// node's address and port) and the backend's (to the node, rewritten back)
// read as one flow in the flow's terms.
func TestReadConntrackPutsBothDirectionsInTheFlowsTerms(t *testing.T) {
	ap := netip.MustParseAddrPort
	client, fe, be, snat := ap("198.51.100.7:40112"), ap("192.0.2.1:30080"), ap("10.244.1.3:8080"), ap("192.0.2.1:61001")
	m := NewFakeMap[CTKey, CTValue](8)
	key := func(s, d netip.AddrPort, dir uint8) CTKey {
		return CTKey{Saddr: be32(s.Addr()), Daddr: be32(d.Addr()), Sport: be16(s.Port()), Dport: be16(d.Port()), Proto: uint8(model.TCP), Dir: dir}
	}
	val := func(ns, nd netip.AddrPort) CTValue {
		return CTValue{NatSaddr: be32(ns.Addr()), NatDaddr: be32(nd.Addr()), NatSport: be16(ns.Port()), NatDport: be16(nd.Port()),
			BackendId: 3, SvcId: 2, Expires: 500, Born: 40, Flags: CTFlagSNAT | CTFlagSynWait}
	}
	_ = m.Put(key(client, fe, CTDirOrig), val(snat, be))
	_ = m.Put(key(be, snat, CTDirReply), val(fe, client))
	got, err := ReadConntrack(m)
	if err != nil || len(got) != 2 {
		t.Fatalf("ReadConntrack: %v, %d entries, want 2", err, len(got))
	}
	for i, e := range got {
		if e.Reply != (i == 1) || e.Client != client || e.Frontend != fe || e.SNAT != snat || e.Proto != model.TCP ||
			e.SvcID != 2 || e.BackendID != 3 || e.Expires != 500 || e.Born != 40 {
			t.Errorf("entry %d: %+v, want client %s frontend %s snat %s", i, e, client, fe, snat)
		}
	}
	if got[0].Backend != be {
		t.Errorf("original entry's backend %s, want %s", got[0].Backend, be)
	}
	if s := CTFlagNames(got[0].Flags); s != "snat,syn-wait" {
		t.Errorf("flags %q, want snat,syn-wait", s)
	}

	// Without source NAT the reply goes to the client itself.
	m6 := NewFakeMap[CT6Key, CT6Value](8)
	c6, fe6, be6 := ap("[2001:db8::7]:5000"), ap("[fd00::20]:80"), ap("[fd00:244::3]:8080")
	_ = m6.Put(CT6Key{Saddr: be128(be6.Addr()), Daddr: be128(c6.Addr()), Sport: be16(be6.Port()), Dport: be16(c6.Port()), Proto: uint8(model.UDP), Dir: CTDirReply},
		CT6Value{NatSaddr: be128(fe6.Addr()), NatSport: be16(fe6.Port()), SvcId: 1, BackendId: 1})
	got6, err := ReadConntrack6(m6)
	if err != nil || len(got6) != 1 {
		t.Fatalf("ReadConntrack6: %v, %v", err, got6)
	}
	if e := got6[0]; !e.Reply || e.Client != c6 || e.Frontend != fe6 || e.Backend != be6 || e.SNAT.IsValid() || e.Proto != model.UDP {
		t.Errorf("IPv6 reply entry %+v, want client %s frontend %s backend %s, no SNAT", e, c6, fe6, be6)
	}
}

func TestReadAffinityTellsAddressesFromNetnsCookies(t *testing.T) {
	m := NewFakeMap[AffinityKey, AffinityValue](8)
	client := netip.MustParseAddr("198.51.100.7")
	_ = m.Put(AffinityKey{Client: uint64(be32(client)), SvcId: 2, ClientKind: affinityClientAddr}, AffinityValue{BackendId: 1, LastUsedNs: 7})
	_ = m.Put(AffinityKey{Client: 4097, SvcId: 2}, AffinityValue{BackendId: 2, LastUsedNs: 9})
	got, err := ReadAffinity(m)
	if err != nil || len(got) != 2 {
		t.Fatalf("ReadAffinity: %v, %v", err, got)
	}
	if e := got[0]; e.ClientAddr.IsValid() || e.NetnsCookie != 4097 || e.BackendID != 2 || e.LastUsedNs != 9 {
		t.Errorf("netns entry %+v", e)
	}
	if e := got[1]; e.ClientAddr != client || e.NetnsCookie != 0 || e.SvcID != 2 || e.BackendID != 1 {
		t.Errorf("address entry %+v, want client %s", e, client)
	}

	m6 := NewFakeMap[Affinity6Key, AffinityValue](8)
	c6 := netip.MustParseAddr("2001:db8::7")
	w := be128(c6)
	_ = m6.Put(Affinity6Key{Client: [2]uint64{uint64(w[0]) | uint64(w[1])<<32, uint64(w[2]) | uint64(w[3])<<32}, SvcId: 1, ClientKind: affinityClientAddr},
		AffinityValue{BackendId: 1})
	got6, err := ReadAffinity6(m6)
	if err != nil || len(got6) != 1 || got6[0].ClientAddr != c6 {
		t.Errorf("ReadAffinity6: %v, %+v, want client %s", err, got6, c6)
	}
}

func TestReadMaglevCountsSlotsPerBackend(t *testing.T) {
	f := NewFakeMaglev(7)
	_ = f.Set(4, []uint32{1, 2, 1, 1, 2, 1, 2}, 0)
	got, err := ReadMaglev(f)
	if err != nil || len(got) != 1 {
		t.Fatalf("ReadMaglev: %v, %v", err, got)
	}
	if e := got[0]; e.SvcID != 4 || e.Size != 7 || e.Slots[1] != 4 || e.Slots[2] != 3 || len(e.Slots) != 2 {
		t.Errorf("table %+v, want svc 4, size 7, backend 1: 4 slots, backend 2: 3", e)
	}
}

func TestReadSourceRangesSeparatesTheNodesEntry(t *testing.T) {
	f := NewFakes(8, 8, 8)
	f.Ranges = NewFakeMap[SourceRangeKey, uint8](8)
	p := netip.MustParsePrefix("203.0.113.0/24")
	_ = f.Ranges.Put(rangeKey{svcID: 3, prefix: p}.encode4(), 1)
	_ = f.Ranges.Put(rangeKey{svcID: 3 | NodeSourceRange}.encode4(), 1)
	got, err := ReadSourceRanges(f.Maps())
	if err != nil || len(got) != 2 {
		t.Fatalf("ReadSourceRanges: %v, %v", err, got)
	}
	if got[0] != (SourceRangeEntry{SvcID: 3, Prefix: p}) || got[1] != (SourceRangeEntry{SvcID: 3, Node: true}) {
		t.Errorf("entries %+v, want svc 3's %s, then its node entry", got, p)
	}
}
