package loader_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

const gib = 1 << 30

// objectMaps returns the spec of a map of the socket or the TC object by
// name.
func objectMaps(t *testing.T) func(name string) *ebpf.MapSpec {
	t.Helper()
	sock, err := bpfobj.LoadSock()
	if err != nil {
		t.Fatal(err)
	}
	tc, err := bpfobj.LoadTc()
	if err != nil {
		t.Fatal(err)
	}
	return func(name string) *ebpf.MapSpec {
		if ms, ok := sock.Maps[name]; ok {
			return ms
		}
		ms, ok := tc.Maps[name]
		if !ok {
			t.Fatalf("no map %s in the socket or TC object", name)
		}
		return ms
	}
}

// lruBytes is the kernel memory of the LRU maps of one family at sizes
// (IPv6's when v6), counted from the maps' specs.
func lruBytes(t *testing.T, sizes loader.MapSizes, ct uint32, v6 bool) uint64 {
	t.Helper()
	spec := objectMaps(t)
	f := loader.FamilySizes{SockRevNat: sizes.SockRevNat, Affinity: sizes.Affinity, Conntrack: ct}
	names := []string{bpfobj.TcMapTc4CtV1, bpfobj.SockMapSock4RevnatV1, bpfobj.SockMapSock4UdpFwdV1, bpfobj.SockMapLb4AffinityV1}
	if v6 {
		f = sizes.Family6(ct)
		names = []string{bpfobj.TcMapTc6CtV1, bpfobj.SockMapSock6RevnatV1, bpfobj.SockMapSock6UdpFwdV1, bpfobj.SockMapLb6AffinityV1}
	}
	var total uint64
	for i, n := range []uint32{f.Conntrack, f.SockRevNat, f.SockRevNat, f.Affinity} {
		ms := spec(names[i])
		if ms.Type != ebpf.LRUHash {
			t.Fatalf("%s is %s, not an LRU map", names[i], ms.Type)
		}
		total += uint64(n) * loader.EntryBytes(ms)
	}
	return total
}

func TestMapSizesFollowTheNodesMemoryAndFamilies(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mem        uint64
		ipv4, ipv6 bool
		// lru4 and lru6 are the connection tracking and socket maps'
		// entries; affinity maps get half, at least the floor.
		lru4, lru6 uint32
	}{
		{"IPv4 node of 8 GiB", 8 * gib, true, false, 32768, loader.UnaddressedLRUEntries},
		{"dual-stack node of 8 GiB: the share is split", 8 * gib, true, true, 16384, 16384},
		{"IPv6 node of 64 GiB", 64 * gib, false, true, loader.UnaddressedLRUEntries, 262144},
		{"IPv4 node of 1 GiB: the floor", 1 * gib, true, false, loader.MinLRUEntries, loader.UnaddressedLRUEntries},
		{"no family known: IPv4", 8 * gib, false, false, 32768, loader.UnaddressedLRUEntries},
		{"IPv4 node of 4 TiB: the ceiling", 4096 * gib, true, false, loader.MaxLRUEntries, loader.UnaddressedLRUEntries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sizes, ct, err := loader.AutoSizes(loader.MapSizes{}, 0, loader.SizeInput{NodeMemory: tc.mem, IPv4: tc.ipv4, IPv6: tc.ipv6})
			if err != nil {
				t.Fatal(err)
			}
			s6 := sizes.Family6(ct)
			if ct != tc.lru4 || sizes.SockRevNat != tc.lru4 || s6.Conntrack != tc.lru6 || s6.SockRevNat != tc.lru6 {
				t.Errorf("conntrack and socket maps %d/%d (IPv4) %d/%d (IPv6), want %d (IPv4) %d (IPv6)",
					ct, sizes.SockRevNat, s6.Conntrack, s6.SockRevNat, tc.lru4, tc.lru6)
			}
			if want := max(tc.lru4/2, min(tc.lru4, loader.MinLRUEntries)); sizes.Affinity != want {
				t.Errorf("IPv4 affinity %d, want %d", sizes.Affinity, want)
			}
			addressed4 := tc.ipv4 || !tc.ipv6
			if want := loader.DefaultMapSizes.Services; addressed4 && (sizes.Services != want || sizes.Backends != loader.DefaultMapSizes.Backends) {
				t.Errorf("IPv4 services and backends %d, %d, want the defaults", sizes.Services, sizes.Backends)
			}
			if !tc.ipv6 && (s6.Services != loader.UnaddressedSizes.Services || s6.RevNat != loader.UnaddressedSizes.RevNat) {
				t.Errorf("IPv6 services and reverse NAT %d, %d on a node without IPv6, want %+v", s6.Services, s6.RevNat, loader.UnaddressedSizes)
			}
			// What the ratio gives stays within the node's share, and
			// (rounded down to a power of two) above half of it.
			budget := uint64(float64(tc.mem) * loader.DefaultLRUMemoryRatio)
			var used uint64
			if addressed4 {
				used += lruBytes(t, sizes, ct, false)
			}
			if tc.ipv6 {
				used += lruBytes(t, sizes, ct, true)
			}
			floor := tc.lru4 == loader.MinLRUEntries || tc.lru6 == loader.MinLRUEntries
			ceiling := tc.lru4 == loader.MaxLRUEntries
			if !floor && used > budget {
				t.Errorf("LRU maps take %d MiB, more than the node's share %d MiB", used>>20, budget>>20)
			}
			if !ceiling && used <= budget/2 {
				t.Errorf("LRU maps take %d MiB, not more than half the node's share %d MiB", used>>20, budget>>20)
			}
		})
	}
}

func TestMapFlagsOverrideTheAutomaticSizes(t *testing.T) {
	flags := loader.MapSizes{Services: 1000, Backends: 2000, RevNat: 300, SockRevNat: 4000, Affinity: 500, MaglevTable: 251}
	sizes, ct, err := loader.AutoSizes(flags, 7000, loader.SizeInput{NodeMemory: 8 * gib, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	want6 := loader.FamilySizes{Services: 1000, Backends: 2000, RevNat: 300, SockRevNat: 4000, Affinity: 500, Conntrack: 7000}
	if ct != 7000 || sizes.Family6(ct) != want6 || sizes.MaglevTable != 251 || sizes.Services != 1000 || sizes.Affinity != 500 {
		t.Errorf("sizes %+v, conntrack %d: want the flags' for both families", sizes, ct)
	}
	for _, ratio := range []float64{-0.1, 0.6} {
		if _, _, err := loader.AutoSizes(loader.MapSizes{}, 0, loader.SizeInput{NodeMemory: gib, Ratio: ratio}); err == nil || !strings.Contains(err.Error(), "ratio") {
			t.Errorf("ratio %g: %v, want an error naming the ratio", ratio, err)
		}
	}
}

func TestNodeMemory(t *testing.T) {
	mem, err := loader.NodeMemory()
	if err != nil {
		t.Fatal(err)
	}
	if mem < 256<<20 || mem > 1<<50 {
		t.Errorf("node memory %d bytes", mem)
	}
}

// EntryBytes is what the kernel charges: an LRU map made at a size takes
// that many entries of it (fdinfo's memlock), within 2%. Before 6.4 the
// kernel reports no map's memory use (memlock is the key and value sizes
// times the capacity, whatever the map's type), so there is nothing to
// check it against: the test says so and checks that formula instead, so
// that a kernel reporting something else fails it.
func TestEntryBytesIsWhatTheKernelCharges(t *testing.T) {
	sandbox.RequireRoot(t)
	reportsUsage := kernelAtLeast(t, 6, 4)
	if !reportsUsage {
		t.Log("kernel before 6.4: memlock is an estimate from the key and value sizes, not the map's memory; checking that estimate")
	}
	for _, load := range []func() (*ebpf.CollectionSpec, error){bpfobj.LoadSock, bpfobj.LoadTc} {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		for name, ms := range spec.Maps {
			if ms.Type != ebpf.LRUHash {
				continue
			}
			ms = ms.Copy()
			ms.Pinning, ms.MaxEntries = ebpf.PinNone, 1<<14
			m, err := ebpf.NewMap(ms)
			if err != nil {
				t.Fatal(err)
			}
			info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
			m.Close()
			if err != nil {
				t.Fatal(err)
			}
			var memlock uint64
			for line := range strings.SplitSeq(string(info), "\n") {
				if v, ok := strings.CutPrefix(line, "memlock:"); ok {
					memlock, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				}
			}
			want := uint64(ms.MaxEntries) * loader.EntryBytes(ms)
			if !reportsUsage {
				page := uint64(os.Getpagesize())
				want = (uint64(ms.MaxEntries)*((uint64(ms.KeySize)+uint64(ms.ValueSize)+7)&^7) + page - 1) &^ (page - 1)
			}
			if memlock < want*98/100 || memlock > want*102/100 {
				t.Errorf("%s: the kernel charges %d bytes for %d entries, EntryBytes says %d", name, memlock, ms.MaxEntries, want)
			}
		}
	}
}

// kernelAtLeast says whether the running kernel is major.minor or later.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var maj, min int
	if _, err := fmt.Sscanf(rel, "%d.%d", &maj, &min); err != nil {
		t.Fatalf("kernel release %q: %v", rel, err)
	}
	return maj > major || maj == major && min >= minor
}
