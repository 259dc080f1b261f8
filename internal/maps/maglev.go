package maps

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maglev"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// MaglevTables is the part of a family's Maglev tables map (lb4_maglev_v1
// or lb6_maglev_v1, a hash of arrays keyed by the ServicePort ids of the
// family's Writer, with a fingerprint of each table beside it) the Writer
// needs.
type MaglevTables interface {
	// Size is the number of entries of every table (a prime).
	Size() int
	// Set replaces the table of a ServicePort in one step, so that a lookup
	// sees the old or the new table and never a mix of them, and records
	// its fingerprint.
	Set(svcID uint32, table []uint32, fingerprint uint64) error
	// Delete removes the table of a ServicePort, if there is one.
	Delete(svcID uint32) error
	// Fingerprints returns the fingerprint of every table present.
	Fingerprints() (map[uint32]uint64, error)
}

// maglevTable is the table one ServicePort must have after a sync: its
// backends (whose names place them in the table) with their ids.
type maglevTable struct {
	owner       model.ServicePortName
	svcID       uint32
	fingerprint uint64
	backends    []Backend
	ids         []uint32
}

// setMaglevTables builds and writes the tables. A table is built only
// when it is written, so that a sync that sets many holds one at a time.
func setMaglevTables(m MaglevTables, tables []maglevTable) error {
	for _, t := range tables {
		if err := setMaglevTable(m, t); err != nil {
			return err
		}
	}
	return nil
}

func setMaglevTable(m MaglevTables, t maglevTable) error {
	names := make([]string, len(t.backends))
	for i, b := range t.backends {
		names[i] = b.String()
	}
	idx, err := maglev.Build(names, m.Size())
	if err != nil {
		return fmt.Errorf("maglev table of service %d: %w", t.svcID, err)
	}
	table := make([]uint32, len(idx))
	for i, j := range idx {
		table[i] = t.ids[j]
	}
	if err := m.Set(t.svcID, table, t.fingerprint); err != nil {
		return fmt.Errorf("maglev table of service %d: %w", t.svcID, err)
	}
	return nil
}

func deleteMaglevTables(m MaglevTables, ids []uint32) error {
	for _, id := range ids {
		if err := m.Delete(id); err != nil {
			return fmt.Errorf("maglev table of service %d: %w", id, err)
		}
	}
	return nil
}

// maglevBackends returns the backends of svc's Maglev table: the endpoints
// its external frontends forward to, when it uses Maglev and has such
// frontends; else nil.
func maglevBackends(svc *model.Service) []Backend {
	if svc.Port.LBAlgorithm != model.LBMaglev || !svc.Port.ExternallyAccessible() {
		return nil
	}
	action, eps := svc.External()
	if action != model.Forward {
		return nil
	}
	out := make([]Backend, len(eps))
	for i := range eps {
		out[i] = Backend{Addr: eps[i].Addr, Port: eps[i].Port, Proto: svc.Port.Name.Protocol}
	}
	return out
}

// maglevFingerprint identifies the table of a backend set at table size m:
// equal fingerprints, equal tables (the table depends only on the backends'
// names and m).
func maglevFingerprint(bs []Backend, m int) uint64 {
	names := make([]string, len(bs))
	for i, b := range bs {
		names[i] = b.String()
	}
	slices.Sort(names)
	h := fnv.New64a()
	h.Write([]byte(strconv.Itoa(m)))
	for _, n := range names {
		h.Write([]byte{0})
		h.Write([]byte(n))
	}
	return h.Sum64()
}

// planMaglevOwner plans the Maglev table of owner, planned with svc, and
// adds its ServicePort id to wanted. A ServicePort left without frontends
// has none: its id goes with them (finishSync).
func (a *applied) planMaglevOwner(p *plan, owner model.ServicePortName, svc *model.Service, hasFrontends bool,
	wanted map[uint32]bool) {
	if a.maglev.size == 0 || !hasFrontends {
		return
	}
	bs := maglevBackends(svc)
	id := a.svcs.byOwner[owner]
	if len(bs) == 0 || id == 0 {
		return
	}
	wanted[id] = true
	fp := maglevFingerprint(bs, a.maglev.size)
	if cur, ok := a.maglev.fps[id]; ok && cur == fp {
		return
	}
	ids := make([]uint32, len(bs))
	for i, b := range bs {
		ab := a.backends.byKey[keyOf(b)]
		if ab == nil {
			p.errs = append(p.errs, fmt.Errorf("%s: maglev table of service %d: backend %s has no id", owner, id, b))
			return
		}
		ids[i] = ab.id
	}
	p.maglevSets = append(p.maglevSets, maglevTable{owner: owner, svcID: id, fingerprint: fp, backends: bs, ids: ids})
	a.maglev.fps[id] = fp
}

// planMaglevStale plans, once every ServicePort of r is planned, the
// deletion of the Maglev tables no ServicePort wants: with a full sync
// every table not planned, otherwise those of the synced ServicePorts that
// no longer have one.
func (a *applied) planMaglevStale(p *plan, r *syncRun) {
	if a.maglev.size == 0 {
		return
	}
	var stale []uint32
	if r.full {
		for id := range a.maglev.fps {
			if !r.maglevWanted[id] {
				stale = append(stale, id)
			}
		}
	} else {
		for _, owner := range r.owners {
			if id, ok := r.svcBefore[owner]; ok && !r.maglevWanted[id] {
				if _, has := a.maglev.fps[id]; has {
					stale = append(stale, id)
				}
			}
		}
	}
	slices.Sort(stale)
	stale = slices.Compact(stale)
	for _, id := range stale {
		delete(a.maglev.fps, id)
	}
	p.maglevDels = append(p.maglevDels, stale...)
}
