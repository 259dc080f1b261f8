package maps

import (
	"encoding/binary"
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// The Writer is written once for both address families. It plans in terms
// of frontends, backends and prefixes (netip values, the same for IPv4 and
// IPv6), and a family's encoding turns them into the layouts of its maps at
// the boundary: the coded maps below wrap the kernel's (or a fake's) maps
// of one family. Only the encoding differs between the families; the
// planning, its order and the ids are one code.

// IPv6 map key and value types, generated from bpf/lib/structs.h.
type (
	// Service6Key mirrors struct lb6_key.
	Service6Key = bpfobj.SockLb6Key
	// Backend6Value mirrors struct lb6_backend.
	Backend6Value = bpfobj.SockLb6Backend
	// RevNat6Value mirrors struct lb6_reverse_nat.
	RevNat6Value = bpfobj.SockLb6ReverseNat
	// SourceRange6Key mirrors struct lb6_src_range_key.
	SourceRange6Key = bpfobj.SockLb6SrcRangeKey
)

// Maps6 are the IPv6 maps a Writer made by NewWriter6 programs: the same
// as Maps, in the IPv6 layouts.
type Maps6 struct {
	Services Map[Service6Key, ServiceValue]
	Backends Map[uint32, Backend6Value]
	RevNat   Map[uint32, RevNat6Value]
	Members  Map[MemberKey, uint8]
	// Maglev holds the Maglev tables of the IPv6 ServicePorts that use
	// Maglev for external traffic (lb6_maglev_v1, keyed by the IPv6
	// writer's ids); nil when the dataplane has none.
	Maglev MaglevTables
	// SourceRanges holds the IPv6 loadBalancerSourceRanges; nil leaves
	// them unwritten.
	SourceRanges Map[SourceRange6Key, uint8]
	// PortFilter is lb6_ext_ports_v1 (see Maps.PortFilter).
	PortFilter Map[uint32, uint32]
	// RemovedAt is lb_removed_at_v1 (see Maps.RemovedAt); the IPv6
	// Writer stamps RemovedAtIPv6.
	RemovedAt Map[uint32, uint32]
}

// KernelMaps6 wraps the loaded IPv6 maps of the socket programs. A nil
// services map (a dump of maps an agent older than IPv6 pinned) gives nil
// maps throughout.
func KernelMaps6(m *bpfobj.SockMaps) Maps6 {
	if m.Lb6ServicesV1 == nil {
		return Maps6{}
	}
	km := Maps6{
		Services: FromKernel[Service6Key, ServiceValue](m.Lb6ServicesV1),
		Backends: FromKernel[uint32, Backend6Value](m.Lb6BackendsV1),
		RevNat:   FromKernel[uint32, RevNat6Value](m.Lb6RevnatV1),
		Members:  FromKernel[MemberKey, uint8](m.Lb6MembersV1),
	}
	if m.Lb6SourceRangesV1 != nil {
		km.SourceRanges = FromKernel[SourceRange6Key, uint8](m.Lb6SourceRangesV1)
	}
	if m.Lb6ExtPortsV1 != nil {
		km.PortFilter = FromKernel[uint32, uint32](m.Lb6ExtPortsV1)
	}
	if m.LbRemovedAtV1 != nil {
		km.RemovedAt = FromKernel[uint32, uint32](m.LbRemovedAtV1)
	}
	return km
}

// family is the address family a Writer programs.
type family struct{ ipv6 bool }

var (
	ipv4 = family{}
	ipv6 = family{ipv6: true}
)

// holds says whether a is an address of the family. An IPv4-mapped IPv6
// address is neither: the model never has one.
func (f family) holds(a netip.Addr) bool {
	if f.ipv6 {
		return a.Is6() && !a.Is4In6()
	}
	return a.Is4()
}

// bits is the length of the family's addresses.
func (f family) bits() int {
	if f.ipv6 {
		return 128
	}
	return 32
}

// serviceKey is an entry of the services map: a frontend and a slot (0 for
// the master entry).
type serviceKey struct {
	fe   Frontend
	slot uint16
}

// backendEntry is a value of the backends map.
type backendEntry struct {
	b     Backend
	flags uint8
}

// rangeKey is an entry of the source ranges trie: a ServicePort's range,
// or (svcID with NodeSourceRange, no prefix) the node's entry.
type rangeKey struct {
	svcID  uint32
	prefix netip.Prefix
}

// familyMaps are a family's maps, coded: what the Writer reads and writes.
type familyMaps struct {
	services Map[serviceKey, ServiceValue]
	backends Map[uint32, backendEntry]
	revNat   Map[uint32, netip.AddrPort]
	members  Map[MemberKey, uint8]
	// maglev is nil without Maglev tables, ranges nil without the trie.
	maglev MaglevTables
	ranges Map[rangeKey, uint8]
	// ports is the port filter; nil leaves it unwritten.
	ports Map[uint32, uint32]
	// removedAt is the removal stamps' map (nil: none), removedKey this
	// family's entry in it.
	removedAt  Map[uint32, uint32]
	removedKey uint32
}

// codedMap is a Map of the Writer's values over a Map of a family's
// layouts. Batches are encoded into buffers it keeps.
type codedMap[N comparable, NV any, K comparable, V any] struct {
	m      Map[K, V]
	encKey func(N) K
	decKey func(K) N
	encVal func(NV) V
	decVal func(V) NV
	keys   []K
	vals   []V
}

func coded[N comparable, NV any, K comparable, V any](m Map[K, V], encKey func(N) K, decKey func(K) N, encVal func(NV) V, decVal func(V) NV) Map[N, NV] {
	return &codedMap[N, NV, K, V]{m: m, encKey: encKey, decKey: decKey, encVal: encVal, decVal: decVal}
}

func same[T any](v T) T { return v }

func (c *codedMap[N, NV, K, V]) Put(k N, v NV) error { return c.m.Put(c.encKey(k), c.encVal(v)) }

func (c *codedMap[N, NV, K, V]) Delete(k N) error { return c.m.Delete(c.encKey(k)) }

func (c *codedMap[N, NV, K, V]) PutBatch(ks []N, vs []NV) (int, error) {
	c.keys, c.vals = c.keys[:0], c.vals[:0]
	for i := range ks {
		c.keys = append(c.keys, c.encKey(ks[i]))
		c.vals = append(c.vals, c.encVal(vs[i]))
	}
	return c.m.PutBatch(c.keys, c.vals)
}

func (c *codedMap[N, NV, K, V]) DeleteBatch(ks []N) (int, error) {
	c.keys = c.keys[:0]
	for _, k := range ks {
		c.keys = append(c.keys, c.encKey(k))
	}
	return c.m.DeleteBatch(c.keys)
}

func (c *codedMap[N, NV, K, V]) Iterate(fn func(N, NV) bool) error {
	return c.m.Iterate(func(k K, v V) bool { return fn(c.decKey(k), c.decVal(v)) })
}

// coded returns the IPv4 maps, coded.
func (m Maps) coded() familyMaps {
	fm := familyMaps{
		services: coded(m.Services, serviceKey.encode4, decodeServiceKey4, same[ServiceValue], same[ServiceValue]),
		backends: coded(m.Backends, same[uint32], same[uint32], backendEntry.encode4, decodeBackend4),
		revNat:   coded(m.RevNat, same[uint32], same[uint32], encodeRevNat4, decodeRevNat4),
		members:  m.Members,
		maglev:   m.Maglev,
		ports:    m.PortFilter,

		removedAt:  m.RemovedAt,
		removedKey: RemovedAtIPv4,
	}
	if m.SourceRanges != nil {
		fm.ranges = coded(m.SourceRanges, rangeKey.encode4, decodeRangeKey4, same[uint8], same[uint8])
	}
	return fm
}

// coded returns the IPv6 maps, coded.
func (m Maps6) coded() familyMaps {
	fm := familyMaps{
		services: coded(m.Services, serviceKey.encode6, decodeServiceKey6, same[ServiceValue], same[ServiceValue]),
		backends: coded(m.Backends, same[uint32], same[uint32], backendEntry.encode6, decodeBackend6),
		revNat:   coded(m.RevNat, same[uint32], same[uint32], encodeRevNat6, decodeRevNat6),
		members:  m.Members,
		maglev:   m.Maglev,
		ports:    m.PortFilter,

		removedAt:  m.RemovedAt,
		removedKey: RemovedAtIPv6,
	}
	if m.SourceRanges != nil {
		fm.ranges = coded(m.SourceRanges, rangeKey.encode6, decodeRangeKey6, same[uint8], same[uint8])
	}
	return fm
}

// IPv4 layouts.

func (k serviceKey) encode4() ServiceKey {
	return ServiceKey{Address: be32(k.fe.Addr), Dport: be16(k.fe.Port), Slot: k.slot, Proto: uint8(k.fe.Proto), Scope: k.fe.Scope}
}

func decodeServiceKey4(k ServiceKey) serviceKey {
	return serviceKey{Frontend{Addr: addrFromBE32(k.Address), Port: portFromBE16(k.Dport), Proto: model.Protocol(k.Proto), Scope: k.Scope}, k.Slot}
}

func (e backendEntry) encode4() BackendValue {
	return BackendValue{Address: be32(e.b.Addr), Port: be16(e.b.Port), Proto: uint8(e.b.Proto), Flags: e.flags}
}

func decodeBackend4(v BackendValue) backendEntry {
	return backendEntry{Backend{Addr: addrFromBE32(v.Address), Port: portFromBE16(v.Port), Proto: model.Protocol(v.Proto)}, v.Flags}
}

func encodeRevNat4(ap netip.AddrPort) RevNatValue {
	return RevNatValue{Address: be32(ap.Addr()), Port: be16(ap.Port())}
}

func decodeRevNat4(v RevNatValue) netip.AddrPort {
	return netip.AddrPortFrom(addrFromBE32(v.Address), portFromBE16(v.Port))
}

func (k rangeKey) encode4() SourceRangeKey {
	if k.svcID&NodeSourceRange != 0 {
		return SourceRangeKey{Prefixlen: 64, SvcId: k.svcID}
	}
	return SourceRangeKey{Prefixlen: 32 + uint32(k.prefix.Bits()), SvcId: k.svcID, Address: be32(k.prefix.Addr())}
}

func decodeRangeKey4(k SourceRangeKey) rangeKey {
	if k.SvcId&NodeSourceRange != 0 {
		return rangeKey{svcID: k.SvcId}
	}
	return rangeKey{k.SvcId, netip.PrefixFrom(addrFromBE32(k.Address), int(k.Prefixlen)-32)}
}

// IPv6 layouts.

func (k serviceKey) encode6() Service6Key {
	return Service6Key{Address: be128(k.fe.Addr), Dport: be16(k.fe.Port), Slot: k.slot, Proto: uint8(k.fe.Proto), Scope: k.fe.Scope}
}

func decodeServiceKey6(k Service6Key) serviceKey {
	return serviceKey{Frontend{Addr: addrFromBE128(k.Address), Port: portFromBE16(k.Dport), Proto: model.Protocol(k.Proto), Scope: k.Scope}, k.Slot}
}

func (e backendEntry) encode6() Backend6Value {
	return Backend6Value{Address: be128(e.b.Addr), Port: be16(e.b.Port), Proto: uint8(e.b.Proto), Flags: e.flags}
}

func decodeBackend6(v Backend6Value) backendEntry {
	return backendEntry{Backend{Addr: addrFromBE128(v.Address), Port: portFromBE16(v.Port), Proto: model.Protocol(v.Proto)}, v.Flags}
}

func encodeRevNat6(ap netip.AddrPort) RevNat6Value {
	return RevNat6Value{Address: be128(ap.Addr()), Port: be16(ap.Port())}
}

func decodeRevNat6(v RevNat6Value) netip.AddrPort {
	return netip.AddrPortFrom(addrFromBE128(v.Address), portFromBE16(v.Port))
}

func (k rangeKey) encode6() SourceRange6Key {
	if k.svcID&NodeSourceRange != 0 {
		return SourceRange6Key{Prefixlen: 160, SvcId: k.svcID}
	}
	return SourceRange6Key{Prefixlen: 32 + uint32(k.prefix.Bits()), SvcId: k.svcID, Address: be128(k.prefix.Addr())}
}

func decodeRangeKey6(k SourceRange6Key) rangeKey {
	if k.SvcId&NodeSourceRange != 0 {
		return rangeKey{svcID: k.SvcId}
	}
	return rangeKey{k.SvcId, netip.PrefixFrom(addrFromBE128(k.Address), int(k.Prefixlen)-32)}
}

// be128 returns the host integers whose bytes are a's in network order: a
// __be32[4] in C.
func be128(a netip.Addr) [4]uint32 {
	b := a.As16()
	var out [4]uint32
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return out
}

// addrFromBE128 inverts be128.
func addrFromBE128(v [4]uint32) netip.Addr {
	var b [16]byte
	for i, w := range v {
		binary.NativeEndian.PutUint32(b[4*i:], w)
	}
	return netip.AddrFrom16(b)
}
