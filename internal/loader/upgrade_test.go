package loader_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// loadReporting loads with sizes and returns what the loader reported
// about migrated maps, by map name; the carry-over of an LRU map after the
// attach is under its name and " carried".
func (f fixture) loadReporting(t *testing.T, sizes loader.MapSizes) (*loader.Loaded, map[string]loader.MapMigration, error) {
	t.Helper()
	got := map[string]loader.MapMigration{}
	l, err := loader.Load(loader.Config{BPFFSPath: f.bpffs, CgroupPath: f.cgroup, Sizes: sizes,
		Migrated: func(m loader.MapMigration) {
			if m.Result == loader.MigrationCarried {
				got[m.Map+" carried"] = m
				return
			}
			got[m.Map] = m
		}})
	return l, got, err
}

func (f fixture) pin(name string) string { return filepath.Join(f.bpffs, "maps", name) }

// pinnedID is the id of the map pinned under name.
func (f fixture) pinnedID(t *testing.T, name string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(f.pin(name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return mapID(t, m)
}

// pinsLeft lists the files under the maps directory.
func (f fixture) pinsLeft(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(f.bpffs, "maps"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func putBackends(t *testing.T, m *ebpf.Map, n int) map[uint32]bpfobj.SockLb4Backend {
	t.Helper()
	want := map[uint32]bpfobj.SockLb4Backend{}
	for i := 1; i <= n; i++ {
		// Ids with gaps, as a long-running agent leaves them.
		id := uint32(3 * i)
		v := bpfobj.SockLb4Backend{Address: 0x0a00f40a + uint32(i)<<24, Port: 0x901f, Proto: 6}
		if err := m.Put(id, v); err != nil {
			t.Fatal(err)
		}
		want[id] = v
	}
	return want
}

func backendsOf(t *testing.T, m *ebpf.Map) map[uint32]bpfobj.SockLb4Backend {
	t.Helper()
	got := map[uint32]bpfobj.SockLb4Backend{}
	var (
		id uint32
		v  bpfobj.SockLb4Backend
	)
	it := m.Iterate()
	for it.Next(&id, &v) {
		got[id] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestNewSizesMigrateThePinnedMapsKeepingEntries(t *testing.T) {
	f := newFixture(t)
	small := loader.MapSizes{Services: 512, Backends: 256, RevNat: 128, SockRevNat: 256, Affinity: 256, MaglevTable: loader.DefaultMapSizes.MaglevTable}
	first, err := f.load(t, small)
	if err != nil {
		t.Fatal(err)
	}
	want := putBackends(t, first.Objects.Lb4BackendsV1, 20)
	table, err := ebpf.NewMap(first.Maglev.Table)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if err := first.Maglev.Tables.Put(uint32(7), table); err != nil {
		t.Fatal(err)
	}
	first.Close()
	before := f.attached(t)

	second, got, err := f.loadReporting(t, loader.DefaultMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if n := second.Objects.Lb4BackendsV1.MaxEntries(); n != loader.DefaultMapSizes.Backends {
		t.Errorf("backends map has %d entries, want the new size %d", n, loader.DefaultMapSizes.Backends)
	}
	if second.Sizes != loader.DefaultMapSizes {
		t.Errorf("loaded sizes %+v, want %+v", second.Sizes, loader.DefaultMapSizes)
	}
	if diff := backendsOf(t, second.Objects.Lb4BackendsV1); !mapsEqual(diff, want) {
		t.Errorf("backends after the upgrade %v, want %v", diff, want)
	}
	if id := f.pinnedID(t, bpfobj.SockMapLb4BackendsV1); id != mapID(t, second.Objects.Lb4BackendsV1) {
		t.Errorf("pinned backends map %d is not the one the programs use (%d)", id, mapID(t, second.Objects.Lb4BackendsV1))
	}
	var tableID uint32
	if err := second.Maglev.Tables.Lookup(uint32(7), &tableID); err != nil || ebpf.MapID(tableID) != mapID(t, table) {
		t.Errorf("Maglev table of ServicePort 7 is map %d (%v), want the one put there, %d", tableID, err, mapID(t, table))
	}
	r := got[bpfobj.SockMapLb4BackendsV1]
	if r.Result != loader.MigrationResized || r.Entries != 20 || r.Err != nil {
		t.Errorf("backends reported as %+v, want resized with 20 entries", r)
	}
	for _, name := range []string{bpfobj.SockMapLb4ServicesV1, bpfobj.SockMapLb4RevnatV1, bpfobj.SockMapLb4MembersV1, bpfobj.SockMapLb4AffinityV1,
		bpfobj.SockMapSock4RevnatV1, bpfobj.SockMapSock4UdpFwdV1, bpfobj.TcMapLb4MaglevV1, bpfobj.TcMapLb4MaglevFpV1,
		bpfobj.TcMapLb6MaglevV1, bpfobj.TcMapLb6MaglevFpV1} {
		if got[name].Result != loader.MigrationResized {
			t.Errorf("%s reported as %+v, want resized", name, got[name])
		}
	}
	for _, p := range f.pinsLeft(t) {
		if strings.HasPrefix(p, "migrating-") {
			t.Errorf("temporary pin %s left behind", p)
		}
	}
	for at, ids := range f.attached(t) {
		if len(ids) != 1 || ids[0] == before[at][0] {
			t.Errorf("%v: attached %v, want one new program in place of %v", at, ids, before[at])
		}
	}

	// The next start adopts the migrated maps as they are.
	second.Close()
	third, got, err := f.loadReporting(t, loader.DefaultMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if len(got) != 0 {
		t.Errorf("a restart with the same sizes migrated %v", got)
	}
}

func TestEntriesThatDoNotFitKeepTheOldMap(t *testing.T) {
	f := newFixture(t)
	sizes := loader.DefaultMapSizes
	sizes.Backends = 64
	first, err := f.load(t, sizes)
	if err != nil {
		t.Fatal(err)
	}
	want := putBackends(t, first.Objects.Lb4BackendsV1, 10)
	first.Close()
	pinned := f.pinnedID(t, bpfobj.SockMapLb4BackendsV1)

	sizes.Backends = 4
	second, got, err := f.loadReporting(t, sizes)
	if err != nil {
		t.Fatalf("a map too small for the pinned entries must not stop the agent: %v", err)
	}
	defer second.Close()
	r := got[bpfobj.SockMapLb4BackendsV1]
	if r.Result != loader.MigrationKept || r.Err == nil || !strings.Contains(r.Err.Error(), "do not fit 4 entries, so it keeps its 64") {
		t.Errorf("reported %+v, want kept with an error saying the entries do not fit", r)
	}
	if id := mapID(t, second.Objects.Lb4BackendsV1); id != pinned {
		t.Errorf("programs use backends map %d, want the old pinned map %d", id, pinned)
	}
	if id := f.pinnedID(t, bpfobj.SockMapLb4BackendsV1); id != pinned {
		t.Errorf("backends pinned as map %d, want the old map %d", id, pinned)
	}
	if second.Sizes.Backends != 64 {
		t.Errorf("loaded backends size %d, want the kept map's 64", second.Sizes.Backends)
	}
	if diff := backendsOf(t, second.Objects.Lb4BackendsV1); !mapsEqual(diff, want) {
		t.Errorf("backends %v, want %v", diff, want)
	}
}

func TestAnOlderLayout(t *testing.T) {
	// revnatV0 is a made-up older layout of lb4_revnat_v1: the address,
	// 4 bytes nobody reads, then the port.
	const revnatV0Size = 12
	toV1 := func(k, v []byte) ([]byte, []byte, error) {
		return k, []byte{v[0], v[1], v[2], v[3], v[8], v[9], 0, 0}, nil
	}
	setUp := func(t *testing.T) (fixture, map[string]ebpf.ProgramID, ebpf.MapID) {
		f := newFixture(t)
		first, err := f.load(t, loader.MapSizes{})
		if err != nil {
			t.Fatal(err)
		}
		first.Close()
		if err := os.Remove(f.pin(bpfobj.SockMapLb4RevnatV1)); err != nil {
			t.Fatal(err)
		}
		old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: revnatV0Size, MaxEntries: 1000})
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		for id := uint32(1); id <= 3; id++ {
			if err := old.Put(id, []byte{10, 96, 0, byte(id), 0xde, 0xad, 0xbe, 0xef, 0, 80, 0, 0}); err != nil {
				t.Fatal(err)
			}
		}
		if err := old.Pin(f.pin(bpfobj.SockMapLb4RevnatV1)); err != nil {
			t.Fatal(err)
		}
		progs := map[string]ebpf.ProgramID{}
		for at, ids := range f.attached(t) {
			progs[at.String()] = ids[0]
		}
		return f, progs, mapID(t, old)
	}

	t.Run("without a migration: refused, naming the map, the old pin and programs left alone", func(t *testing.T) {
		f, before, pinned := setUp(t)
		_, err := f.load(t, loader.MapSizes{})
		if !errors.Is(err, loader.ErrPinnedMapMismatch) {
			t.Fatalf("got %v, want ErrPinnedMapMismatch", err)
		}
		for _, s := range []string{bpfobj.SockMapLb4RevnatV1, "value 12 B", "value 8 B", "no migration is registered", "--cleanup"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
		if id := f.pinnedID(t, bpfobj.SockMapLb4RevnatV1); id != pinned {
			t.Errorf("revnat pinned as map %d, want the old map %d", id, pinned)
		}
		for at, ids := range f.attached(t) {
			if len(ids) != 1 || ids[0] != before[at.String()] {
				t.Errorf("%v: attached %v after a refused load, want the old %d", at, ids, before[at.String()])
			}
		}
		if p := f.pinsLeft(t); slices.ContainsFunc(p, func(n string) bool { return strings.HasPrefix(n, "migrating-") }) {
			t.Errorf("temporary pins left behind: %v", p)
		}
	})

	t.Run("with a registered migration: converted, ids kept", func(t *testing.T) {
		f, _, _ := setUp(t)
		t.Cleanup(loader.RegisterMigration(loader.Migration{From: bpfobj.SockMapLb4RevnatV1, To: bpfobj.SockMapLb4RevnatV1,
			KeySize: 4, ValueSize: revnatV0Size, Convert: toV1}))
		l, got, err := f.loadReporting(t, loader.MapSizes{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if r := got[bpfobj.SockMapLb4RevnatV1]; r.Result != loader.MigrationConverted || r.Entries != 3 {
			t.Errorf("reported %+v, want converted with 3 entries", r)
		}
		for id := uint32(1); id <= 3; id++ {
			var v bpfobj.SockLb4ReverseNat
			if err := l.Objects.Lb4RevnatV1.Lookup(id, &v); err != nil {
				t.Fatalf("reverse NAT id %d: %v", id, err)
			}
			if want := (bpfobj.SockLb4ReverseNat{Address: 0x0000600a | id<<24, Port: 0x5000}); v != want {
				t.Errorf("reverse NAT id %d is %+v, want %+v", id, v, want)
			}
		}
	})

	t.Run("a cache without a migration: starts empty", func(t *testing.T) {
		f, _, _ := setUp(t)
		t.Cleanup(loader.RegisterMigration(loader.Migration{From: bpfobj.SockMapLb4RevnatV1, To: bpfobj.SockMapLb4RevnatV1,
			KeySize: 4, ValueSize: revnatV0Size, Convert: toV1}))
		if err := os.Remove(f.pin(bpfobj.SockMapLb4AffinityV1)); err != nil {
			t.Fatal(err)
		}
		old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 16, ValueSize: 8, MaxEntries: 100})
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		if err := old.Pin(f.pin(bpfobj.SockMapLb4AffinityV1)); err != nil {
			t.Fatal(err)
		}
		l, got, err := f.loadReporting(t, loader.MapSizes{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if r := got[bpfobj.SockMapLb4AffinityV1]; r.Result != loader.MigrationRecreated {
			t.Errorf("affinity reported as %+v, want recreated", r)
		}
		if l.Objects.Lb4AffinityV1.ValueSize() != 16 {
			t.Errorf("affinity map value size %d, want the new layout's 16", l.Objects.Lb4AffinityV1.ValueSize())
		}
	})
}

// TestANewMaglevTableSizeStartsTheTablesAfresh: either family's Maglev
// maps are recreated at a new table size, their fingerprints with them.
func TestANewMaglevTableSizeStartsTheTablesAfresh(t *testing.T) {
	for _, fam := range []struct {
		name         string
		tables, fps  string
		maglevMapsOf func(*loader.Loaded) loader.MaglevMaps
	}{
		{"IPv4", bpfobj.TcMapLb4MaglevV1, bpfobj.TcMapLb4MaglevFpV1, func(l *loader.Loaded) loader.MaglevMaps { return l.Maglev }},
		{"IPv6", bpfobj.TcMapLb6MaglevV1, bpfobj.TcMapLb6MaglevFpV1, func(l *loader.Loaded) loader.MaglevMaps { return l.Maglev6 }},
	} {
		t.Run(fam.name, func(t *testing.T) {
			f := newFixture(t)
			first, err := f.load(t, loader.DefaultMapSizes)
			if err != nil {
				t.Fatal(err)
			}
			mg := fam.maglevMapsOf(first)
			table, err := ebpf.NewMap(mg.Table)
			if err != nil {
				t.Fatal(err)
			}
			defer table.Close()
			if err := mg.Tables.Put(uint32(7), table); err != nil {
				t.Fatal(err)
			}
			if err := mg.Fingerprints.Put(uint32(7), uint64(42)); err != nil {
				t.Fatal(err)
			}
			first.Close()

			sizes := loader.DefaultMapSizes
			sizes.MaglevTable = 4093
			second, got, err := f.loadReporting(t, sizes)
			if err != nil {
				t.Fatal(err)
			}
			defer second.Close()
			mg = fam.maglevMapsOf(second)
			for _, name := range []string{fam.tables, fam.fps} {
				if got[name].Result != loader.MigrationRecreated {
					t.Errorf("%s reported as %+v, want recreated", name, got[name])
				}
			}
			var fp uint64
			if err := mg.Fingerprints.Lookup(uint32(7), &fp); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("fingerprint of a table of the old size still there (%d, %v): the agent would not rewrite it", fp, err)
			}
			if n := mg.Table.MaxEntries; n != 4093 {
				t.Errorf("a new table has %d entries, want 4093", n)
			}
			bigger, err := ebpf.NewMap(mg.Table)
			if err != nil {
				t.Fatal(err)
			}
			defer bigger.Close()
			if err := mg.Tables.Put(uint32(7), bigger); err != nil {
				t.Errorf("a table of the new size does not go in: %v", err)
			}
			for name, m := range map[string]*ebpf.Map{fam.tables: mg.Tables, fam.fps: mg.Fingerprints} {
				if f.pinnedID(t, name) != mapID(t, m) {
					t.Errorf("pinned %s is not the map in use", name)
				}
			}
		})
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Until December 2026 the maps only the agent writes were preallocated: an
// agent of this layout finds them so, at its sizes, and copies them into
// maps that are not.
func TestPreallocatedMapsOfAnEarlierAgentAreCopied(t *testing.T) {
	f := newFixture(t)
	spec := objectMaps(t)
	if err := os.MkdirAll(filepath.Join(f.bpffs, "maps"), 0o700); err != nil {
		t.Fatal(err)
	}
	names := []string{bpfobj.SockMapLb4ServicesV1, bpfobj.SockMapLb4BackendsV1, bpfobj.SockMapLb4RevnatV1,
		bpfobj.SockMapLb6ServicesV1, bpfobj.SockMapLb6BackendsV1, bpfobj.SockMapLb6RevnatV1,
		bpfobj.TcMapLb4MaglevFpV1, bpfobj.TcMapLb4MaglevV1, bpfobj.TcMapLb6MaglevFpV1, bpfobj.TcMapLb6MaglevV1}
	var backends *ebpf.Map
	for _, name := range names {
		ms := spec(name).Copy()
		if ms.Flags&unix.BPF_F_NO_PREALLOC == 0 {
			t.Fatalf("%s is preallocated", name)
		}
		ms.Flags &^= unix.BPF_F_NO_PREALLOC
		ms.Pinning = ebpf.PinNone
		if ms.InnerMap != nil {
			ms.InnerMap.MaxEntries = loader.DefaultMapSizes.MaglevTable
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer m.Close()
		if err := m.Pin(f.pin(name)); err != nil {
			t.Fatal(err)
		}
		if name == bpfobj.SockMapLb4BackendsV1 {
			backends = m
		}
	}
	want := putBackends(t, backends, 30)

	l, got, err := f.loadReporting(t, loader.DefaultMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if diff := backendsOf(t, l.Objects.Lb4BackendsV1); !mapsEqual(diff, want) {
		t.Errorf("backends after the upgrade %v, want %v", diff, want)
	}
	for _, name := range names {
		if r := got[name]; r.Result != loader.MigrationResized || r.Err != nil {
			t.Errorf("%s reported as %+v, want resized", name, r)
		}
		m, err := ebpf.LoadPinnedMap(f.pin(name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Flags()&unix.BPF_F_NO_PREALLOC == 0 {
			t.Errorf("%s is still preallocated after the upgrade", name)
		}
		m.Close()
	}
}

// An LRU map resized at an upgrade keeps what the earlier programs wrote
// into it between the copy and the new programs' attach (a connection
// made in that moment), and what the new programs wrote wins.
func TestLRUEntriesWrittenDuringTheMigrationAreCarriedOver(t *testing.T) {
	f := newFixture(t)
	small := loader.MapSizes{Services: 512, Backends: 256, RevNat: 128, SockRevNat: 256, Affinity: 256, MaglevTable: loader.DefaultMapSizes.MaglevTable}
	first, err := f.load(t, small)
	if err != nil {
		t.Fatal(err)
	}
	key := func(cookie uint64) bpfobj.SockSock4RevnatKey {
		return bpfobj.SockSock4RevnatKey{Cookie: cookie, Address: 0x0a00f40a, Port: 0x901f}
	}
	val := func(id uint32) bpfobj.SockSock4Revnat {
		return bpfobj.SockSock4Revnat{Address: 0x0a60000a, Port: 0x5000, RevNatId: id}
	}
	if err := first.Objects.Sock4RevnatV1.Put(key(1), val(1)); err != nil {
		t.Fatal(err)
	}
	first.Close()
	hooked := false
	loader.SetAfterMigrationCopy(t.Cleanup, func() {
		old, err := ebpf.LoadPinnedMap(f.pin(bpfobj.SockMapSock4RevnatV1), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		if old.MaxEntries() != 256 {
			return // another object's migration
		}
		hooked = true
		// A connection the earlier programs translate now; and one
		// both wrote, the new programs last.
		if err := old.Put(key(2), val(2)); err != nil {
			t.Fatal(err)
		}
		if err := old.Put(key(3), val(3)); err != nil {
			t.Fatal(err)
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(f.bpffs, "maps", "migrating-"+bpfobj.SockMapSock4RevnatV1), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.Put(key(3), val(33)); err != nil {
			t.Fatal(err)
		}
	})
	second, got, err := f.loadReporting(t, loader.DefaultMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if !hooked {
		t.Fatal("the socket reverse NAT map did not migrate")
	}
	for cookie, want := range map[uint64]uint32{1: 1, 2: 2, 3: 33} {
		var v bpfobj.SockSock4Revnat
		if err := second.Objects.Sock4RevnatV1.Lookup(key(cookie), &v); err != nil || v.RevNatId != want {
			t.Errorf("socket %d: %+v (%v), want reverse NAT id %d", cookie, v, err, want)
		}
	}
	if r := got[bpfobj.SockMapSock4RevnatV1+" carried"]; r.Result != loader.MigrationCarried || r.Entries != 1 || r.Err != nil {
		t.Errorf("reported %+v, want carried with 1 entry", r)
	}
}
