package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// kernelMaglev adapts a family's Maglev maps: lb4_maglev_v1 (a hash of
// arrays) and lb4_maglev_fp_v1, or lb6_maglev_v1 and lb6_maglev_fp_v1.
type kernelMaglev struct {
	outer, fps *ebpf.Map
	inner      *ebpf.MapSpec
	keys       []uint32
}

// KernelMaglev wraps the loaded Maglev maps: outer holds a table per
// ServicePort id, fps their fingerprints, and inner is the spec of one
// table (the outer map's inner map, sized by the loader).
func KernelMaglev(outer, fps *ebpf.Map, inner *ebpf.MapSpec) MaglevTables {
	keys := make([]uint32, inner.MaxEntries)
	for i := range keys {
		keys[i] = uint32(i)
	}
	return &kernelMaglev{outer: outer, fps: fps, inner: inner.Copy(), keys: keys}
}

func (k *kernelMaglev) Size() int { return len(k.keys) }

// Set fills a new table and then puts it in the outer map in one update,
// which replaces the old table atomically for every lookup after it.
func (k *kernelMaglev) Set(svcID uint32, table []uint32, fp uint64) error {
	if len(table) != len(k.keys) {
		return fmt.Errorf("table of %d entries, want %d", len(table), len(k.keys))
	}
	m, err := ebpf.NewMap(k.inner)
	if err != nil {
		return fmt.Errorf("create maglev table: %w", err)
	}
	// The outer map keeps the table alive once it holds it.
	defer m.Close()
	if _, err := m.BatchUpdate(k.keys, table, nil); err != nil {
		return fmt.Errorf("fill maglev table: %w", err)
	}
	if err := k.outer.Update(svcID, m, ebpf.UpdateAny); err != nil {
		if isE2BIG(err) || errors.Is(err, ebpf.ErrKeyNotExist) {
			return fullError(k.outer)
		}
		return fmt.Errorf("update %s: %w", k.outer, err)
	}
	if err := k.fps.Update(svcID, fp, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update %s: %w", k.fps, err)
	}
	return nil
}

func (k *kernelMaglev) Delete(svcID uint32) error {
	if err := k.outer.Delete(svcID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %w", k.outer, err)
	}
	if err := k.fps.Delete(svcID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from %s: %w", k.fps, err)
	}
	return nil
}

// Fingerprints lists the tables that are present with their fingerprints;
// a fingerprint without its table (an agent stopped between the two
// updates) is left out, so that the table is written again.
func (k *kernelMaglev) Fingerprints() (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	var (
		id uint32
		fp uint64
	)
	it := k.fps.Iterate()
	for it.Next(&id, &fp) {
		out[id] = fp
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", k.fps, err)
	}
	for id := range out {
		var tableID ebpf.MapID
		if err := k.outer.Lookup(id, &tableID); err != nil {
			delete(out, id)
		}
	}
	return out, nil
}
