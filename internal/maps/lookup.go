package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// The lookups below ask one family's maps, key by key, the questions the
// programs ask them (bpf/lib/lb.h, nodeport.h, srcrange.h, maglev.h), with
// keys encoded as the programs build them: `ebpf-proxy trace` follows a
// flow's path through them. They only read.

// Looker is the part of a map a lookup needs: a kernel map (KernelLooker)
// or a FakeMap.
type Looker[K comparable, V any] interface {
	// Lookup returns the value of k and whether it is present. The
	// lookup of an LPM trie gives the longest prefix that holds k.
	Lookup(k K) (V, bool, error)
}

// Lookup implements Looker.
func (k kernelMap[K, V]) Lookup(key K) (V, bool, error) {
	var v V
	if err := k.m.Lookup(&key, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return v, false, nil
		}
		return v, false, fmt.Errorf("lookup in %s: %w", k.m, err)
	}
	return v, true, nil
}

// KernelLooker wraps a map opened from its pin; nil gives nil (a map that
// is not pinned).
func KernelLooker[K comparable, V any](m *ebpf.Map) Looker[K, V] {
	if m == nil {
		return nil
	}
	return kernelMap[K, V]{m}
}

// Lookup implements Looker, with exact keys.
func (f *FakeMap[K, V]) Lookup(k K) (V, bool, error) {
	v, ok := f.Entries[k]
	return v, ok, nil
}

// More generated types of the TC programs' maps.
type (
	// SNATAddrValue mirrors struct tc4_snat_addr, SNAT6AddrValue struct
	// tc6_snat_addr.
	SNATAddrValue  = bpfobj.TcTc4SnatAddr
	SNAT6AddrValue = bpfobj.TcTc6SnatAddr
)

// MaglevLooker reads one entry of a family's Maglev tables.
type MaglevLooker interface {
	// Lookup returns the backend id at index idx of the table of the
	// ServicePort svcID and the table's size; ok is false when the
	// ServicePort has no table.
	Lookup(svcID, idx uint32) (backendID uint32, size int, ok bool, err error)
}

// KernelMaglevLooker reads the tables of a pinned lb4_maglev_v1 or
// lb6_maglev_v1 as lb_maglev_backend_id does; nil gives nil.
func KernelMaglevLooker(outer *ebpf.Map) MaglevLooker {
	if outer == nil {
		return nil
	}
	return kernelMaglevLooker{outer}
}

type kernelMaglevLooker struct{ outer *ebpf.Map }

func (k kernelMaglevLooker) Lookup(svcID, idx uint32) (uint32, int, bool, error) {
	var innerID ebpf.MapID
	if err := k.outer.Lookup(&svcID, &innerID); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, 0, false, nil
		}
		return 0, 0, false, fmt.Errorf("lookup in %s: %w", k.outer, err)
	}
	inner, err := ebpf.NewMapFromID(innerID)
	if err != nil {
		return 0, 0, false, fmt.Errorf("open the Maglev table of ServicePort %d: %w", svcID, err)
	}
	defer inner.Close()
	size := int(inner.MaxEntries())
	var id uint32
	if err := inner.Lookup(&idx, &id); err != nil {
		return 0, size, true, fmt.Errorf("lookup %d in the Maglev table of ServicePort %d: %w", idx, svcID, err)
	}
	return id, size, true, nil
}

// Lookup implements MaglevLooker.
func (f *FakeMaglev) Lookup(svcID, idx uint32) (uint32, int, bool, error) {
	t, ok := f.Tables[svcID]
	if !ok {
		return 0, 0, false, nil
	}
	if int(idx) >= len(t) {
		return 0, len(t), true, fmt.Errorf("index %d beyond a table of %d", idx, len(t))
	}
	return t[idx], len(t), true, nil
}

// LookupMaps are the IPv4 maps Lookups reads. Services, Backends and
// Members are required; a nil map of the others is one that is not pinned
// (the TC programs never attached, say), which holds nothing.
type LookupMaps struct {
	Services     Looker[ServiceKey, ServiceValue]
	Backends     Looker[uint32, BackendValue]
	Members      Looker[MemberKey, uint8]
	SourceRanges Looker[SourceRangeKey, uint8]
	Affinity     Looker[AffinityKey, AffinityValue]
	Conntrack    Looker[CTKey, CTValue]
	SNATAddrs    Looker[uint32, SNATAddrValue]
	Maglev       MaglevLooker
}

// LookupMaps6 are LookupMaps for IPv6.
type LookupMaps6 struct {
	Services     Looker[Service6Key, ServiceValue]
	Backends     Looker[uint32, Backend6Value]
	Members      Looker[MemberKey, uint8]
	SourceRanges Looker[SourceRange6Key, uint8]
	Affinity     Looker[Affinity6Key, AffinityValue]
	Conntrack    Looker[CT6Key, CT6Value]
	SNATAddrs    Looker[uint32, SNAT6AddrValue]
	Maglev       MaglevLooker
}

// Lookups reads one family's maps as the programs do.
type Lookups struct {
	fam      family
	services func(serviceKey) (ServiceValue, bool, error)
	backends func(uint32) (backendEntry, bool, error)
	members  func(MemberKey) (uint8, bool, error)
	ranges   func(rangeKey) (uint8, bool, error)
	affinity func(affinityKey) (AffinityValue, bool, error)
	ct       func(ctKey) (CTEntry, bool, error)
	snat     func(uint32) (netip.Addr, bool, error)
	maglev   MaglevLooker
	// hasCT and hasSNAT say whether the TC programs' maps were given.
	hasCT, hasSNAT bool
}

// affinityKey is a key of the affinity map: a client (an address, or a
// network namespace cookie) and a ServicePort.
type affinityKey struct {
	addr   netip.Addr
	cookie uint64
	svcID  uint32
}

// ctKey is a key of the conntrack map: a packet's tuple as the TC program
// sees it, and the direction of the entry.
type ctKey struct {
	src, dst netip.AddrPort
	proto    model.Protocol
	dir      uint8
}

// lookupWith encodes a key, looks it up and decodes the value; a nil
// Looker holds nothing.
func lookupWith[N comparable, NV any, K comparable, V any](l Looker[K, V], enc func(N) K, dec func(K, V) NV) func(N) (NV, bool, error) {
	return func(n N) (NV, bool, error) {
		var out NV
		if l == nil {
			return out, false, nil
		}
		k := enc(n)
		v, ok, err := l.Lookup(k)
		if !ok || err != nil {
			return out, false, err
		}
		return dec(k, v), true, nil
	}
}

func valueOnly[K, V any](_ K, v V) V { return v }

// NewLookups reads the IPv4 maps m.
func NewLookups(m LookupMaps) *Lookups {
	return &Lookups{
		fam:      ipv4,
		services: lookupWith(m.Services, serviceKey.encode4, valueOnly[ServiceKey, ServiceValue]),
		backends: lookupWith(m.Backends, same[uint32], func(_ uint32, v BackendValue) backendEntry { return decodeBackend4(v) }),
		members:  lookupWith(m.Members, same[MemberKey], valueOnly[MemberKey, uint8]),
		ranges:   lookupWith(m.SourceRanges, rangeKey.encode4, valueOnly[SourceRangeKey, uint8]),
		affinity: lookupWith(m.Affinity, affinityKey.encode4, valueOnly[AffinityKey, AffinityValue]),
		ct:       lookupWith(m.Conntrack, ctKey.encode4, decodeCT4),
		snat:     lookupWith(m.SNATAddrs, same[uint32], func(_ uint32, v SNATAddrValue) netip.Addr { return addrFromBE32(v.Address) }),
		maglev:   m.Maglev,
		hasCT:    m.Conntrack != nil,
		hasSNAT:  m.SNATAddrs != nil,
	}
}

// NewLookups6 reads the IPv6 maps m.
func NewLookups6(m LookupMaps6) *Lookups {
	return &Lookups{
		fam:      ipv6,
		services: lookupWith(m.Services, serviceKey.encode6, valueOnly[Service6Key, ServiceValue]),
		backends: lookupWith(m.Backends, same[uint32], func(_ uint32, v Backend6Value) backendEntry { return decodeBackend6(v) }),
		members:  lookupWith(m.Members, same[MemberKey], valueOnly[MemberKey, uint8]),
		ranges:   lookupWith(m.SourceRanges, rangeKey.encode6, valueOnly[SourceRange6Key, uint8]),
		affinity: lookupWith(m.Affinity, affinityKey.encode6, valueOnly[Affinity6Key, AffinityValue]),
		ct:       lookupWith(m.Conntrack, ctKey.encode6, decodeCT6),
		snat:     lookupWith(m.SNATAddrs, same[uint32], func(_ uint32, v SNAT6AddrValue) netip.Addr { return addrFromBE128(v.Address) }),
		maglev:   m.Maglev,
		hasCT:    m.Conntrack != nil,
		hasSNAT:  m.SNATAddrs != nil,
	}
}

// IPv6 reports whether l reads the IPv6 maps.
func (l *Lookups) IPv6() bool { return l.fam.ipv6 }

// Service returns the entry of fe at slot 0, its master entry.
func (l *Lookups) Service(fe Frontend) (ServiceValue, bool, error) {
	return l.services(fe.key(0))
}

// LookupService finds the master entry a client of scope gets for the
// frontend at addr, port and proto, as lb_lookup_service does: the
// external entry, or the internal one when scope is ScopeInternal and the
// external entry announces it (FlagTwoScopes); the external one again if
// the internal one is missing. The returned Frontend has the scope of the
// entry found.
func (l *Lookups) LookupService(addr netip.Addr, port uint16, proto model.Protocol, scope uint8) (Frontend, ServiceValue, bool, error) {
	fe := Frontend{Addr: addr, Port: port, Proto: proto, Scope: ScopeExternal}
	svc, ok, err := l.Service(fe)
	if !ok || err != nil || scope == ScopeExternal || svc.Flags&FlagTwoScopes == 0 {
		return fe, svc, ok, err
	}
	ife := fe
	ife.Scope = ScopeInternal
	isvc, iok, err := l.Service(ife)
	if err != nil {
		return fe, svc, false, err
	}
	if iok {
		return ife, isvc, true, nil
	}
	return fe, svc, true, nil
}

// Slot returns the backend id slot of fe names.
func (l *Lookups) Slot(fe Frontend, slot uint16) (uint32, bool, error) {
	v, ok, err := l.services(fe.key(slot))
	return v.BackendId, ok, err
}

// Backend returns the backend with id, as a frontend's slot would name
// it (Missing when the backends map lacks it).
func (l *Lookups) Backend(id uint32) (BackendEntry, error) {
	b, ok, err := l.backends(id)
	if err != nil || !ok {
		return BackendEntry{ID: id, Missing: true}, err
	}
	return BackendEntry{ID: id, Addr: b.b.Addr, Port: b.b.Port, Flags: b.flags}, nil
}

// Member reports whether the ServicePort svcID may choose the backend id
// (lb_member_backend's first lookup).
func (l *Lookups) Member(backendID, svcID uint32) (bool, error) {
	_, ok, err := l.members(MemberKey{BackendId: backendID, SvcId: svcID})
	return ok, err
}

// SourceRangeAdmits reports whether a source range of the ServicePort
// svcID holds addr (range_allowed, np_source_allowed).
func (l *Lookups) SourceRangeAdmits(svcID uint32, addr netip.Addr) (bool, error) {
	_, ok, err := l.ranges(rangeKey{svcID: svcID, prefix: netip.PrefixFrom(addr, l.fam.bits())})
	return ok, err
}

// SourceRangeAdmitsNode reports whether the ranges of svcID hold a node
// address, which admits the node's sockets whose source the kernel picks
// (range_node_allowed).
func (l *Lookups) SourceRangeAdmitsNode(svcID uint32) (bool, error) {
	_, ok, err := l.ranges(rangeKey{svcID: svcID | NodeSourceRange})
	return ok, err
}

// AffinityOfAddr returns the session affinity entry of a client outside
// the node, by its address, for the ServicePort svcID (the TC programs'
// entries).
func (l *Lookups) AffinityOfAddr(client netip.Addr, svcID uint32) (AffinityEntry, bool, error) {
	v, ok, err := l.affinity(affinityKey{addr: client, svcID: svcID})
	return AffinityEntry{ClientAddr: client, SvcID: svcID, BackendID: v.BackendId, LastUsedNs: v.LastUsedNs}, ok, err
}

// AffinityOfNetns returns the session affinity entry of the sockets of
// the network namespace cookie for the ServicePort svcID (the socket
// programs' entries).
func (l *Lookups) AffinityOfNetns(cookie uint64, svcID uint32) (AffinityEntry, bool, error) {
	v, ok, err := l.affinity(affinityKey{cookie: cookie, svcID: svcID})
	return AffinityEntry{NetnsCookie: cookie, SvcID: svcID, BackendID: v.BackendId, LastUsedNs: v.LastUsedNs}, ok, err
}

// Conntrack returns the entry a packet from src to dst finds: the
// client-side entry (reply false: src is the client, dst the frontend) or
// a reply entry (src the backend, dst the client or the node's source NAT
// address and port).
func (l *Lookups) Conntrack(src, dst netip.AddrPort, proto model.Protocol, reply bool) (CTEntry, bool, error) {
	k := ctKey{src: src, dst: dst, proto: proto, dir: CTDirOrig}
	if reply {
		k.dir = CTDirReply
	}
	return l.ct(k)
}

// SNATAddr returns the source NAT address the agent gave the device
// ifindex (tc4_snat_addrs_v1, tc6_snat_addrs_v1).
func (l *Lookups) SNATAddr(ifindex uint32) (netip.Addr, bool, error) { return l.snat(ifindex) }

// HasConntrack reports whether the conntrack map was given: whether the
// TC programs ever attached on the node.
func (l *Lookups) HasConntrack() bool { return l.hasCT }

// HasSNATAddrs reports whether the source NAT addresses map was given.
func (l *Lookups) HasSNATAddrs() bool { return l.hasSNAT }

// MaglevBackend returns the backend id the Maglev table of svcID holds for
// a flow of hash (lb_maglev_backend_id), the index it is at and the
// table's size; ok is false without a table.
func (l *Lookups) MaglevBackend(svcID, hash uint32) (id, idx uint32, size int, ok bool, err error) {
	if l.maglev == nil {
		return 0, 0, 0, false, nil
	}
	// The size first, from the table itself: the index depends on it.
	_, size, ok, err = l.maglev.Lookup(svcID, 0)
	if !ok || err != nil || size == 0 {
		return 0, 0, size, false, err
	}
	idx = hash % uint32(size)
	id, _, ok, err = l.maglev.Lookup(svcID, idx)
	return id, idx, size, ok, err
}

// FlowHash is the hash the TC and XDP programs give a flow to pick its
// Maglev slot: flow_hash for IPv4, flow_hash6 for IPv6 (bpf/lib/maglev.h),
// lookup3 over the words as the program loads them from the packet.
func (l *Lookups) FlowHash(src, dst netip.AddrPort, proto model.Protocol) uint32 {
	last := flowWord(be16(src.Port()), be16(dst.Port()), uint8(proto))
	if !l.fam.ipv6 {
		init := lookup3Init + 3*4
		return lookup3Final(be32(src.Addr())+init, be32(dst.Addr())+init, last+init)
	}
	s, d := be128(src.Addr()), be128(dst.Addr())
	a := uint32(lookup3Init + 9*4)
	b, c := a, a
	a += s[0]
	b += s[1]
	c += s[2]
	lookup3Mix(&a, &b, &c)
	a += s[3]
	b += d[0]
	c += d[1]
	lookup3Mix(&a, &b, &c)
	a += d[2]
	b += d[3]
	c += last
	return lookup3Final(a, b, c)
}

// The lookup3 constants and steps of bpf/lib/maglev.h.
const (
	lookup3Init   uint32 = 0xdeadbeef
	lookup3Golden uint32 = 0x9e3779b9
)

func rol32(w uint32, s uint) uint32 { return w<<(s&31) | w>>((-s)&31) }

func lookup3Mix(a, b, c *uint32) {
	*a -= *c
	*a ^= rol32(*c, 4)
	*c += *b
	*b -= *a
	*b ^= rol32(*a, 6)
	*a += *c
	*c -= *b
	*c ^= rol32(*b, 8)
	*b += *a
	*a -= *c
	*a ^= rol32(*c, 16)
	*c += *b
	*b -= *a
	*b ^= rol32(*a, 19)
	*a += *c
	*c -= *b
	*c ^= rol32(*b, 4)
	*b += *a
}

func lookup3Final(a, b, c uint32) uint32 {
	c ^= b
	c -= rol32(b, 14)
	a ^= c
	a -= rol32(c, 11)
	b ^= a
	b -= rol32(a, 25)
	c ^= b
	c -= rol32(b, 16)
	a ^= c
	a -= rol32(c, 4)
	b ^= a
	b -= rol32(a, 14)
	c ^= b
	c -= rol32(b, 24)
	return c
}

// flowWord is flow_word: the ports, in network order as the packet holds
// them, and the protocol.
func flowWord(sport, dport uint16, proto uint8) uint32 {
	return (uint32(sport)<<16 | uint32(dport)) + (uint32(proto) ^ lookup3Golden)
}

// Key encodings of the programs' maps.

func (k affinityKey) encode4() AffinityKey {
	if k.addr.IsValid() {
		return AffinityKey{Client: uint64(be32(k.addr)), SvcId: k.svcID, ClientKind: affinityClientAddr}
	}
	return AffinityKey{Client: k.cookie, SvcId: k.svcID}
}

func (k affinityKey) encode6() Affinity6Key {
	if k.addr.IsValid() {
		// The address's 16 bytes as two words, as np_decide copies them.
		b := k.addr.As16()
		return Affinity6Key{Client: [2]uint64{binary.NativeEndian.Uint64(b[:8]), binary.NativeEndian.Uint64(b[8:])},
			SvcId: k.svcID, ClientKind: affinityClientAddr}
	}
	return Affinity6Key{Client: [2]uint64{k.cookie, 0}, SvcId: k.svcID}
}

func (k ctKey) encode4() CTKey {
	return CTKey{Saddr: be32(k.src.Addr()), Daddr: be32(k.dst.Addr()), Sport: be16(k.src.Port()), Dport: be16(k.dst.Port()),
		Proto: uint8(k.proto), Dir: k.dir}
}

func (k ctKey) encode6() CT6Key {
	return CT6Key{Saddr: be128(k.src.Addr()), Daddr: be128(k.dst.Addr()), Sport: be16(k.src.Port()), Dport: be16(k.dst.Port()),
		Proto: uint8(k.proto), Dir: k.dir}
}

// FakeProgramMaps are in-memory stand-ins for the maps the programs fill
// (affinity, conntrack, source NAT addresses), for tests of code that reads
// them through Lookups; Fakes stand for the Writer's.
type FakeProgramMaps struct {
	Affinity  *FakeMap[AffinityKey, AffinityValue]
	Conntrack *FakeMap[CTKey, CTValue]
	SNATAddrs *FakeMap[uint32, SNATAddrValue]
}

// NewFakeProgramMaps returns empty fakes.
func NewFakeProgramMaps() *FakeProgramMaps {
	return &FakeProgramMaps{Affinity: NewFakeMap[AffinityKey, AffinityValue](0), Conntrack: NewFakeMap[CTKey, CTValue](0),
		SNATAddrs: NewFakeMap[uint32, SNATAddrValue](0)}
}

// PutAffinity records that the client (an address from outside, or else
// the network namespace cookie) last used backendID for svcID at
// lastUsedNs, as lb_affinity_record does.
func (f *FakeProgramMaps) PutAffinity(client netip.Addr, cookie uint64, svcID, backendID uint32, lastUsedNs uint64) {
	_ = f.Affinity.Put(affinityKey{addr: client, cookie: cookie, svcID: svcID}.encode4(), AffinityValue{LastUsedNs: lastUsedNs, BackendId: backendID})
}

// PutSNATAddr gives the device ifindex the source NAT address a, as the
// loader does.
func (f *FakeProgramMaps) PutSNATAddr(ifindex uint32, a netip.Addr) {
	_ = f.SNATAddrs.Put(ifindex, SNATAddrValue{Address: be32(a)})
}

// PutFlow records a flow's client-side entry as np_record does: from
// client to frontend, translated to backend (id backendID of svcID), under
// source NAT to snat when it is valid, expiring at the second expires.
func (f *FakeProgramMaps) PutFlow(proto model.Protocol, client, frontend, backend, snat netip.AddrPort, backendID, svcID, expires uint32) {
	v := CTValue{NatDaddr: be32(backend.Addr()), NatDport: be16(backend.Port()), BackendId: backendID, SvcId: svcID, Expires: expires}
	if snat.IsValid() {
		v.NatSaddr, v.NatSport, v.Flags = be32(snat.Addr()), be16(snat.Port()), CTFlagSNAT
	}
	_ = f.Conntrack.Put(ctKey{src: client, dst: frontend, proto: proto, dir: CTDirOrig}.encode4(), v)
}

// Lookups reads the fakes f and p (IPv4).
func (f *Fakes) Lookups(p *FakeProgramMaps) *Lookups {
	m := LookupMaps{Services: f.Services, Backends: f.Backends, Members: f.Members, SourceRanges: f.Ranges, Maglev: f.Maglev}
	if p != nil {
		m.Affinity, m.Conntrack, m.SNATAddrs = p.Affinity, p.Conntrack, p.SNATAddrs
	}
	return NewLookups(m)
}
