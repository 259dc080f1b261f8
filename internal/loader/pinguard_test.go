package loader_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// pins lists the files under the agent's maps/ and links/ directories.
func pins(t *testing.T, bpffs string) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"maps", "links"} {
		entries, err := os.ReadDir(filepath.Join(bpffs, dir))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range entries {
			out = append(out, filepath.Join(bpffs, dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out
}

func TestPinGuardRestoresRemovedPins(t *testing.T) {
	f := newFixture(t)
	l, err := f.load(t, loader.MapSizes{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before := pins(t, f.bpffs)
	attached := f.attached(t)
	mapID := func(path string) ebpf.MapID {
		m, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return id
	}
	services := filepath.Join(f.bpffs, "maps", "lb4_services_v1")
	servicesID := mapID(services)

	g := loader.NewPinGuard(f.bpffs)
	defer g.Close()
	if err := g.Refresh(); err != nil {
		t.Fatal(err)
	}
	if g.Held() != len(before) {
		t.Fatalf("guard holds %d pins of %d: %v", g.Held(), len(before), before)
	}
	if restored, err := g.Repair(); err != nil || len(restored) != 0 {
		t.Fatalf("nothing removed yet: Repair restored %v, %v", restored, err)
	}

	// Everything goes, directories included, as with `rm -rf`.
	for _, dir := range []string{"maps", "links"} {
		if err := os.RemoveAll(filepath.Join(f.bpffs, dir)); err != nil {
			t.Fatal(err)
		}
	}
	// A refresh meanwhile (a sync that ran while the pins went) keeps
	// what went with its directory.
	if err := g.Refresh(); err != nil {
		t.Fatal(err)
	}
	restored, err := g.Repair()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(restored, before) {
		t.Errorf("restored %v; want %v", restored, before)
	}
	if got := pins(t, f.bpffs); !slices.Equal(got, before) {
		t.Errorf("pins after repair %v; want %v", got, before)
	}
	if id := mapID(services); id != servicesID {
		t.Errorf("%s pins map %d after repair; want the same map, %d", services, id, servicesID)
	}
	// The links pinned again are the attached ones: a new agent adopts
	// them and nothing is attached twice.
	for _, p := range pins(t, f.bpffs) {
		if filepath.Base(filepath.Dir(p)) != "links" {
			continue
		}
		lk, err := link.LoadPinnedLink(p, nil)
		if err != nil {
			t.Fatalf("open restored link %s: %v", p, err)
		}
		lk.Close()
	}
	l2, err := f.load(t, loader.MapSizes{})
	if err != nil {
		t.Fatalf("a new agent on the restored pins: %v", err)
	}
	l2.Close()
	if got := f.attached(t); !equalAttached(got, attached) {
		t.Errorf("programs attached after a reload on the restored pins: %v; want one per hook as before: %v", got, attached)
	}

	// A path that someone else pinned in the meantime is theirs.
	if err := os.Remove(services); err != nil {
		t.Fatal(err)
	}
	other, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Pin(services); err != nil {
		t.Fatal(err)
	}
	if restored, err := g.Repair(); err != nil || slices.Contains(restored, services) {
		t.Errorf("Repair over another object's pin: restored %v, %v", restored, err)
	}
	_ = other.Unpin()
}

func equalAttached(a, b map[ebpf.AttachType][]ebpf.ProgramID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if len(v) != len(b[k]) {
			return false
		}
	}
	return true
}
