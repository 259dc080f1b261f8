package maps

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// The readers below give the maps the programs fill (connection tracking,
// session affinity) and the Writer's Maglev tables and source ranges in
// structured form, for `ebpf-proxy dump`. They only iterate: nothing here
// writes a map.

// Reader is the part of a map the readers need: a Map, a FakeMap or a
// kernel map opened read-only (FromKernel).
type Reader[K comparable, V any] interface {
	Iterate(fn func(K, V) bool) error
}

// Generated types of the programs' own maps.
type (
	// CTKey mirrors struct ct4_key, CTValue struct ct4_entry.
	CTKey   = bpfobj.TcCt4Key
	CTValue = bpfobj.TcCt4Entry
	// CT6Key mirrors struct ct6_key, CT6Value struct ct6_entry.
	CT6Key   = bpfobj.TcCt6Key
	CT6Value = bpfobj.TcCt6Entry
	// AffinityKey mirrors struct lb4_affinity_key, Affinity6Key struct
	// lb6_affinity_key; AffinityValue struct lb4_affinity (both families).
	AffinityKey   = bpfobj.SockLb4AffinityKey
	Affinity6Key  = bpfobj.SockLb6AffinityKey
	AffinityValue = bpfobj.SockLb4Affinity
)

// Directions of a conntrack entry's key (CT_DIR_*).
const (
	CTDirOrig  uint8 = 0
	CTDirReply uint8 = 1
)

// Flags of a conntrack entry (CT_F_*).
const (
	CTFlagSNAT           uint16 = 1 << 0
	CTFlagClosing        uint16 = 1 << 1
	CTFlagFinOrig        uint16 = 1 << 2
	CTFlagFinReply       uint16 = 1 << 3
	CTFlagFinReplyFirst  uint16 = 1 << 4
	CTFlagClosed         uint16 = 1 << 5
	CTFlagSynWait        uint16 = 1 << 6
	CTFlagUDPReplied     uint16 = 1 << 7
	CTFlagUDPStream      uint16 = 1 << 8
	CTFlagReplyClosing   uint16 = 1 << 9
	CTFlagPod            uint16 = 1 << 10
	ctFlagNamesKnownMask uint16 = 1<<11 - 1
	// affinityClientAddr is AFFINITY_CLIENT_ADDR (else a netns cookie).
	affinityClientAddr uint8 = 1
)

var ctFlagNames = []struct {
	f    uint16
	name string
}{
	{CTFlagSNAT, "snat"},
	{CTFlagClosing, "closing"},
	{CTFlagFinOrig, "fin-orig"},
	{CTFlagFinReply, "fin-reply"},
	{CTFlagFinReplyFirst, "fin-reply-first"},
	{CTFlagClosed, "closed"},
	{CTFlagSynWait, "syn-wait"},
	{CTFlagUDPReplied, "replied"},
	{CTFlagUDPStream, "stream"},
	{CTFlagReplyClosing, "reply-closing"},
	{CTFlagPod, "pod"},
}

// CTFlagNames spells a conntrack entry's flags ("snat,closing", "-" for
// none; unknown bits in hex).
func CTFlagNames(f uint16) string {
	var s string
	for _, n := range ctFlagNames {
		if f&n.f != 0 {
			s += "," + n.name
		}
	}
	if rest := f &^ ctFlagNamesKnownMask; rest != 0 {
		s += fmt.Sprintf(",%#x", rest)
	}
	if s == "" {
		return "-"
	}
	return s[1:]
}

// CTEntry is one entry of tc4_ct_v1 or tc6_ct_v1, with its addresses put
// back in the flow's terms whichever direction the key is in.
type CTEntry struct {
	// Reply is set for the entry keyed by the backend's answer
	// (CT_DIR_REPLY), clear for the one keyed by the client's packets.
	Reply bool
	Proto model.Protocol
	// Client is the flow's client, Frontend the Service address it sent
	// to, Backend the endpoint it is translated to (zero when the entry
	// does not say: a reply entry names its backend by id only).
	Client, Frontend, Backend netip.AddrPort
	// SNAT is the node's address and port the client's packets leave with
	// under source NAT (CT_F_SNAT), zero without.
	SNAT             netip.AddrPort
	BackendID, SvcID uint32
	// Expires is the second of CLOCK_MONOTONIC after which the entry no
	// longer holds its flow; Born the low 16 bits of the second it was
	// made in.
	Expires uint32
	Born    uint16
	Flags   uint16
}

func ctEntry(saddr, daddr netip.Addr, sport, dport uint16, proto, dir uint8,
	natS, natD netip.Addr, natSport, natDport uint16, v CTValue) CTEntry {
	e := CTEntry{Reply: dir == CTDirReply, Proto: model.Protocol(proto), BackendID: v.BackendId, SvcID: v.SvcId,
		Expires: v.Expires, Born: v.Born, Flags: v.Flags}
	src := netip.AddrPortFrom(saddr, portFromBE16(sport))
	dst := netip.AddrPortFrom(daddr, portFromBE16(dport))
	ns := netip.AddrPortFrom(natS, portFromBE16(natSport))
	nd := netip.AddrPortFrom(natD, portFromBE16(natDport))
	if !e.Reply {
		// The client's packets: to the frontend, rewritten to the
		// backend and, under source NAT, from the node.
		e.Client, e.Frontend, e.Backend = src, dst, nd
		if v.Flags&CTFlagSNAT != 0 {
			e.SNAT = ns
		}
		return e
	}
	// The backend's answer: to the client, or to the node under source
	// NAT, rewritten to come from the frontend and go back to the client.
	e.Backend, e.Frontend, e.Client = src, ns, dst
	if v.Flags&CTFlagSNAT != 0 {
		e.SNAT, e.Client = dst, nd
	}
	return e
}

// ReadConntrack reads the IPv4 conntrack entries, sorted by client,
// frontend and direction.
func ReadConntrack(m Reader[CTKey, CTValue]) ([]CTEntry, error) {
	var out []CTEntry
	err := m.Iterate(func(k CTKey, v CTValue) bool {
		out = append(out, decodeCT4(k, v))
		return true
	})
	sortCT(out)
	return out, err
}

// ReadConntrack6 is ReadConntrack for the IPv6 entries.
func ReadConntrack6(m Reader[CT6Key, CT6Value]) ([]CTEntry, error) {
	var out []CTEntry
	err := m.Iterate(func(k CT6Key, v CT6Value) bool {
		out = append(out, decodeCT6(k, v))
		return true
	})
	sortCT(out)
	return out, err
}

// decodeCT4 is an IPv4 connection tracking entry as CTEntry.
func decodeCT4(k CTKey, v CTValue) CTEntry {
	return ctEntry(addrFromBE32(k.Saddr), addrFromBE32(k.Daddr), k.Sport, k.Dport, k.Proto, k.Dir,
		addrFromBE32(v.NatSaddr), addrFromBE32(v.NatDaddr), v.NatSport, v.NatDport, v)
}

// decodeCT6 is an IPv6 connection tracking entry as CTEntry; the fields
// both families share are read as an IPv4 entry's.
func decodeCT6(k CT6Key, v CT6Value) CTEntry {
	v4 := CTValue{BackendId: v.BackendId, SvcId: v.SvcId, Expires: v.Expires, Born: v.Born, Flags: v.Flags}
	return ctEntry(addrFromBE128(k.Saddr), addrFromBE128(k.Daddr), k.Sport, k.Dport, k.Proto, k.Dir,
		addrFromBE128(v.NatSaddr), addrFromBE128(v.NatDaddr), v.NatSport, v.NatDport, v4)
}

func sortCT(es []CTEntry) {
	slices.SortFunc(es, func(a, b CTEntry) int {
		return cmp.Or(a.Client.Compare(b.Client), a.Frontend.Compare(b.Frontend), cmp.Compare(a.Proto, b.Proto),
			boolCompare(a.Reply, b.Reply))
	})
}

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// AffinityEntry is one entry of lb4_affinity_v1 or lb6_affinity_v1: the
// backend a client last used for a ServicePort, and when.
type AffinityEntry struct {
	// ClientAddr is the client's address for traffic from outside (TC);
	// otherwise the client is the network namespace NetnsCookie of the
	// sockets (the socket programs).
	ClientAddr  netip.Addr
	NetnsCookie uint64
	SvcID       uint32
	BackendID   uint32
	// LastUsedNs is bpf_ktime_get_ns() (CLOCK_MONOTONIC) of its last use.
	LastUsedNs uint64
}

// ReadAffinity reads the IPv4 session affinity entries, sorted by
// ServicePort id and client.
func ReadAffinity(m Reader[AffinityKey, AffinityValue]) ([]AffinityEntry, error) {
	var out []AffinityEntry
	err := m.Iterate(func(k AffinityKey, v AffinityValue) bool {
		e := AffinityEntry{SvcID: k.SvcId, BackendID: v.BackendId, LastUsedNs: v.LastUsedNs}
		if k.ClientKind == affinityClientAddr {
			e.ClientAddr = addrFromBE32(uint32(k.Client))
		} else {
			e.NetnsCookie = k.Client
		}
		out = append(out, e)
		return true
	})
	sortAffinity(out)
	return out, err
}

// ReadAffinity6 is ReadAffinity for the IPv6 entries.
func ReadAffinity6(m Reader[Affinity6Key, AffinityValue]) ([]AffinityEntry, error) {
	var out []AffinityEntry
	err := m.Iterate(func(k Affinity6Key, v AffinityValue) bool {
		e := AffinityEntry{SvcID: k.SvcId, BackendID: v.BackendId, LastUsedNs: v.LastUsedNs}
		if k.ClientKind == affinityClientAddr {
			var w [4]uint32
			w[0], w[1] = uint32(k.Client[0]), uint32(k.Client[0]>>32)
			w[2], w[3] = uint32(k.Client[1]), uint32(k.Client[1]>>32)
			e.ClientAddr = addrFromBE128(w)
		} else {
			e.NetnsCookie = k.Client[0]
		}
		out = append(out, e)
		return true
	})
	sortAffinity(out)
	return out, err
}

func sortAffinity(es []AffinityEntry) {
	slices.SortFunc(es, func(a, b AffinityEntry) int {
		return cmp.Or(cmp.Compare(a.SvcID, b.SvcID), a.ClientAddr.Compare(b.ClientAddr), cmp.Compare(a.NetnsCookie, b.NetnsCookie))
	})
}

// SourceRangeEntry is one entry of a source ranges trie: a
// loadBalancerSourceRanges CIDR of the ServicePort SvcID, or (Node) the
// entry that admits the node's own sockets.
type SourceRangeEntry struct {
	SvcID  uint32
	Node   bool
	Prefix netip.Prefix
}

// ReadSourceRanges reads the IPv4 source ranges trie (nil: none), sorted by
// ServicePort id and prefix.
func ReadSourceRanges(m Maps) ([]SourceRangeEntry, error) { return readRanges(m.coded()) }

// ReadSourceRanges6 is ReadSourceRanges for the IPv6 trie.
func ReadSourceRanges6(m Maps6) ([]SourceRangeEntry, error) {
	if m.Services == nil {
		return nil, nil
	}
	return readRanges(m.coded())
}

func readRanges(m familyMaps) ([]SourceRangeEntry, error) {
	if m.ranges == nil {
		return nil, nil
	}
	var keys []rangeKey
	err := m.ranges.Iterate(func(k rangeKey, _ uint8) bool {
		keys = append(keys, k)
		return true
	})
	slices.SortFunc(keys, compareRangeKeys)
	out := make([]SourceRangeEntry, 0, len(keys))
	for _, k := range keys {
		e := SourceRangeEntry{SvcID: k.svcID &^ NodeSourceRange, Node: k.svcID&NodeSourceRange != 0}
		if !e.Node {
			e.Prefix = k.prefix
		}
		out = append(out, e)
	}
	return out, err
}

// MaglevReader reads a family's Maglev tables.
type MaglevReader interface {
	// ReadTables calls fn with every ServicePort id and its table.
	ReadTables(fn func(svcID uint32, table []uint32) bool) error
}

// MaglevEntry is one Maglev table: its ServicePort, its size and how many
// slots each backend id holds.
type MaglevEntry struct {
	SvcID uint32
	Size  int
	Slots map[uint32]int
}

// ReadMaglev reads every table, sorted by ServicePort id.
func ReadMaglev(m MaglevReader) ([]MaglevEntry, error) {
	var out []MaglevEntry
	err := m.ReadTables(func(id uint32, table []uint32) bool {
		e := MaglevEntry{SvcID: id, Size: len(table), Slots: map[uint32]int{}}
		for _, b := range table {
			e.Slots[b]++
		}
		out = append(out, e)
		return true
	})
	slices.SortFunc(out, func(a, b MaglevEntry) int { return cmp.Compare(a.SvcID, b.SvcID) })
	return out, err
}

// ReadTables implements MaglevReader.
func (f *FakeMaglev) ReadTables(fn func(uint32, []uint32) bool) error {
	for id, t := range f.Tables {
		if !fn(id, t) {
			return nil
		}
	}
	return nil
}

// KernelMaglevReader reads the Maglev tables of a pinned lb4_maglev_v1 or
// lb6_maglev_v1 (a hash of arrays keyed by ServicePort id).
func KernelMaglevReader(outer *ebpf.Map) MaglevReader { return kernelMaglevReader{outer} }

type kernelMaglevReader struct{ outer *ebpf.Map }

func (k kernelMaglevReader) ReadTables(fn func(uint32, []uint32) bool) error {
	var (
		id      uint32
		innerID ebpf.MapID
	)
	ids := map[uint32]ebpf.MapID{}
	it := k.outer.Iterate()
	for it.Next(&id, &innerID) {
		ids[id] = innerID
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", k.outer, err)
	}
	for id, innerID := range ids {
		inner, err := ebpf.NewMapFromID(innerID)
		if err != nil {
			// Replaced since: the writer swapped in a new table.
			continue
		}
		table, err := readArray(inner)
		inner.Close()
		if err != nil {
			return err
		}
		if !fn(id, table) {
			return nil
		}
	}
	return nil
}

func readArray(m *ebpf.Map) ([]uint32, error) {
	table := make([]uint32, m.MaxEntries())
	var (
		i uint32
		v uint32
	)
	it := m.Iterate()
	for it.Next(&i, &v) {
		if int(i) < len(table) {
			table[i] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", m, err)
	}
	return table, nil
}
