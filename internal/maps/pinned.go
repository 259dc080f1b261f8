package maps

import (
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// ReadConntrackMap reads a pinned connection tracking map of either
// family (tc4_ct_v1 or tc6_ct_v1), which its key's size tells apart.
func ReadConntrackMap(m *ebpf.Map) ([]CTEntry, error) {
	switch m.KeySize() {
	case uint32(unsafe.Sizeof(CTKey{})):
		return ReadConntrack(FromKernel[CTKey, CTValue](m))
	case uint32(unsafe.Sizeof(CT6Key{})):
		return ReadConntrack6(FromKernel[CT6Key, CT6Value](m))
	}
	return nil, fmt.Errorf("connection tracking map with %d-byte keys: neither family's layout", m.KeySize())
}

// ReadAffinityMap reads a pinned session affinity map of either family
// (lb4_affinity_v1 or lb6_affinity_v1), which its key's size tells apart.
func ReadAffinityMap(m *ebpf.Map) ([]AffinityEntry, error) {
	switch m.KeySize() {
	case uint32(unsafe.Sizeof(AffinityKey{})):
		return ReadAffinity(FromKernel[AffinityKey, AffinityValue](m))
	case uint32(unsafe.Sizeof(Affinity6Key{})):
		return ReadAffinity6(FromKernel[Affinity6Key, AffinityValue](m))
	}
	return nil, fmt.Errorf("session affinity map with %d-byte keys: neither family's layout", m.KeySize())
}

// PinnedTC are the maps of the TC programs a family's lookups read besides
// the socket programs' (nil where not pinned: no TC program ran).
type PinnedTC struct {
	Affinity, Conntrack, SNATAddrs, Maglev *ebpf.Map
}

// KernelLookups are the lookups of one family, as the programs do them,
// over pinned maps: the socket programs' sm and the TC programs' tc, of
// the family ipv6 says.
func KernelLookups(sm *bpfobj.SockMaps, tc PinnedTC, ipv6 bool) (*Lookups, error) {
	if !ipv6 {
		return NewLookups(LookupMaps{
			Services: KernelLooker[ServiceKey, ServiceValue](sm.Lb4ServicesV1),
			Backends: KernelLooker[uint32, BackendValue](sm.Lb4BackendsV1),
			Members:  KernelLooker[MemberKey, uint8](sm.Lb4MembersV1),
			// The socket programs' trie; nil when an older agent
			// pinned none.
			SourceRanges: KernelLooker[SourceRangeKey, uint8](sm.Lb4SourceRangesV1),
			Affinity:     KernelLooker[AffinityKey, AffinityValue](tc.Affinity),
			Conntrack:    KernelLooker[CTKey, CTValue](tc.Conntrack),
			SNATAddrs:    KernelLooker[uint32, SNATAddrValue](tc.SNATAddrs),
			Maglev:       KernelMaglevLooker(tc.Maglev),
		}), nil
	}
	if sm.Lb6ServicesV1 == nil {
		return nil, fmt.Errorf("no IPv6 maps pinned: the agent that pinned these maps is older than IPv6")
	}
	return NewLookups6(LookupMaps6{
		Services:     KernelLooker[Service6Key, ServiceValue](sm.Lb6ServicesV1),
		Backends:     KernelLooker[uint32, Backend6Value](sm.Lb6BackendsV1),
		Members:      KernelLooker[MemberKey, uint8](sm.Lb6MembersV1),
		SourceRanges: KernelLooker[SourceRange6Key, uint8](sm.Lb6SourceRangesV1),
		Affinity:     KernelLooker[Affinity6Key, AffinityValue](tc.Affinity),
		Conntrack:    KernelLooker[CT6Key, CT6Value](tc.Conntrack),
		SNATAddrs:    KernelLooker[uint32, SNAT6AddrValue](tc.SNATAddrs),
		Maglev:       KernelMaglevLooker(tc.Maglev),
	}), nil
}
