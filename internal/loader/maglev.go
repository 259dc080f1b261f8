package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maglev"
)

// MaglevMaps are the pinned maps of the Maglev tables: lb4_maglev_v1 (a
// ServicePort id -> table hash of arrays) and lb4_maglev_fp_v1 (the
// fingerprint of each table's backend set).
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

// patchMaglev sizes the Maglev maps and the programs' idea of a table's
// size in spec, from sizes.
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
	outer := spec.Maps[bpfobj.TcMapLb4MaglevV1]
	outer.MaxEntries = sizes.RevNat
	outer.InnerMap.MaxEntries = m
	spec.Maps[bpfobj.TcMapLb4MaglevFpV1].MaxEntries = sizes.RevNat
	if err := spec.Variables[bpfobj.TcVarMaglevTableSize].Set(m); err != nil {
		return fmt.Errorf("set maglev_table_size: %w", err)
	}
	return nil
}

// loadMaglevMaps makes or adopts the pinned Maglev maps under bpffs,
// migrating pins of another size or layout as loadPinned does.
func loadMaglevMaps(bpffs string, sizes MapSizes, migrated func(MapMigration)) (MaglevMaps, error) {
	spec, err := bpfobj.LoadTc()
	if err != nil {
		return MaglevMaps{}, fmt.Errorf("load embedded TC object: %w", err)
	}
	if err := patchMaglev(spec, sizes); err != nil {
		return MaglevMaps{}, err
	}
	tables, fps := spec.Maps[bpfobj.TcMapLb4MaglevV1], spec.Maps[bpfobj.TcMapLb4MaglevFpV1]
	sub := &ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{bpfobj.TcMapLb4MaglevV1: tables, bpfobj.TcMapLb4MaglevFpV1: fps}}
	mig, err := migratePins(sub, mapsDir(bpffs))
	if err != nil {
		return MaglevMaps{}, err
	}
	opts := ebpf.MapOptions{PinPath: mapsDir(bpffs)}
	open := func(name string) (*ebpf.Map, error) {
		if m := mig.replacements[name]; m != nil {
			return m.Clone()
		}
		return ebpf.NewMapWithOptions(sub.Maps[name], opts)
	}
	var out MaglevMaps
	if out.Tables, err = open(bpfobj.TcMapLb4MaglevV1); err != nil {
		mig.abort()
		return MaglevMaps{}, maglevMapErr(bpffs, err)
	}
	if out.Fingerprints, err = open(bpfobj.TcMapLb4MaglevFpV1); err != nil {
		mig.abort()
		out.Close()
		return MaglevMaps{}, maglevMapErr(bpffs, err)
	}
	if err := mig.commit(); err != nil {
		out.Close()
		return MaglevMaps{}, fmt.Errorf("migrate pinned maps under %s: %w", mapsDir(bpffs), err)
	}
	mig.report(migrated)
	out.Table = tables.InnerMap.Copy()
	return out, nil
}

func maglevMapErr(bpffs string, err error) error {
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w under %s (run with --cleanup to start afresh): %w", ErrPinnedMapMismatch, mapsDir(bpffs), err)
	}
	return fmt.Errorf("maglev maps: %w", err)
}
