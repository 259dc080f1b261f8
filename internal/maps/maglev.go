package maps

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maglev"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// MaglevTables is the part of the Maglev tables map (lb4_maglev_v1, a hash
// of arrays keyed by ServicePort id, with a fingerprint of each table
// beside it) the Writer needs.
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

// maglevTable is the table one ServicePort must have after a sync.
type maglevTable struct {
	svcID       uint32
	fingerprint uint64
	backends    []Backend
}

// maglevQueue holds a sync's table changes until the queues are flushed:
// tables are set once the backends they name exist and deleted before
// backends are.
type maglevQueue struct {
	m    MaglevTables
	sets []maglevTable
	dels []uint32
	// ids maps a backend to its id when the tables are built.
	ids func(Backend) (uint32, bool)
	// applied is updated as the kernel confirms each change.
	applied map[uint32]uint64
}

func (q *maglevQueue) reset() { q.sets, q.dels = q.sets[:0], q.dels[:0] }

func (q *maglevQueue) flushSets() error {
	if q.m == nil {
		return nil
	}
	for _, t := range q.sets {
		names := make([]string, len(t.backends))
		ids := make([]uint32, len(t.backends))
		for i, b := range t.backends {
			id, ok := q.ids(b)
			if !ok {
				return fmt.Errorf("maglev table of service %d: backend %s has no id", t.svcID, b)
			}
			names[i], ids[i] = b.String(), id
		}
		idx, err := maglev.Build(names, q.m.Size())
		if err != nil {
			return fmt.Errorf("maglev table of service %d: %w", t.svcID, err)
		}
		table := make([]uint32, len(idx))
		for i, j := range idx {
			table[i] = ids[j]
		}
		if err := q.m.Set(t.svcID, table, t.fingerprint); err != nil {
			return fmt.Errorf("maglev table of service %d: %w", t.svcID, err)
		}
		q.applied[t.svcID] = t.fingerprint
	}
	return nil
}

func (q *maglevQueue) flushDeletes() error {
	if q.m == nil {
		return nil
	}
	for _, id := range q.dels {
		if err := q.m.Delete(id); err != nil {
			return fmt.Errorf("maglev table of service %d: %w", id, err)
		}
		delete(q.applied, id)
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

// planMaglev queues the table changes of a sync. before holds the
// ServicePort ids the synced owners had before it; after a full sync every
// table not wanted is deleted.
func (w *Writer) planMaglev(owners []model.ServicePortName, up model.Update, before map[model.ServicePortName]uint32, full bool) {
	q := w.q.maglev
	if q.m == nil {
		return
	}
	m := q.m.Size()
	wanted := map[uint32]bool{}
	for _, owner := range owners {
		svc := up.State.Services[owner]
		if svc == nil {
			continue
		}
		bs := maglevBackends(svc)
		id := w.ownerSvc[owner]
		if len(bs) == 0 || id == 0 {
			continue
		}
		wanted[id] = true
		fp := maglevFingerprint(bs, m)
		if cur, ok := q.applied[id]; ok && cur == fp {
			continue
		}
		q.sets = append(q.sets, maglevTable{svcID: id, fingerprint: fp, backends: bs})
	}
	var stale []uint32
	if full {
		for id := range q.applied {
			if !wanted[id] {
				stale = append(stale, id)
			}
		}
	} else {
		for _, owner := range owners {
			if id, ok := before[owner]; ok && !wanted[id] {
				if _, has := q.applied[id]; has {
					stale = append(stale, id)
				}
			}
		}
	}
	slices.Sort(stale)
	q.dels = slices.Compact(stale)
}
