package loader

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// DefaultLRUMemoryRatio is the share of the node's memory that the LRU maps
// of the families the node has addresses of take, where no flag sizes
// them: connection tracking, socket reverse NAT and UDP forwarding, and
// session affinity, which the kernel preallocates whole. Cilium's
// default dynamic size ratio is the same.
const DefaultLRUMemoryRatio = 0.0025

// Bounds of an automatically sized LRU map, in entries.
const (
	// MinLRUEntries is the least a family the node has addresses of
	// gets: 8,192 flows from outside, as many connected sockets.
	MinLRUEntries = 1 << 14
	// MaxLRUEntries is the most any LRU map gets from the ratio (twice
	// the fixed size of earlier versions): the LRU maps of one family then
	// take at most 230 MiB, which the DaemonSet's memory limit must
	// cover. Larger maps take the flags.
	MaxLRUEntries = 1 << 19
	// UnaddressedLRUEntries is what each LRU map of a family the node
	// has no address of gets: it is served (as kube-proxy serves both
	// families), but no pod or client of that family is expected.
	UnaddressedLRUEntries = 1 << 12
)

// UnaddressedSizes are the capacities of the hash maps of a family the
// node has no address of, where no flag sizes them: about 1,500 Services
// of 10 endpoints. These maps are not preallocated, so the capacity costs
// only the hash buckets (16 bytes an entry).
var UnaddressedSizes = FamilySizes{Services: 1 << 14, Backends: 1 << 14, RevNat: 1 << 12}

// CheckLRUMemoryRatio checks a share of the node's memory for the LRU maps
// (--bpf-map-dynamic-size-ratio): more than 0, at most half.
func CheckLRUMemoryRatio(r float64) error {
	if !(r > 0 && r <= 0.5) {
		return fmt.Errorf("LRU memory ratio %g: want more than 0 and at most 0.5", r)
	}
	return nil
}

// SizeInput is what the automatic sizes follow.
type SizeInput struct {
	// NodeMemory is the node's memory in bytes (NodeMemory()).
	NodeMemory uint64
	// Ratio is the share of NodeMemory for the LRU maps; 0 means
	// DefaultLRUMemoryRatio.
	Ratio float64
	// IPv4 and IPv6 say whether the node has addresses of the family.
	// With neither, IPv4 is taken.
	IPv4, IPv6 bool
}

// AutoSizes returns the capacities of every map: those flags and
// conntrack (the agent's flags, which apply to both families) give, and
// for the others (zero), sizes that follow in. The hash maps only the
// agent writes take DefaultMapSizes, or UnaddressedSizes for a family the
// node has no address of; the LRU maps of the families the node has
// addresses of share in.Ratio of its memory (bounded by MinLRUEntries and
// MaxLRUEntries), the others take UnaddressedLRUEntries. The second result
// is the IPv4 connection tracking map's capacity; the IPv6 one is in
// IPv6.Conntrack.
func AutoSizes(flags MapSizes, conntrack uint32, in SizeInput) (MapSizes, uint32, error) {
	if !in.IPv4 && !in.IPv6 {
		in.IPv4 = true
	}
	ratio := in.Ratio
	if ratio == 0 {
		ratio = DefaultLRUMemoryRatio
	}
	if err := CheckLRUMemoryRatio(ratio); err != nil {
		return MapSizes{}, 0, err
	}
	unit := lruUnitBytes()
	var perUnit uint64
	if in.IPv4 {
		perUnit += unit[0]
	}
	if in.IPv6 {
		perUnit += unit[1]
	}
	lru := lruEntries(uint64(float64(in.NodeMemory)*ratio) / perUnit)
	fam := func(addressed bool) FamilySizes {
		if !addressed {
			return FamilySizes{Services: UnaddressedSizes.Services, Backends: UnaddressedSizes.Backends, RevNat: UnaddressedSizes.RevNat,
				SockRevNat: UnaddressedLRUEntries, Affinity: UnaddressedLRUEntries, Conntrack: UnaddressedLRUEntries}
		}
		return FamilySizes{Services: DefaultMapSizes.Services, Backends: DefaultMapSizes.Backends, RevNat: DefaultMapSizes.RevNat,
			SockRevNat: lru, Affinity: max(lru/2, MinLRUEntries), Conntrack: lru}
	}
	flagged := FamilySizes{Services: flags.Services, Backends: flags.Backends, RevNat: flags.RevNat,
		SockRevNat: flags.SockRevNat, Affinity: flags.Affinity, Conntrack: conntrack}
	v4, v6 := flagged.or(fam(in.IPv4)), flagged.or(fam(in.IPv6))
	out := MapSizes{Services: v4.Services, Backends: v4.Backends, RevNat: v4.RevNat, SockRevNat: v4.SockRevNat, Affinity: v4.Affinity,
		MaglevTable: flags.MaglevTable}
	if out.MaglevTable == 0 {
		out.MaglevTable = DefaultMapSizes.MaglevTable
	}
	out.IPv6 = v6
	return out, v4.Conntrack, nil
}

// or is f with each zero capacity taken from d.
func (f FamilySizes) or(d FamilySizes) FamilySizes {
	pick := func(a, b uint32) uint32 {
		if a != 0 {
			return a
		}
		return b
	}
	return FamilySizes{Services: pick(f.Services, d.Services), Backends: pick(f.Backends, d.Backends), RevNat: pick(f.RevNat, d.RevNat),
		SockRevNat: pick(f.SockRevNat, d.SockRevNat), Affinity: pick(f.Affinity, d.Affinity), Conntrack: pick(f.Conntrack, d.Conntrack)}
}

// lruEntries bounds n and rounds it down to a power of two: the kernel
// gives a hash map a power of two of buckets, which a capacity just above
// one would leave half empty.
func lruEntries(n uint64) uint32 {
	n = min(max(n, MinLRUEntries), MaxLRUEntries)
	return uint32(1) << (bits.Len64(n) - 1)
}

// lruMap is an LRU map the automatic sizes cover: its name, its key and
// value sizes (the generated types', so that sizing parses no object), and
// whether it gets half the entries (the affinity maps).
type lruMap struct {
	name       string
	key, value int
	half       bool
}

// lruMapsOfFamily are the LRU maps of each family, IPv4 then IPv6.
var lruMapsOfFamily = [2][]lruMap{
	{
		{bpfobj.TcMapTc4CtV1, binary.Size(bpfobj.TcCt4Key{}), binary.Size(bpfobj.TcCt4Entry{}), false},
		{bpfobj.SockMapSock4RevnatV1, binary.Size(bpfobj.SockSock4RevnatKey{}), binary.Size(bpfobj.SockSock4Revnat{}), false},
		{bpfobj.SockMapSock4UdpFwdV1, binary.Size(bpfobj.SockSock4UdpKey{}), binary.Size(bpfobj.SockSock4Udp{}), false},
		{bpfobj.SockMapLb4AffinityV1, binary.Size(bpfobj.SockLb4AffinityKey{}), binary.Size(bpfobj.SockLb4Affinity{}), true},
	},
	{
		{bpfobj.TcMapTc6CtV1, binary.Size(bpfobj.TcCt6Key{}), binary.Size(bpfobj.TcCt6Entry{}), false},
		{bpfobj.SockMapSock6RevnatV1, binary.Size(bpfobj.SockSock6RevnatKey{}), binary.Size(bpfobj.SockSock6Revnat{}), false},
		{bpfobj.SockMapSock6UdpFwdV1, binary.Size(bpfobj.SockSock6UdpKey{}), binary.Size(bpfobj.SockSock4Udp{}), false},
		{bpfobj.SockMapLb6AffinityV1, binary.Size(bpfobj.SockLb6AffinityKey{}), binary.Size(bpfobj.SockLb4Affinity{}), true},
	},
}

// lruUnitBytes is, per family, the kernel memory of one entry of each LRU
// map (half of one in the affinity map): what one step of the automatic
// size costs.
func lruUnitBytes() [2]uint64 {
	var out [2]uint64
	for i, fam := range lruMapsOfFamily {
		for _, m := range fam {
			b := entryBytes(uint32(m.key), uint32(m.value))
			if m.half {
				b /= 2
			}
			out[i] += b
		}
	}
	return out
}

// EntryBytes is the kernel memory one entry of a hash or LRU map of spec
// takes, its bucket included: the kernel's element header (64 bytes with
// the LRU node and the bucket), then the key and the value, each rounded
// up to 8 bytes. A preallocated map takes it for every entry of its
// capacity; a map that is not, for each entry it holds, plus 16 bytes of
// bucket per entry of its capacity.
func EntryBytes(ms *ebpf.MapSpec) uint64 { return entryBytes(ms.KeySize, ms.ValueSize) }

func entryBytes(key, value uint32) uint64 {
	round := func(n uint32) uint64 { return uint64(n+7) &^ 7 }
	return 64 + round(key) + round(value)
}

// NodeMemory is the node's memory in bytes: MemTotal of /proc/meminfo
// (the host's, also inside a container).
func NodeMemory() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse MemTotal %q: %w", rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}
