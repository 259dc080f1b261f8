package maps

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// errNeedsUnwritten is why an unbatched apply leaves a frontend as it was.
var errNeedsUnwritten = errors.New("left as it was: an entry it needs could not be written")

// apply writes p to m in its order (see plan). Batched, it writes each
// class in batches and stops at the first failure, so that what worked
// before keeps working. Unbatched (the retry after a map ran full), it
// writes entry by entry and goes on after a failure, leaving as they were
// only the frontends that need what could not be written: one Service that
// does not fit fails alone.
func apply(m familyMaps, p *plan, batched bool) (err error) {
	if len(p.backendDels)+len(p.memberDels) > 0 {
		// After the deletions, also those of a failed apply.
		defer func() { err = errors.Join(err, stampRemoval(m)) }()
	}
	// The LPM trie takes no batches: single writes, before the
	// frontends that use them.
	var errs []error
	for _, k := range p.rangePuts {
		if err := m.ranges.Put(k, 1); err != nil {
			errs = append(errs, fmt.Errorf("source range %s: %w", describeRangeKey(k), err))
		}
	}
	if batched {
		if err := applyBatched(m, p); err != nil {
			return errors.Join(append(errs, err)...)
		}
	} else {
		errs = append(errs, applyUnbatched(m, p)...)
	}
	for _, k := range p.rangeDels {
		if err := m.ranges.Delete(k); err != nil {
			errs = append(errs, fmt.Errorf("delete source range %s: %w", describeRangeKey(k), err))
		}
	}
	return errors.Join(errs...)
}

func applyBatched(m familyMaps, p *plan) error {
	for _, step := range [...]struct {
		what string
		do   func() error
	}{
		{"port filter", func() error { return putBatches(m.ports, &p.portPuts) }},
		{"backends", func() error { return putBatches(m.backends, &p.backendPuts) }},
		{"reverse NAT", func() error { return putBatches(m.revNat, &p.revNatPuts) }},
		{"members", func() error { return putBatches(m.members, &p.memberPuts) }},
		{"maglev tables", func() error { return setMaglevTables(m.maglev, p.maglevSets) }},
		{"services", func() error { return putBatches(m.services, &p.servicePuts) }},
		{"services", func() error { return deleteBatches(m.services, p.serviceDels) }},
		{"maglev tables", func() error { return deleteMaglevTables(m.maglev, p.maglevDels) }},
		{"members", func() error { return deleteBatches(m.members, p.memberDels) }},
		{"backends", func() error { return deleteBatches(m.backends, p.backendDels) }},
		{"reverse NAT", func() error { return deleteBatches(m.revNat, p.revNatDels) }},
	} {
		if err := step.do(); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
	}
	return nil
}

// failures are what an unbatched apply could not write, and what it must
// not delete because of them: the entries that frontends left as they were
// still name.
type failures struct {
	backends, revNats map[uint32]bool
	members           map[MemberKey]bool
	// owners are the ServicePorts whose Maglev table was not written.
	owners map[model.ServicePortName]bool

	keepBackends, keepRevNats map[uint32]bool
	keepMembers               map[MemberKey]bool
}

func mark[K comparable](m *map[K]bool, k K) {
	if *m == nil {
		*m = map[K]bool{}
	}
	(*m)[k] = true
}

// blocks reports whether a frontend that is to hold next needs an entry
// that could not be written.
func (f *failures) blocks(next *appliedFrontend) bool {
	if len(f.backends)+len(f.revNats)+len(f.members) == 0 {
		return false
	}
	if f.revNats[next.revNat] {
		return true
	}
	for _, id := range next.slots {
		if f.backends[id] || f.members[MemberKey{BackendId: id, SvcId: next.svcID}] {
			return true
		}
	}
	return false
}

// keep protects what a frontend left as it was still names.
func (f *failures) keep(prev *appliedFrontend) {
	if prev == nil {
		return
	}
	for i, id := range prev.slots {
		if i < prev.count && id != 0 {
			mark(&f.keepBackends, id)
		}
	}
	for _, id := range prev.matchIDs {
		mark(&f.keepMembers, MemberKey{BackendId: id, SvcId: prev.svcID})
	}
	if prev.revNat != 0 {
		mark(&f.keepRevNats, prev.revNat)
	}
}

// applyUnbatched writes p entry by entry, in the same order as a batched
// apply, and returns what failed.
func applyUnbatched(m familyMaps, p *plan) []error {
	var errs []error
	var f failures
	// A word that fails leaves its new frontends unreachable from outside
	// until the retry, and nothing that worked before.
	for i, w := range p.portPuts.keys {
		if err := m.ports.Put(w, p.portPuts.values[i]); err != nil {
			errs = append(errs, fmt.Errorf("port filter word %d: %w", w, err))
		}
	}
	for i, id := range p.backendPuts.keys {
		v := p.backendPuts.values[i]
		if err := m.backends.Put(id, v); err != nil {
			errs = append(errs, fmt.Errorf("backend %s: %w", v.b, err))
			mark(&f.backends, id)
		}
	}
	for i, id := range p.revNatPuts.keys {
		if err := m.revNat.Put(id, p.revNatPuts.values[i]); err != nil {
			errs = append(errs, fmt.Errorf("reverse NAT %d: %w", id, err))
			mark(&f.revNats, id)
		}
	}
	for i, k := range p.memberPuts.keys {
		if err := m.members.Put(k, p.memberPuts.values[i]); err != nil {
			errs = append(errs, fmt.Errorf("membership %+v: %w", k, err))
			mark(&f.members, k)
		}
	}
	for _, t := range p.maglevSets {
		if slices.ContainsFunc(t.ids, func(id uint32) bool { return f.backends[id] }) {
			mark(&f.owners, t.owner)
			continue
		}
		if err := setMaglevTable(m.maglev, t); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.owner, err))
			mark(&f.owners, t.owner)
		}
	}

	failed := make([]bool, len(p.changes))
	for i := range p.changes {
		c := &p.changes[i]
		if c.next == nil {
			continue
		}
		var err error
		if f.blocks(c.next) {
			err = errNeedsUnwritten
		}
		for j := c.puts[0]; j < c.puts[1] && err == nil; j++ {
			err = m.services.Put(p.servicePuts.keys[j], p.servicePuts.values[j])
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: frontend %s: %w", c.owner, c.fe, err))
			failed[i] = true
			f.keep(c.prev)
		}
	}
	for i := range p.changes {
		c := &p.changes[i]
		if failed[i] {
			continue
		}
		for j := c.dels[0]; j < c.dels[1]; j++ {
			if err := m.services.Delete(p.serviceDels[j]); err != nil {
				errs = append(errs, fmt.Errorf("delete frontend %s: %w", c.fe, err))
				f.keep(c.prev)
				break
			}
		}
	}
	if len(f.owners) > 0 {
		// A Maglev table left as it was names backends its frontends
		// had before.
		for i := range p.changes {
			if f.owners[p.changes[i].owner] {
				f.keep(p.changes[i].prev)
			}
		}
	}

	for _, id := range p.maglevDels {
		if err := m.maglev.Delete(id); err != nil {
			errs = append(errs, fmt.Errorf("maglev table of service %d: %w", id, err))
		}
	}
	for _, k := range p.memberDels {
		if f.keepMembers[k] {
			continue
		}
		if err := m.members.Delete(k); err != nil {
			errs = append(errs, fmt.Errorf("delete membership %+v: %w", k, err))
		}
	}
	for i, id := range p.backendDels {
		if f.keepBackends[id] {
			continue
		}
		if err := m.backends.Delete(id); err != nil {
			errs = append(errs, fmt.Errorf("delete backend %s: %w", p.removed[i], err))
		}
	}
	for _, id := range p.revNatDels {
		if f.keepRevNats[id] {
			continue
		}
		if err := m.revNat.Delete(id); err != nil {
			errs = append(errs, fmt.Errorf("delete reverse NAT %d: %w", id, err))
		}
	}
	return errs
}

// stampRemoval records in m's removal map that backends or memberships
// were deleted in this second: the TC and XDP programs then check every
// tracked flow in full for the rest of it, so that a flow to a removed
// backend is reset at its next packet (bpf/lib/nodeport.h np_orig_fresh).
func stampRemoval(m familyMaps) error {
	if m.removedAt == nil {
		return nil
	}
	var ts unix.Timespec
	// The programs' clock (ct.h ct_now): the same second, tick for tick.
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return fmt.Errorf("read the clock for the removal stamp: %w", err)
	}
	if err := m.removedAt.Put(m.removedKey, uint32(ts.Sec)); err != nil {
		return fmt.Errorf("removal stamp: %w", err)
	}
	return nil
}
