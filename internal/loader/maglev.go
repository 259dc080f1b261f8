package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maglev"
)

// MaglevMaps are the pinned maps of one family's Maglev tables:
// lb4_maglev_v1 or lb6_maglev_v1 (a ServicePort id -> table hash of arrays)
// and lb4_maglev_fp_v1 or lb6_maglev_fp_v1 (the fingerprint of each table's
// backend set).
type MaglevMaps struct {
	Tables       *ebpf.Map
	Fingerprints *ebpf.Map
	// Table is the spec of one table, for the writer to create new ones.
	Table *ebpf.MapSpec
}

// Close releases the handles; the pinned maps stay.
func (m *MaglevMaps) Close() {
	if m.Tables != nil {
		m.Tables.Close()
	}
	if m.Fingerprints != nil {
		m.Fingerprints.Close()
	}
}

// maglevMapNames are the names of the Maglev maps, tables then
// fingerprints, of IPv4 and of IPv6.
var maglevMapNames = [2][2]string{
	{bpfobj.TcMapLb4MaglevV1, bpfobj.TcMapLb4MaglevFpV1},
	{bpfobj.TcMapLb6MaglevV1, bpfobj.TcMapLb6MaglevFpV1},
}

// patchMaglev sizes the Maglev maps of both families and the programs'
// idea of a table's size in spec, from sizes: the same table size for both.
func patchMaglev(spec *ebpf.CollectionSpec, sizes MapSizes) error {
	m := sizes.MaglevTable
	if m == 0 {
		m = DefaultMapSizes.MaglevTable
	}
	if err := maglev.CheckSize(int(m)); err != nil {
		return err
	}
	// A table per ServicePort at most, and there are no more of those
	// than reverse NAT entries.
	for i, names := range maglevMapNames {
		n := sizes.RevNat
		if i == 1 {
			n = sizes.Family6(0).RevNat
		}
		outer := spec.Maps[names[0]]
		outer.MaxEntries = n
		outer.InnerMap.MaxEntries = m
		spec.Maps[names[1]].MaxEntries = n
	}
	if err := spec.Variables[bpfobj.TcVarMaglevTableSize].Set(m); err != nil {
		return fmt.Errorf("set maglev_table_size: %w", err)
	}
	return nil
}

// loadMaglevMaps makes or adopts the pinned Maglev maps of both families
// under bpffs, migrating pins of another size or layout as loadPinned does,
// and returns the IPv4 ones and the IPv6 ones.
func loadMaglevMaps(bpffs string, sizes MapSizes, migrated func(MapMigration)) (MaglevMaps, MaglevMaps, error) {
	var out [2]MaglevMaps
	closeAll := func() {
		for i := range out {
			out[i].Close()
		}
	}
	spec, err := bpfobj.LoadTc()
	if err != nil {
		return out[0], out[1], fmt.Errorf("load embedded TC object: %w", err)
	}
	if err := patchMaglev(spec, sizes); err != nil {
		return out[0], out[1], err
	}
	sub := &ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{}}
	for _, names := range maglevMapNames {
		for _, name := range names {
			sub.Maps[name] = spec.Maps[name]
		}
	}
	mig, err := migratePins(sub, mapsDir(bpffs), false)
	if err != nil {
		return out[0], out[1], err
	}
	opts := ebpf.MapOptions{PinPath: mapsDir(bpffs)}
	open := func(name string) (*ebpf.Map, error) {
		if m := mig.replacements[name]; m != nil {
			return m.Clone()
		}
		return ebpf.NewMapWithOptions(sub.Maps[name], opts)
	}
	for i, names := range maglevMapNames {
		if out[i].Tables, err = open(names[0]); err == nil {
			out[i].Fingerprints, err = open(names[1])
		}
		if err != nil {
			mig.abort()
			closeAll()
			return MaglevMaps{}, MaglevMaps{}, maglevMapErr(bpffs, err)
		}
		out[i].Table = sub.Maps[names[0]].InnerMap.Copy()
	}
	if err := mig.commit(); err != nil {
		closeAll()
		return MaglevMaps{}, MaglevMaps{}, fmt.Errorf("migrate pinned maps under %s: %w", mapsDir(bpffs), err)
	}
	mig.report(migrated)
	return out[0], out[1], nil
}

func maglevMapErr(bpffs string, err error) error {
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w under %s (run with --cleanup to start afresh): %w", ErrPinnedMapMismatch, mapsDir(bpffs), err)
	}
	return fmt.Errorf("maglev maps: %w%s", err, memoryHint(err))
}
