package loader

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

func TestPlanMap(t *testing.T) {
	hash := func(key, value, max uint32) mapShape { return mapShape{ebpf.Hash, key, value, max, 0} }
	drop := func(k, v []byte) ([]byte, []byte, error) { return nil, nil, nil }
	reg := []Migration{
		{From: "revnat_v1", To: "revnat_v1", KeySize: 4, ValueSize: 12, Convert: drop},
		{From: "backends_v1", To: "backends_v2", KeySize: 4, ValueSize: 8, Convert: drop},
	}
	for _, tc := range []struct {
		name    string
		want    mapShape
		pins    map[string]mapShape
		rebuilt bool
		// innerStale: the pin's inner maps have another shape.
		innerStale bool
		// action and from are the plan; err a part of the error, if one.
		action migrateAction
		from   string
		stale  []string
		err    string
	}{
		{name: "nothing pinned: created", want: hash(4, 8, 100)},
		{name: "the same map: adopted", want: hash(4, 8, 100), pins: map[string]mapShape{"m_v1": hash(4, 8, 100)}},
		{name: "a device map the kernel made read-only for programs: adopted",
			want: mapShape{ebpf.DevMapHash, 4, 4, 64, 0}, pins: map[string]mapShape{"m_v1": {ebpf.DevMapHash, 4, 4, 64, 0x80}}},
		{name: "a bigger size: resized", want: hash(4, 8, 100), pins: map[string]mapShape{"m_v1": hash(4, 8, 10)},
			action: resize, from: "m_v1"},
		{name: "a smaller size: resized", want: hash(4, 8, 10), pins: map[string]mapShape{"m_v1": hash(4, 8, 100)},
			action: resize, from: "m_v1"},
		{name: "another size of a per-CPU cache: recreated",
			want: mapShape{ebpf.PerCPUArray, 4, 8, 256, 0}, pins: map[string]mapShape{"m_v1": {ebpf.PerCPUArray, 4, 8, 128, 0}},
			rebuilt: true, action: recreate, from: "m_v1"},
		{name: "another size of a per-CPU state map: refused",
			want: mapShape{ebpf.PerCPUHash, 4, 8, 256, 0}, pins: map[string]mapShape{"m_v1": {ebpf.PerCPUHash, 4, 8, 128, 0}},
			err: "cannot be copied"},
		{name: "other flags: no migration", want: hash(4, 8, 100), pins: map[string]mapShape{"m_v1": {ebpf.Hash, 4, 8, 100, unix.BPF_F_RDONLY}},
			err: "no migration is registered"},
		{name: "a hash map preallocated before, not now: copied",
			want: mapShape{ebpf.Hash, 4, 8, 100, unix.BPF_F_NO_PREALLOC}, pins: map[string]mapShape{"m_v1": hash(4, 8, 100)},
			action: resize, from: "m_v1"},
		{name: "a map of maps preallocated before, smaller now: copied",
			want: mapShape{ebpf.HashOfMaps, 4, 4, 10, unix.BPF_F_NO_PREALLOC}, pins: map[string]mapShape{"m_v1": {ebpf.HashOfMaps, 4, 4, 100, 0}},
			action: resize, from: "m_v1"},
		{name: "an LRU map of other flags: no migration",
			want: mapShape{ebpf.LRUHash, 4, 8, 100, 0}, pins: map[string]mapShape{"m_v1": {ebpf.LRUHash, 4, 8, 100, unix.BPF_F_NO_COMMON_LRU}},
			err: "no migration is registered"},
		{name: "an older value layout of a state map without a migration: refused, naming map and sizes",
			want: hash(4, 8, 100), pins: map[string]mapShape{"m_v1": hash(4, 12, 100)},
			err: "m_v1 is Hash, key 4 B, value 12 B, 100 entries, flags 0x0, the new layout wants Hash, key 4 B, value 8 B, 100 entries"},
		{name: "an older value layout of a cache without a migration: recreated",
			want: hash(4, 8, 100), pins: map[string]mapShape{"m_v1": hash(8, 8, 100)}, rebuilt: true, action: recreate, from: "m_v1"},
		{name: "an older value layout with a registered migration: converted",
			want: hash(4, 8, 100), pins: map[string]mapShape{"revnat_v1": hash(4, 12, 50)}, action: convert, from: "revnat_v1"},
		{name: "a layout the registered migration does not read: refused",
			want: hash(4, 8, 100), pins: map[string]mapShape{"revnat_v1": hash(4, 16, 50)}, err: "no migration is registered"},
		{name: "an older name: converted from it",
			want: hash(4, 16, 100), pins: map[string]mapShape{"backends_v1": hash(4, 8, 10)}, action: convert, from: "backends_v1"},
		{name: "an older name of sizes the migration does not read: refused",
			want: hash(4, 16, 100), pins: map[string]mapShape{"backends_v1": hash(4, 12, 10)}, err: "backends_v1 is Hash, key 4 B, value 12 B"},
		{name: "a map of maps whose inner maps have another size: recreated",
			want: mapShape{ebpf.HashOfMaps, 4, 4, 100, 0}, pins: map[string]mapShape{"m_v1": {ebpf.HashOfMaps, 4, 4, 100, 0}},
			innerStale: true, action: recreate, from: "m_v1"},
		{name: "both names pinned (an upgrade stopped half way): the new adopted, the old removed",
			want: hash(4, 16, 100), pins: map[string]mapShape{"backends_v1": hash(4, 8, 10), "backends_v2": hash(4, 16, 100)},
			stale: []string{"backends_v1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "m_v1"
			for n := range tc.pins {
				name = n
			}
			if _, ok := tc.pins["backends_v1"]; ok {
				name = "backends_v2"
			}
			p, err := planMap(name, tc.want, tc.pins, reg, tc.rebuilt, tc.innerStale)
			if tc.err != "" {
				if !errors.Is(err, ErrPinnedMapMismatch) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want ErrPinnedMapMismatch saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.action != tc.action || p.from != tc.from {
				t.Errorf("got %s from %q, want %s from %q", p.action, p.from, tc.action, tc.from)
			}
			if strings.Join(p.stale, ",") != strings.Join(tc.stale, ",") {
				t.Errorf("stale pins %v, want %v", p.stale, tc.stale)
			}
			if tc.action == convert && p.convert == nil {
				t.Error("no migration chosen to convert with")
			}
		})
	}
}

// TestEveryStateMapCanBeMigrated checks that every pinned map whose
// contents are not rebuilt has a type the loader can copy, so that a new
// size never loses ids.
func TestEveryStateMapCanBeMigrated(t *testing.T) {
	for obj, load := range map[string]func() (*ebpf.CollectionSpec, error){"sock": bpfobj.LoadSock, "tc": bpfobj.LoadTc, "xdp": bpfobj.LoadXdp} {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		for name, ms := range spec.Maps {
			if ms.Pinning != ebpf.PinByName || rebuiltMaps[name] {
				continue
			}
			if !slices.Contains(copyable, ms.Type) {
				t.Errorf("%s: %s of %s holds state but cannot be copied: add it to rebuiltMaps or teach copyEntries its type", obj, name, ms.Type)
			}
		}
	}
}

// TestMemoryHint: a map or program the kernel could not allocate is
// explained as the container's memory limit, and nothing else is.
func TestMemoryHint(t *testing.T) {
	oom := fmt.Errorf("map create: %w", unix.ENOMEM)
	if h := memoryHint(oom); !strings.Contains(h, "memory limit") || !strings.Contains(h, "--bpf-map-") {
		t.Errorf("hint for %v: %q, want the memory limit and the map size flags named", oom, h)
	}
	if h := memoryHint(fmt.Errorf("map create: %w", unix.EPERM)); h != "" {
		t.Errorf("hint for EPERM: %q, want none", h)
	}
}
