package loader_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// TestConntrackOfTheFirstLayoutIsKept: an agent upgraded from the first
// layout of the connection tracking maps (entries without the next hop)
// keeps every tracked flow, so that NodePort flows to other nodes, whose
// replies need their entries, live through the upgrade.
func TestConntrackOfTheFirstLayoutIsKept(t *testing.T) {
	for _, fam := range []struct {
		name          string
		key, old, cur int
	}{
		{bpfobj.TcMapTc4CtV1, binary.Size(bpfobj.TcCt4Key{}), 28, binary.Size(bpfobj.TcCt4Entry{})},
		{bpfobj.TcMapTc6CtV1, binary.Size(bpfobj.TcCt6Key{}), 52, binary.Size(bpfobj.TcCt6Entry{})},
	} {
		t.Run(fam.name, func(t *testing.T) {
			f := newTCFixture(t)
			first, err := f.load(t, loader.TCAttachClsact, "dev0")
			if err != nil {
				t.Fatal(err)
			}
			first.Close()
			pin := filepath.Join(f.bpffs, "maps", fam.name)
			if err := os.Remove(pin); err != nil {
				t.Fatal(err)
			}
			old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: uint32(fam.key), ValueSize: uint32(fam.old), MaxEntries: 1024})
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			flows := map[byte][]byte{}
			for i := byte(1); i <= 3; i++ {
				k, v := bytes.Repeat([]byte{i}, fam.key), bytes.Repeat([]byte{0x40 + i}, fam.old)
				if err := old.Put(k, v); err != nil {
					t.Fatal(err)
				}
				flows[i] = v
			}
			if err := old.Pin(pin); err != nil {
				t.Fatal(err)
			}

			got := map[string]loader.MapMigration{}
			var l *loader.TCLoaded
			err = f.ns.Do(func() error {
				l, err = loader.LoadTC(loader.TCConfig{BPFFSPath: f.bpffs, Sizes: smallSizes, ConntrackSize: 1024,
					Devices: []loader.TCDevice{{Name: "dev0"}}, Attach: loader.TCAttachClsact,
					Migrated: func(m loader.MapMigration) { got[m.Map] = m }})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if r := got[fam.name]; r.Result != loader.MigrationConverted || r.Entries != 3 {
				t.Errorf("reported %+v, want converted with 3 entries", r)
			}
			m, err := ebpf.LoadPinnedMap(pin, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if int(m.ValueSize()) != fam.cur {
				t.Fatalf("value size %d, want the current layout's %d", m.ValueSize(), fam.cur)
			}
			for i, was := range flows {
				v := make([]byte, fam.cur)
				if err := m.Lookup(bytes.Repeat([]byte{i}, fam.key), &v); err != nil {
					t.Fatalf("flow %d: %v", i, err)
				}
				if want := append(bytes.Clone(was), make([]byte, fam.cur-fam.old)...); !bytes.Equal(v, want) {
					t.Errorf("flow %d is %x, want %x (its fields kept, no next hop)", i, v, want)
				}
			}
		})
	}
}
