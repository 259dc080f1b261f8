package maps

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// The keys Lookups builds are the ones the readers of dump decode: an
// affinity entry and a flow written under Lookups' keys read back, through
// ReadAffinity and ReadConntrack, as the client, frontend and backend they
// were made for, in both families.
func TestLookupKeysAreTheReadersKeys(t *testing.T) {
	ap := netip.MustParseAddrPort
	client := netip.MustParseAddr("198.51.100.7")
	aff := NewFakeMap[AffinityKey, AffinityValue](0)
	_ = aff.Put(affinityKey{addr: client, svcID: 4}.encode4(), AffinityValue{BackendId: 9, LastUsedNs: 77})
	_ = aff.Put(affinityKey{cookie: 4097, svcID: 4}.encode4(), AffinityValue{BackendId: 8, LastUsedNs: 78})
	es, err := ReadAffinity(aff)
	if err != nil || len(es) != 2 || es[0].NetnsCookie != 4097 || es[1].ClientAddr != client || es[1].BackendID != 9 {
		t.Errorf("ReadAffinity of Lookups' keys: %v %+v, want the netns entry and %s's", err, es, client)
	}
	l := NewLookups(LookupMaps{Affinity: aff})
	if e, ok, err := l.AffinityOfAddr(client, 4); err != nil || !ok || e.BackendID != 9 || e.LastUsedNs != 77 {
		t.Errorf("AffinityOfAddr: %+v %v %v", e, ok, err)
	}
	if e, ok, _ := l.AffinityOfNetns(4097, 4); !ok || e.BackendID != 8 {
		t.Errorf("AffinityOfNetns: %+v %v", e, ok)
	}
	if _, ok, _ := l.AffinityOfNetns(4097, 5); ok {
		t.Errorf("AffinityOfNetns found an entry of another ServicePort")
	}

	client6 := netip.MustParseAddr("2001:db8::7")
	aff6 := NewFakeMap[Affinity6Key, AffinityValue](0)
	_ = aff6.Put(affinityKey{addr: client6, svcID: 1}.encode6(), AffinityValue{BackendId: 3})
	if es, err := ReadAffinity6(aff6); err != nil || len(es) != 1 || es[0].ClientAddr != client6 {
		t.Errorf("ReadAffinity6 of Lookups' key: %v %+v, want %s", err, es, client6)
	}

	// A source-NATed flow: the client's entry and the backend's reply.
	c, fe, be, snat := ap("198.51.100.7:40112"), ap("192.0.2.1:30080"), ap("10.244.1.3:8080"), ap("192.0.2.1:61001")
	p := NewFakeProgramMaps()
	p.PutFlow(model.TCP, c, fe, be, snat, 3, 2, 500)
	_ = p.Conntrack.Put(ctKey{src: be, dst: snat, proto: model.TCP, dir: CTDirReply}.encode4(),
		CTValue{NatSaddr: be32(fe.Addr()), NatSport: be16(fe.Port()), NatDaddr: be32(c.Addr()), NatDport: be16(c.Port()),
			BackendId: 3, SvcId: 2, Flags: CTFlagSNAT})
	flows, err := ReadConntrack(p.Conntrack)
	if err != nil || len(flows) != 2 || flows[0].Client != c || flows[0].Backend != be || flows[0].SNAT != snat ||
		flows[1].Client != c || flows[1].Frontend != fe {
		t.Fatalf("ReadConntrack of Lookups' keys: %v %+v", err, flows)
	}
	l = NewLookups(LookupMaps{Conntrack: p.Conntrack})
	if e, ok, err := l.Conntrack(c, fe, model.TCP, false); err != nil || !ok || e != flows[0] {
		t.Errorf("Conntrack(original): %+v %v %v, want %+v", e, ok, err, flows[0])
	}
	if e, ok, _ := l.Conntrack(be, snat, model.TCP, true); !ok || e != flows[1] {
		t.Errorf("Conntrack(reply): %+v %v, want %+v", e, ok, flows[1])
	}
	if _, ok, _ := l.Conntrack(c, fe, model.UDP, false); ok {
		t.Errorf("Conntrack found a TCP flow for UDP")
	}
	c6, fe6 := ap("[2001:db8::7]:5000"), ap("[fd00::20]:80")
	ct6 := NewFakeMap[CT6Key, CT6Value](0)
	_ = ct6.Put(ctKey{src: c6, dst: fe6, proto: model.UDP}.encode6(), CT6Value{BackendId: 1})
	if es, err := ReadConntrack6(ct6); err != nil || len(es) != 1 || es[0].Client != c6 || es[0].Frontend != fe6 {
		t.Errorf("ReadConntrack6 of Lookups' key: %v %+v", err, es)
	}
	if !l.HasConntrack() || l.HasSNATAddrs() || NewLookups(LookupMaps{}).HasConntrack() {
		t.Errorf("HasConntrack and HasSNATAddrs must say which maps were given")
	}
}

// LookupService answers as lb_lookup_service: the external entry, or for
// a client of the internal scope the internal entry the external one
// announces, falling back to the external one when it is missing.
func TestLookupServiceScopes(t *testing.T) {
	f := NewFakes(0, 0, 0)
	fe := Frontend{Addr: netip.MustParseAddr("192.0.2.1"), Port: 30080, Proto: model.TCP}
	ife := fe
	ife.Scope = ScopeInternal
	_ = f.Services.Put(fe.key(0).encode4(), ServiceValue{Flags: FlagNodePort | FlagTwoScopes | FlagDrop, SvcId: 1})
	_ = f.Services.Put(ife.key(0).encode4(), ServiceValue{Flags: FlagNodePort, Count: 1, SvcId: 1})
	l := f.Lookups(nil)
	if got, v, ok, _ := l.LookupService(fe.Addr, fe.Port, fe.Proto, ScopeExternal); !ok || got.Scope != ScopeExternal || v.Flags&FlagDrop == 0 {
		t.Errorf("external client: %v %+v %v, want the external entry (drop)", got, v, ok)
	}
	if got, v, ok, _ := l.LookupService(fe.Addr, fe.Port, fe.Proto, ScopeInternal); !ok || got.Scope != ScopeInternal || v.Count != 1 {
		t.Errorf("internal client: %v %+v %v, want the internal entry", got, v, ok)
	}
	_ = f.Services.Delete(ife.key(0).encode4())
	if got, _, ok, _ := l.LookupService(fe.Addr, fe.Port, fe.Proto, ScopeInternal); !ok || got.Scope != ScopeExternal {
		t.Errorf("internal entry missing: %v %v, want the external entry", got, ok)
	}
	if _, _, ok, _ := l.LookupService(fe.Addr, fe.Port, model.UDP, ScopeInternal); ok {
		t.Errorf("found a UDP frontend that is not there")
	}
}

// The flow hash of both families is lookup3 over the words the programs
// load: a change of any field of the tuple changes it, and the IPv6 hash
// is not the IPv4 one of the mapped addresses. (Its agreement with the
// programs is tested by real traffic: test/tclb TestAgentTraceAgreesWithTraffic
// predicts the Maglev backend of each source port.)
func TestFlowHashCoversTheTuple(t *testing.T) {
	ap := netip.MustParseAddrPort
	l4, l6 := NewLookups(LookupMaps{}), NewLookups6(LookupMaps6{})
	base := l4.FlowHash(ap("198.18.0.10:41001"), ap("192.168.77.11:30080"), model.TCP)
	seen := map[uint32]string{base: "base"}
	for name, h := range map[string]uint32{
		"source address": l4.FlowHash(ap("198.18.0.11:41001"), ap("192.168.77.11:30080"), model.TCP),
		"source port":    l4.FlowHash(ap("198.18.0.10:41002"), ap("192.168.77.11:30080"), model.TCP),
		"destination":    l4.FlowHash(ap("198.18.0.10:41001"), ap("192.168.77.12:30080"), model.TCP),
		"port":           l4.FlowHash(ap("198.18.0.10:41001"), ap("192.168.77.11:30081"), model.TCP),
		"protocol":       l4.FlowHash(ap("198.18.0.10:41001"), ap("192.168.77.11:30080"), model.UDP),
		"IPv6":           l6.FlowHash(ap("[::ffff:198.18.0.10]:41001"), ap("[::ffff:192.168.77.11]:30080"), model.TCP),
	} {
		if other, dup := seen[h]; dup {
			t.Errorf("changing the %s gives the hash of the %s: %#x", name, other, h)
		}
		seen[h] = name
	}
}
