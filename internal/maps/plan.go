package maps

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// plan is what one sync writes to the maps, computed from the desired state
// and the applied one without touching the kernel. Its fields are in the
// order apply writes them, make-before-break: first what entries will point
// at (source ranges, backends, reverse NAT, memberships, Maglev tables),
// then the service entries (a frontend's slots before its master entry),
// then the deletions (a removed frontend's master entry before its slots),
// and last the deletion of what no service entry points at any more.
type plan struct {
	portPuts    entries[uint32, uint32]
	rangePuts   []rangeKey
	backendPuts entries[uint32, backendEntry]
	revNatPuts  entries[uint32, netip.AddrPort]
	memberPuts  entries[MemberKey, uint8]
	maglevSets  []maglevTable
	servicePuts entries[serviceKey, ServiceValue]
	serviceDels []serviceKey
	maglevDels  []uint32
	memberDels  []MemberKey
	backendDels []uint32
	revNatDels  []uint32
	rangeDels   []rangeKey

	// changes say which service entries belong to which frontend, for an
	// apply that writes frontend by frontend.
	changes []frontendChange
	// removed are the backends the plan deletes, removed[i] the one with
	// id backendDels[i] (see Writer.Removed).
	removed []Backend
	stats   SyncStats
	// errs are what could not be planned: a frontend or a ServicePort
	// that is left as it was, while the rest of the plan holds.
	errs []error
}

// entries are key and value pairs in the order they are written, kept as
// two slices that batch updates take as they are.
type entries[K comparable, V any] struct {
	keys   []K
	values []V
}

func (e *entries[K, V]) add(k K, v V) {
	e.keys = append(e.keys, k)
	e.values = append(e.values, v)
}

func (e *entries[K, V]) reset() { e.keys, e.values = e.keys[:0], e.values[:0] }

// grow makes room for n more entries.
func (e *entries[K, V]) grow(n int) {
	e.keys, e.values = slices.Grow(e.keys, n), slices.Grow(e.values, n)
}

// frontendChange is one frontend's share of a plan's service entries: the
// puts servicePuts[puts[0]:puts[1]] (its slots, then its master entry) and
// the deletions serviceDels[dels[0]:dels[1]] (its surplus slots; or, when
// it is removed, its master entry and then its slots).
type frontendChange struct {
	fe         Frontend
	owner      model.ServicePortName
	puts, dels [2]int
	// prev is what the frontend held before (nil when it is new), next
	// what it holds after (nil when it is removed).
	prev, next *appliedFrontend
}

// planKeepEntries is the number of entries up to which a plan keeps its
// memory for the next sync. A larger plan, such as the first sync of
// 10,000 Services (about 12 MiB of entries), is let go: later syncs are
// mostly small, and would otherwise keep that memory for the agent's life.
const planKeepEntries = 1 << 14

// syncChunkEntries is the size of plan past which Writer.Sync writes the
// ServicePorts planned so far before it plans more: a first sync of
// 10,000 Services would otherwise hold a plan of all of their entries at
// once, the largest part of the agent's peak memory. Half of
// planKeepEntries, so that a chunk that ends with a large Service still
// keeps its memory for the next chunk.
const syncChunkEntries = planKeepEntries / 2

// size counts p's entries, the large parts of its memory.
func (p *plan) size() int {
	return len(p.servicePuts.keys) + len(p.backendPuts.keys) + len(p.memberPuts.keys) + len(p.serviceDels) +
		len(p.memberDels) + len(p.changes)
}

// reset empties p for the next sync, keeping its memory unless it held
// more than planKeepEntries entries.
func (p *plan) reset() {
	if p.size() > planKeepEntries {
		*p = plan{}
		return
	}
	p.portPuts.reset()
	p.rangePuts = p.rangePuts[:0]
	p.backendPuts.reset()
	p.revNatPuts.reset()
	p.memberPuts.reset()
	clear(p.maglevSets)
	p.maglevSets = p.maglevSets[:0]
	p.servicePuts.reset()
	p.serviceDels = p.serviceDels[:0]
	p.maglevDels = p.maglevDels[:0]
	p.memberDels = p.memberDels[:0]
	p.backendDels = p.backendDels[:0]
	p.revNatDels = p.revNatDels[:0]
	p.rangeDels = p.rangeDels[:0]
	clear(p.changes)
	p.changes = p.changes[:0]
	p.removed = p.removed[:0]
	p.stats = SyncStats{}
	p.errs = nil
}

// The plan's writes. Each counts in the sync's statistics, whether or not
// it then reaches the kernel, as the Writer always counted them.

func (p *plan) putBackend(id uint32, b Backend, flags uint8) {
	p.stats.Writes++
	p.backendPuts.add(id, backendEntry{b, flags})
}

func (p *plan) putRevNat(id uint32, fe Frontend) {
	p.stats.Writes++
	p.revNatPuts.add(id, netip.AddrPortFrom(fe.Addr, fe.Port))
}

func (p *plan) putMember(k MemberKey) {
	p.stats.Writes++
	p.memberPuts.add(k, 1)
}

func (p *plan) putService(k serviceKey, v ServiceValue) {
	p.stats.Writes++
	p.servicePuts.add(k, v)
}

func (p *plan) deleteService(k serviceKey) {
	p.stats.Writes++
	p.serviceDels = append(p.serviceDels, k)
}

func (p *plan) deleteMember(k MemberKey) {
	p.stats.Writes++
	p.memberDels = append(p.memberDels, k)
}

func (p *plan) deleteBackend(id uint32, b Backend) {
	p.stats.Writes++
	p.backendDels = append(p.backendDels, id)
	p.removed = append(p.removed, b)
}

func (p *plan) deleteRevNat(id uint32) {
	p.stats.Writes++
	p.revNatDels = append(p.revNatDels, id)
}

func (p *plan) putRange(k rangeKey) {
	p.stats.Writes++
	p.rangePuts = append(p.rangePuts, k)
}

func (p *plan) deleteRange(k rangeKey) {
	p.stats.Writes++
	p.rangeDels = append(p.rangeDels, k)
}

// syncRun is what one sync's planning carries from a ServicePort to the
// next, and across the chunks Writer.Sync writes it in: each chunk's plan
// holds the writes of some ServicePorts, and only the last one the
// deletions of what no ServicePort wants (finishSync). Until then nothing
// that a frontend of an earlier chunk points at is deleted: a backend the
// first chunk wrote stays for the later chunks that share it, and a
// frontend that moves from one ServicePort to another is taken over where
// it stands. So every chunk is make-before-break as a whole plan is.
// Writer.planAndApply drives it: beginSync, planOwner for each owner, and
// finishSync.
type syncRun struct {
	up     model.Update
	full   bool
	owners []model.ServicePortName
	// svcBefore are the ServicePort ids of the owners as the sync began.
	svcBefore map[model.ServicePortName]uint32
	// desired are the frontends planned so far; newOwned the owners'.
	desired  map[Frontend]bool
	newOwned map[model.ServicePortName][]Frontend
	// maglevWanted are the ServicePort ids that have a Maglev table.
	maglevWanted map[uint32]bool
}

// beginSync starts planning a sync of up into p.
func (a *applied) beginSync(p *plan, up model.Update, full bool) syncRun {
	r := syncRun{up: up, full: full, owners: a.owners(up, full),
		desired: map[Frontend]bool{}, newOwned: map[model.ServicePortName][]Frontend{},
		maglevWanted: map[uint32]bool{}}
	if full && len(a.frontends) == 0 {
		a.presize(p, up)
	}
	r.svcBefore = make(map[model.ServicePortName]uint32, len(r.owners))
	for _, owner := range r.owners {
		if id, ok := a.svcs.byOwner[owner]; ok {
			r.svcBefore[owner] = id
		}
	}
	return r
}

// planOwner adds to p the writes of one ServicePort of r: its frontends,
// the backends it holds, its source ranges and its Maglev table.
func (a *applied) planOwner(p *plan, r *syncRun, owner model.ServicePortName) {
	up := r.up
	svc := up.State.Services[owner]
	if svc == nil {
		a.planRanges(p, owner, nil, nil)
		a.hold(p, owner, nil, "")
		return
	}
	ds := frontendsOf(svc, &up.State.Node, a.fam)
	sortFrontends(ds)
	for _, d := range ds {
		if r.desired[d.fe] {
			p.errs = append(p.errs, fmt.Errorf("%s: frontend %s is already used by another Service port", owner, d.fe))
			continue
		}
		if cur := a.frontends[d.fe]; cur != nil && cur.owner != (model.ServicePortName{}) && cur.owner != owner {
			if _, stillThere := up.State.Services[cur.owner]; stillThere && !slices.Contains(r.owners, cur.owner) {
				p.errs = append(p.errs, fmt.Errorf("%s: frontend %s is already used by %s", owner, d.fe, cur.owner))
				continue
			}
		}
		r.desired[d.fe] = true
		r.newOwned[owner] = append(r.newOwned[owner], d.fe)
		if err := a.upsert(p, d); err != nil {
			p.errs = append(p.errs, fmt.Errorf("%s: frontend %s: %w", owner, d.fe, err))
		}
	}
	if err := a.hold(p, owner, svc, up.State.Node.Name); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", owner, err))
	}
	a.planRanges(p, owner, svc, &up.State.Node)
	a.planMaglevOwner(p, owner, svc, len(r.newOwned[owner]) > 0, r.maglevWanted)
}

// finishSync adds to p, after the writes of every ServicePort of r, the
// deletions: break after make, what the synced ServicePorts no longer have
// and what no service entry points at any more.
func (a *applied) finishSync(p *plan, r *syncRun) {
	var stale []Frontend
	if r.full {
		for fe := range a.frontends {
			if !r.desired[fe] {
				stale = append(stale, fe)
			}
		}
	} else {
		for _, owner := range r.owners {
			for _, fe := range a.byOwner[owner] {
				if !r.desired[fe] && a.frontends[fe] != nil && a.frontends[fe].owner == owner {
					stale = append(stale, fe)
				}
			}
		}
	}
	slices.SortFunc(stale, Frontend.compare)
	for _, fe := range stale {
		a.deleteFrontend(p, fe)
	}
	for _, owner := range r.owners {
		if fes := r.newOwned[owner]; len(fes) > 0 {
			a.byOwner[owner] = fes
		} else {
			delete(a.byOwner, owner)
		}
	}
	a.collectGarbage(p)
	a.planMaglevStale(p, r)
	if r.full {
		a.planOrphanRanges(p)
	}
}

// owners are the ServicePorts a sync plans, in the model's order: those
// changed, or with full every one in the state or in the maps.
func (a *applied) owners(up model.Update, full bool) []model.ServicePortName {
	if !full {
		return model.SortedNames(up.Changed)
	}
	owners := make([]model.ServicePortName, 0, len(up.State.Services))
	for spn := range up.State.Services {
		owners = append(owners, spn)
	}
	for spn := range a.byOwner {
		if _, ok := up.State.Services[spn]; !ok {
			owners = append(owners, spn)
		}
	}
	for spn := range a.held {
		_, inState := up.State.Services[spn]
		if _, owned := a.byOwner[spn]; !inState && !owned {
			owners = append(owners, spn)
		}
	}
	slices.SortFunc(owners, model.ServicePortName.Compare)
	return owners
}

// presize makes room, before a sync that starts from empty maps (a node's
// first), for what it is about to write:
// one frontend, reverse-NAT entry and ServicePort id per ServicePort and a
// backend, slot and membership per endpoint (more for Services with
// several frontends). A first sync of 10,000 Services otherwise grows the
// plan's slices and the applied state's maps step by step, copying them
// each time: a third of its time went to faulting in and copying that
// memory, and the copies left behind raised the agent's peak. Maps that
// already hold entries (restored ids) are left to grow as they need.
func (a *applied) presize(p *plan, up model.Update) {
	svcs, eps := len(up.State.Services), 0
	for _, svc := range up.State.Services {
		eps += len(svc.Endpoints)
	}
	p.servicePuts.grow(min(svcs+eps, syncChunkEntries))
	p.backendPuts.grow(min(eps, syncChunkEntries))
	p.memberPuts.grow(min(eps, syncChunkEntries))
	p.revNatPuts.grow(min(svcs, syncChunkEntries))
	p.changes = slices.Grow(p.changes, min(svcs, syncChunkEntries))
	sized(&a.frontends, svcs)
	sized(&a.byOwner, svcs)
	sized(&a.held, svcs)
	sized(&a.svcs.byOwner, svcs)
	sized(&a.svcs.owner, svcs)
	sized(&a.svcs.refs, svcs)
	sized(&a.revNats.byKey, svcs)
	sized(&a.backends.byKey, eps)
	if len(a.backends.byID) == 0 {
		a.backends.byID = make([]*appliedBackend, 0, min(eps, int(a.backends.ids.max))+1)
	}
	sized(&a.members.refs, eps)
	a.svcs.ids.presize(svcs)
	a.revNats.ids.presize(svcs)
	a.backends.ids.presize(eps)
}

// sized replaces *m, when it is empty, with a map with room for n entries.
func sized[K comparable, V any](m *map[K]V, n int) {
	if len(*m) == 0 {
		*m = make(map[K]V, n)
	}
}

// upsert plans one frontend: its new backends, its reverse-NAT entry and
// memberships (written before anything names them), then the slots, then
// the master entry with the new count, and only then the deletion of
// surplus slots. A lookup at any moment sees either the old or the new
// backend set, never a slot pointing nowhere.
func (a *applied) upsert(p *plan, d desiredFrontend) error {
	err := a.upsertFrontend(p, d)
	if err != nil {
		// The backends it made that nothing holds go with this sync's
		// garbage (backendLedger.ensure leaves them to the caller).
		for _, b := range d.backends {
			a.backends.unused(b)
		}
	}
	return err
}

func (a *applied) upsertFrontend(p *plan, d desiredFrontend) error {
	if len(d.backends) > MaxBackendsPerFrontend {
		return fmt.Errorf("%d endpoints, more than the %d a frontend can hold", len(d.backends), MaxBackendsPerFrontend)
	}
	a.planPort(p, d.fe, d.flags)
	prev := a.frontends[d.fe]
	cur := prev
	if cur == nil {
		cur = &appliedFrontend{}
	}

	ids := make([]uint32, len(d.backends))
	abs := a.scratch[:0]
	defer func() { clear(abs); a.scratch = abs[:0] }()
	for i, b := range d.backends {
		ab, err := a.backends.ensure(p, b, d.bflags[i])
		if err != nil {
			return fmt.Errorf("backend %s: %w", b, err)
		}
		ids[i] = ab.id
		abs = append(abs, ab)
	}

	revNat := cur.revNat
	if revNat == 0 {
		id, err := a.revNats.ensure(p, d.fe)
		if err != nil {
			return fmt.Errorf("reverse NAT: %w", err)
		}
		revNat = id
	}
	svc, err := a.svcs.idFor(d.owner, cur.svcID)
	if err != nil {
		return fmt.Errorf("service port id: %w", err)
	}

	// Affinity and a UDP socket's earlier choice may only return to a
	// backend the ServicePort can choose: the membership entries of new
	// backends exist before any slot names them.
	match := ids
	for _, id := range ids {
		if cur.svcID == svc && slices.Contains(cur.matchIDs, id) {
			continue
		}
		a.refMatch(p, MemberKey{BackendId: id, SvcId: svc})
	}

	change := frontendChange{fe: d.fe, owner: d.owner, prev: prev}
	change.puts[0] = len(p.servicePuts.keys)
	if cur.hasMaster && cur.affinity != 0 && cur.svcID != svc {
		// The frontend moves to another ServicePort (its ClusterIP or
		// port given to a new Service in the same sync): the new slots
		// name backends that are no members of the old ServicePort, so
		// affinity is off until the master entry names the new one.
		p.putService(d.fe.key(0), ServiceValue{Count: uint16(min(cur.count, len(cur.slots))), Flags: cur.flags,
			RevNatId: cur.revNat, SvcId: cur.svcID})
	}
	slots := arrangeSlots(cur.slots[:min(cur.count, len(cur.slots))], ids)
	for i, id := range slots {
		if i < len(cur.slots) && cur.slots[i] == id && cur.revNat == revNat {
			continue
		}
		p.putService(d.fe.key(uint16(i+1)), ServiceValue{BackendId: id, RevNatId: revNat})
	}
	master := ServiceValue{Count: uint16(len(slots)), Flags: d.flags, RevNatId: revNat, AffinityTimeout: d.affinity, SvcId: svc}
	if !cur.hasMaster || cur.count != len(slots) || cur.flags != d.flags || cur.affinity != d.affinity || cur.revNat != revNat || cur.svcID != svc {
		p.putService(d.fe.key(0), master)
	}
	change.puts[1] = len(p.servicePuts.keys)
	change.dels[0] = len(p.serviceDels)
	for i := len(slots); i < len(cur.slots); i++ {
		p.deleteService(d.fe.key(uint16(i + 1)))
	}
	change.dels[1] = len(p.serviceDels)

	for i, id := range cur.slots {
		if i < cur.count && id != 0 {
			a.backends.unrefID(id)
		}
	}
	for _, ab := range abs {
		ab.refs++
	}
	if !cur.hasMaster || cur.revNat != revNat {
		a.revNats.ref(d.fe)
	}
	for _, id := range cur.matchIDs {
		if cur.svcID != svc || !slices.Contains(match, id) {
			a.unrefMatch(MemberKey{BackendId: id, SvcId: cur.svcID})
		}
	}
	if cur.svcID != svc {
		a.svcs.ref(svc)
		a.svcs.unref(cur.svcID)
	}
	next := &appliedFrontend{
		owner: d.owner, hasMaster: true, revNat: revNat, flags: d.flags,
		affinity: d.affinity, slots: slots, count: len(slots),
		svcID: svc, matchIDs: slices.Clone(match),
	}
	a.frontends[d.fe] = next
	a.serviceEntries += next.entries() - cur.entries()
	if change.puts[0] != change.puts[1] || change.dels[0] != change.dels[1] {
		change.next = next
		p.changes = append(p.changes, change)
	}
	p.stats.Frontends++
	return nil
}

// arrangeSlots orders ids so that a backend keeps the slot it had when that
// slot still exists: fewer writes, and a client that raced with the update
// gets the same backend either way.
func arrangeSlots(old, ids []uint32) []uint32 {
	out := make([]uint32, len(ids))
	want := make(map[uint32]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	placed := map[uint32]bool{}
	for i, id := range old {
		if i < len(out) && want[id] && !placed[id] {
			out[i] = id
			placed[id] = true
		}
	}
	j := 0
	for _, id := range ids {
		if placed[id] {
			continue
		}
		for out[j] != 0 {
			j++
		}
		out[j] = id
		placed[id] = true
	}
	return out
}

func (a *applied) refMatch(p *plan, k MemberKey) {
	if a.members.ref(k) {
		p.putMember(k)
	}
}

// deleteFrontend plans the removal of fe: the master entry first, so that
// new lookups miss at once, then the slots.
func (a *applied) deleteFrontend(p *plan, fe Frontend) {
	cur := a.frontends[fe]
	change := frontendChange{fe: fe, owner: cur.owner, prev: cur}
	change.puts = [2]int{len(p.servicePuts.keys), len(p.servicePuts.keys)}
	change.dels[0] = len(p.serviceDels)
	if cur.hasMaster {
		p.deleteService(fe.key(0))
	}
	for i := range cur.slots {
		p.deleteService(fe.key(uint16(i + 1)))
	}
	change.dels[1] = len(p.serviceDels)
	p.changes = append(p.changes, change)

	for i, id := range cur.slots {
		if i < cur.count && id != 0 {
			a.backends.unrefID(id)
		}
	}
	for _, id := range cur.matchIDs {
		a.unrefMatch(MemberKey{BackendId: id, SvcId: cur.svcID})
	}
	a.svcs.unref(cur.svcID)
	if cur.hasMaster && cur.revNat != 0 {
		a.revNats.unref(fe, cur.revNat)
	}
	delete(a.frontends, fe)
	a.serviceEntries -= cur.entries()
	p.stats.Frontends++
}

// collectGarbage plans the deletion of the backends, reverse-NAT entries
// and memberships that lost their last user, and frees their ids: they go
// after every service entry that named them.
func (a *applied) collectGarbage(p *plan) {
	a.backends.collect(p)
	a.revNats.collect(p)
	a.members.collect(p)
}
