package maps

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Capacities the Writer enforces before the kernel would.
const (
	// MaxBackendsPerFrontend is the largest slot count a master entry holds.
	MaxBackendsPerFrontend = math.MaxUint16
)

type appliedFrontend struct {
	// owner is unknown (zero) for a frontend restored from the kernel until
	// a sync claims it.
	owner     model.ServicePortName
	hasMaster bool
	revNat    uint32
	flags     uint16
	affinity  uint32
	// slots[i] is the backend id in slot i+1 (0 if the slot is missing).
	// It may be longer than count when restored slots exceed the master's.
	slots []uint32
	count int
	// svcID names the frontend's ServicePort for session affinity.
	svcID uint32
	// matchIDs are the backends for which this frontend holds a
	// membership entry: all of its backends.
	matchIDs []uint32
}

type appliedBackend struct {
	id    uint32
	flags uint8
	refs  int
}

type revNatKey struct {
	addr  netip.Addr
	port  uint16
	proto model.Protocol
}

type appliedRevNat struct {
	id   uint32
	refs int
}

// SyncStats says what one Sync wrote.
type SyncStats struct {
	Frontends int // frontends written or deleted
	Writes    int // map updates and deletions
}

// Writer is the only writer of the service, backend and reverse-NAT maps.
// It is not safe for concurrent use: the sync loop owns it.
type Writer struct {
	m Maps

	frontends map[Frontend]*appliedFrontend
	byOwner   map[model.ServicePortName][]Frontend
	backends  map[Backend]*appliedBackend
	byID      map[uint32]Backend
	revNats   map[revNatKey]*appliedRevNat
	// gc holds backends and reverse-NAT entries that may have lost their
	// last user, so a sync need not scan every backend.
	gcBackends map[Backend]struct{}
	gcRevNats  map[revNatKey]struct{}
	// orphanRevNats are reverse-NAT ids found in the kernel that no
	// frontend uses; the next sync deletes them.
	orphanRevNats []uint32

	// ServicePort ids: one per ServicePort, shared by its frontends.
	ownerSvc map[model.ServicePortName]uint32
	svcOwner map[uint32]model.ServicePortName
	svcRefs  map[uint32]int
	// Membership entries, counted by the frontends that need them.
	matchRefs map[MemberKey]int
	gcMatch   map[MemberKey]struct{}
	// ranges are the source ranges written per ServicePort.
	ranges map[model.ServicePortName]*appliedRanges
	// held are the backends each ServicePort keeps for the endpoints its
	// EndpointSlices list (see hold).
	held map[model.ServicePortName][]Backend

	backendIDs, revNatIDs, svcIDs *idAllocator
	needRestore                   bool
	stats                         SyncStats

	// removed are the backends the last sync took out of every frontend.
	removed []Backend

	// q queues a sync's writes so that they reach the kernel in batches.
	q queues
	// unbatched makes the next sync write entry by entry: after a map ran
	// full, so that one Service that does not fit fails alone.
	unbatched bool
}

// Limits are the capacities of the maps, as loaded.
type Limits struct {
	Backends uint32
	RevNat   uint32
}

// NewWriter returns a Writer for m, with its applied state restored from
// whatever the maps already hold (pinned maps of an earlier agent), so that
// backend and reverse-NAT ids survive a restart.
func NewWriter(m Maps, lim Limits) (*Writer, error) {
	w := &Writer{m: m, q: newQueues(m)}
	w.q.maglev.ids = func(b Backend) (uint32, bool) {
		ab := w.backends[b]
		if ab == nil {
			return 0, false
		}
		return ab.id, true
	}
	w.backendIDs = newIDAllocator(lim.Backends)
	w.revNatIDs = newIDAllocator(lim.RevNat)
	// A ServicePort has at least one frontend, so there are no more
	// ServicePorts than reverse-NAT entries.
	w.svcIDs = newIDAllocator(lim.RevNat)
	if err := w.restore(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) reset() {
	w.frontends = map[Frontend]*appliedFrontend{}
	w.byOwner = map[model.ServicePortName][]Frontend{}
	w.backends = map[Backend]*appliedBackend{}
	w.byID = map[uint32]Backend{}
	w.revNats = map[revNatKey]*appliedRevNat{}
	w.gcBackends = map[Backend]struct{}{}
	w.gcRevNats = map[revNatKey]struct{}{}
	w.orphanRevNats = nil
	w.ownerSvc = map[model.ServicePortName]uint32{}
	w.svcOwner = map[uint32]model.ServicePortName{}
	w.svcRefs = map[uint32]int{}
	w.matchRefs = map[MemberKey]int{}
	w.gcMatch = map[MemberKey]struct{}{}
	w.ranges = map[model.ServicePortName]*appliedRanges{}
	w.held = map[model.ServicePortName][]Backend{}
	w.backendIDs = newIDAllocator(w.backendIDs.max)
	w.revNatIDs = newIDAllocator(w.revNatIDs.max)
	w.svcIDs = newIDAllocator(w.svcIDs.max)
}

// restore rebuilds the applied state from the kernel maps.
func (w *Writer) restore() error {
	w.reset()
	byID := w.byID
	err := w.m.Backends.Iterate(func(id uint32, v BackendValue) bool {
		b := Backend{Addr: addrFromBE32(v.Address), Port: portFromBE16(v.Port), Proto: model.Protocol(v.Proto)}
		w.backends[b] = &appliedBackend{id: id, flags: v.Flags}
		w.backendIDs.reserve(id)
		byID[id] = b
		w.gcBackends[b] = struct{}{}
		return true
	})
	if err != nil {
		return fmt.Errorf("restore backends: %w", err)
	}
	revNatIDs := map[uint32]bool{}
	err = w.m.RevNat.Iterate(func(id uint32, _ RevNatValue) bool {
		revNatIDs[id] = false
		w.revNatIDs.reserve(id)
		return true
	})
	if err != nil {
		return fmt.Errorf("restore reverse NAT: %w", err)
	}
	type slotEntry struct {
		fe   Frontend
		slot int
		id   uint32
	}
	var slotEntries []slotEntry
	err = w.m.Services.Iterate(func(k ServiceKey, v ServiceValue) bool {
		fe := Frontend{Addr: addrFromBE32(k.Address), Port: portFromBE16(k.Dport), Proto: model.Protocol(k.Proto), Scope: k.Scope}
		af := w.frontends[fe]
		if af == nil {
			af = &appliedFrontend{}
			w.frontends[fe] = af
		}
		if k.Slot != 0 {
			slotEntries = append(slotEntries, slotEntry{fe, int(k.Slot), v.BackendId})
			return true
		}
		af.hasMaster = true
		af.revNat = v.RevNatId
		af.flags = v.Flags
		af.affinity = v.AffinityTimeout
		af.count = int(v.Count)
		af.svcID = v.SvcId
		return true
	})
	if err != nil {
		return fmt.Errorf("restore services: %w", err)
	}
	inKernel := map[MemberKey]bool{}
	err = w.m.Members.Iterate(func(k MemberKey, _ uint8) bool {
		inKernel[k] = true
		w.matchRefs[k] = 0
		w.gcMatch[k] = struct{}{}
		return true
	})
	if err != nil {
		return fmt.Errorf("restore members: %w", err)
	}
	clear(w.q.maglev.applied)
	if w.m.Maglev != nil {
		fps, err := w.m.Maglev.Fingerprints()
		if err != nil {
			return fmt.Errorf("restore maglev tables: %w", err)
		}
		maps.Copy(w.q.maglev.applied, fps)
	}
	for _, s := range slotEntries {
		af := w.frontends[s.fe]
		for len(af.slots) < s.slot {
			af.slots = append(af.slots, 0)
		}
		af.slots[s.slot-1] = s.id
	}
	for fe, af := range w.frontends {
		for len(af.slots) < af.count {
			af.slots = append(af.slots, 0)
		}
		for i, id := range af.slots {
			b, ok := byID[id]
			if !ok || i >= af.count {
				continue
			}
			w.backends[b].refs++
		}
		if af.svcID != 0 {
			w.svcIDs.reserve(af.svcID)
			w.svcRefs[af.svcID]++
		}
		if af.hasMaster {
			for _, id := range af.slots[:min(af.count, len(af.slots))] {
				k := MemberKey{BackendId: id, SvcId: af.svcID}
				if inKernel[k] {
					af.matchIDs = append(af.matchIDs, id)
					w.matchRefs[k]++
				}
			}
		}
		if af.hasMaster {
			if _, ok := revNatIDs[af.revNat]; ok {
				k := revNatKey{fe.Addr, fe.Port, fe.Proto}
				rn := w.revNats[k]
				if rn == nil {
					rn = &appliedRevNat{id: af.revNat}
					w.revNats[k] = rn
				}
				rn.refs++
				revNatIDs[af.revNat] = true
			} else {
				// A master without its reverse entry: rewrite both.
				af.revNat = 0
			}
		}
	}
	for id, used := range revNatIDs {
		if !used {
			w.orphanRevNats = append(w.orphanRevNats, id)
		}
	}
	w.needRestore = false
	return nil
}

// Sync brings the maps to the desired state of up. With up.Full every
// frontend is reconciled and any entry no ServicePort wants is removed;
// otherwise only the ServicePorts in up.Changed are.
//
// Errors of one frontend do not stop the others; they are joined in the
// returned error. After an error the Writer re-reads the kernel maps on the
// next Sync, which must then be a full one.
func (w *Writer) Sync(up model.Update) error {
	w.stats = SyncStats{}
	w.removed = w.removed[:0]
	w.q.setBatched(!w.unbatched)
	w.q.reset()
	full := up.Full
	if w.needRestore {
		if err := w.restore(); err != nil {
			return err
		}
		full = true
	}

	var owners []model.ServicePortName
	if full {
		for spn := range up.State.Services {
			owners = append(owners, spn)
		}
		for spn := range w.byOwner {
			if _, ok := up.State.Services[spn]; !ok {
				owners = append(owners, spn)
			}
		}
		for spn := range w.held {
			_, inState := up.State.Services[spn]
			if _, owned := w.byOwner[spn]; !inState && !owned {
				owners = append(owners, spn)
			}
		}
	} else {
		for spn := range up.Changed {
			owners = append(owners, spn)
		}
	}
	slices.SortFunc(owners, model.ServicePortName.Compare)
	svcBefore := make(map[model.ServicePortName]uint32, len(owners))
	for _, owner := range owners {
		if id, ok := w.ownerSvc[owner]; ok {
			svcBefore[owner] = id
		}
	}

	var errs []error
	desired := map[Frontend]bool{}
	newOwned := map[model.ServicePortName][]Frontend{}
	var staleRanges []SourceRangeKey
	for _, owner := range owners {
		svc := up.State.Services[owner]
		if svc == nil {
			stale, err := w.syncRanges(owner, nil, nil)
			staleRanges = append(staleRanges, stale...)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", owner, err))
			}
			if err := w.hold(owner, nil, ""); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", owner, err))
			}
			continue
		}
		ds := frontendsOf(svc, &up.State.Node)
		sortFrontends(ds)
		for _, d := range ds {
			if desired[d.fe] {
				errs = append(errs, fmt.Errorf("%s: frontend %s is already used by another Service port", owner, d.fe))
				continue
			}
			if cur := w.frontends[d.fe]; cur != nil && cur.owner != (model.ServicePortName{}) && cur.owner != owner {
				if _, stillThere := up.State.Services[cur.owner]; stillThere && !slices.Contains(owners, cur.owner) {
					errs = append(errs, fmt.Errorf("%s: frontend %s is already used by %s", owner, d.fe, cur.owner))
					continue
				}
			}
			desired[d.fe] = true
			newOwned[owner] = append(newOwned[owner], d.fe)
			if err := w.upsert(d); err != nil {
				errs = append(errs, fmt.Errorf("%s: frontend %s: %w", owner, d.fe, err))
			}
		}
		if err := w.hold(owner, svc, up.State.Node.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", owner, err))
		}
		// The ranges go in before the queued frontends that use them.
		stale, err := w.syncRanges(owner, svc, &up.State.Node)
		staleRanges = append(staleRanges, stale...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", owner, err))
		}
	}

	// Break after make: remove what the synced ServicePorts no longer have.
	var stale []Frontend
	if full {
		for fe := range w.frontends {
			if !desired[fe] {
				stale = append(stale, fe)
			}
		}
	} else {
		for _, owner := range owners {
			for _, fe := range w.byOwner[owner] {
				if !desired[fe] && w.frontends[fe] != nil && w.frontends[fe].owner == owner {
					stale = append(stale, fe)
				}
			}
		}
	}
	slices.SortFunc(stale, Frontend.compare)
	for _, fe := range stale {
		if err := w.deleteFrontend(fe); err != nil {
			errs = append(errs, fmt.Errorf("delete frontend %s: %w", fe, err))
		}
	}
	for _, owner := range owners {
		if fes := newOwned[owner]; len(fes) > 0 {
			w.byOwner[owner] = fes
		} else {
			delete(w.byOwner, owner)
		}
	}
	if err := w.collectGarbage(); err != nil {
		errs = append(errs, err)
	}
	w.planMaglev(owners, up, svcBefore, full)
	if err := w.q.flush(); err != nil {
		errs = append(errs, err)
	} else if err := w.deleteRanges(staleRanges, full); err != nil {
		errs = append(errs, err)
	}
	w.unbatched = false
	if len(errs) > 0 {
		w.needRestore = true
		w.removed = w.removed[:0]
		err := errors.Join(errs...)
		w.unbatched = errors.Is(err, ErrMapFull)
		return err
	}
	return nil
}

// Name is the proxy mode the Writer implements.
func (w *Writer) Name() string { return "ebpf" }

// Removed returns the backends the last successful Sync took out of every
// frontend and every ServicePort's endpoints: no new connection goes to
// them, and sockets still connected to them are the ones to end. An
// endpoint that is only terminating stays (see hold).
func (w *Writer) Removed() []Backend { return slices.Clone(w.removed) }

// LastStats says what the last Sync wrote.
func (w *Writer) LastStats() SyncStats { return w.stats }

func (w *Writer) put(k ServiceKey, v ServiceValue) error {
	w.stats.Writes++
	return w.q.services.put(k, v)
}

func (w *Writer) del(k ServiceKey) error {
	w.stats.Writes++
	return w.q.services.del(k)
}

// upsert writes one frontend: backends first, then its reverse-NAT entry,
// then the slots, then the master entry with the new count, and only then
// removes surplus slots. A lookup at any moment sees either the old or the
// new backend set, never a slot pointing nowhere.
func (w *Writer) upsert(d desiredFrontend) error {
	if len(d.backends) > MaxBackendsPerFrontend {
		return fmt.Errorf("%d endpoints, more than the %d a frontend can hold", len(d.backends), MaxBackendsPerFrontend)
	}
	cur := w.frontends[d.fe]
	if cur == nil {
		cur = &appliedFrontend{}
	}

	ids := make([]uint32, len(d.backends))
	for i, b := range d.backends {
		id, err := w.ensureBackend(b, d.bflags[i])
		if err != nil {
			return fmt.Errorf("backend %s: %w", b, err)
		}
		ids[i] = id
	}

	revNat := cur.revNat
	if revNat == 0 {
		id, err := w.ensureRevNat(d.fe)
		if err != nil {
			return fmt.Errorf("reverse NAT: %w", err)
		}
		revNat = id
	}
	svc, err := w.svcIDFor(d.owner, cur.svcID)
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
		if err := w.refMatch(MemberKey{BackendId: id, SvcId: svc}); err != nil {
			return fmt.Errorf("membership: %w", err)
		}
	}

	slots := arrangeSlots(cur.slots[:min(cur.count, len(cur.slots))], ids)
	for i, id := range slots {
		if i < len(cur.slots) && cur.slots[i] == id && cur.revNat == revNat {
			continue
		}
		if err := w.put(d.fe.key(uint16(i+1)), ServiceValue{BackendId: id, RevNatId: revNat}); err != nil {
			return fmt.Errorf("slot %d: %w", i+1, err)
		}
	}
	master := ServiceValue{Count: uint16(len(slots)), Flags: d.flags, RevNatId: revNat, AffinityTimeout: d.affinity, SvcId: svc}
	if !cur.hasMaster || cur.count != len(slots) || cur.flags != d.flags || cur.affinity != d.affinity || cur.revNat != revNat || cur.svcID != svc {
		if err := w.put(d.fe.key(0), master); err != nil {
			return fmt.Errorf("master entry: %w", err)
		}
	}
	for i := len(slots); i < len(cur.slots); i++ {
		if err := w.del(d.fe.key(uint16(i + 1))); err != nil {
			return fmt.Errorf("surplus slot %d: %w", i+1, err)
		}
	}

	for i, id := range cur.slots {
		if i < cur.count && id != 0 {
			w.unrefBackendID(id)
		}
	}
	for _, b := range d.backends {
		w.backends[b].refs++
	}
	if !cur.hasMaster || cur.revNat != revNat {
		w.revNats[revNatKey{d.fe.Addr, d.fe.Port, d.fe.Proto}].refs++
	}
	for _, id := range cur.matchIDs {
		if cur.svcID != svc || !slices.Contains(match, id) {
			w.unrefMatch(MemberKey{BackendId: id, SvcId: cur.svcID})
		}
	}
	if cur.svcID != svc {
		w.svcRefs[svc]++
		w.unrefSvc(cur.svcID)
	}
	w.frontends[d.fe] = &appliedFrontend{
		owner: d.owner, hasMaster: true, revNat: revNat, flags: d.flags,
		affinity: d.affinity, slots: slots, count: len(slots),
		svcID: svc, matchIDs: slices.Clone(match),
	}
	w.stats.Frontends++
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

func (w *Writer) ensureBackend(b Backend, flags uint8) (uint32, error) {
	ab := w.backends[b]
	if ab != nil && ab.flags == flags {
		return ab.id, nil
	}
	if ab == nil {
		id, err := w.backendIDs.alloc()
		if err != nil {
			return 0, err
		}
		ab = &appliedBackend{id: id}
		w.backends[b] = ab
		w.byID[id] = b
		w.gcBackends[b] = struct{}{}
	}
	w.stats.Writes++
	if err := w.q.backends.put(ab.id, BackendValue{Address: be32(b.Addr), Port: be16(b.Port), Proto: uint8(b.Proto), Flags: flags}); err != nil {
		return 0, err
	}
	ab.flags = flags
	return ab.id, nil
}

func (w *Writer) unrefBackendID(id uint32) {
	b, ok := w.byID[id]
	if !ok {
		return
	}
	ab := w.backends[b]
	ab.refs--
	if ab.refs <= 0 {
		w.gcBackends[b] = struct{}{}
	}
}

func (w *Writer) ensureRevNat(fe Frontend) (uint32, error) {
	k := revNatKey{fe.Addr, fe.Port, fe.Proto}
	if rn := w.revNats[k]; rn != nil {
		return rn.id, nil
	}
	id, err := w.revNatIDs.alloc()
	if err != nil {
		return 0, err
	}
	w.stats.Writes++
	if err := w.q.revNat.put(id, RevNatValue{Address: be32(fe.Addr), Port: be16(fe.Port)}); err != nil {
		w.revNatIDs.release(id)
		return 0, err
	}
	w.revNats[k] = &appliedRevNat{id: id}
	w.gcRevNats[k] = struct{}{}
	return id, nil
}

// deleteFrontend removes the master entry first, so that new lookups miss
// at once, then the slots.
func (w *Writer) deleteFrontend(fe Frontend) error {
	cur := w.frontends[fe]
	if cur.hasMaster {
		if err := w.del(fe.key(0)); err != nil {
			return err
		}
	}
	for i := range cur.slots {
		if err := w.del(fe.key(uint16(i + 1))); err != nil {
			return err
		}
	}
	for i, id := range cur.slots {
		if i < cur.count && id != 0 {
			w.unrefBackendID(id)
		}
	}
	for _, id := range cur.matchIDs {
		w.unrefMatch(MemberKey{BackendId: id, SvcId: cur.svcID})
	}
	w.unrefSvc(cur.svcID)
	if cur.hasMaster && cur.revNat != 0 {
		k := revNatKey{fe.Addr, fe.Port, fe.Proto}
		if rn := w.revNats[k]; rn != nil && rn.id == cur.revNat {
			rn.refs--
			w.gcRevNats[k] = struct{}{}
		}
	}
	delete(w.frontends, fe)
	w.stats.Frontends++
	return nil
}

func (w *Writer) collectGarbage() error {
	var errs []error
	for b := range w.gcBackends {
		ab := w.backends[b]
		if ab != nil && ab.refs <= 0 {
			w.stats.Writes++
			if err := w.q.backends.del(ab.id); err != nil {
				errs = append(errs, fmt.Errorf("delete backend %s: %w", b, err))
				continue
			}
			w.backendIDs.release(ab.id)
			delete(w.byID, ab.id)
			delete(w.backends, b)
			w.removed = append(w.removed, b)
		}
		delete(w.gcBackends, b)
	}
	for k := range w.gcRevNats {
		rn := w.revNats[k]
		if rn != nil && rn.refs <= 0 {
			w.stats.Writes++
			if err := w.q.revNat.del(rn.id); err != nil {
				errs = append(errs, fmt.Errorf("delete reverse NAT %d: %w", rn.id, err))
				continue
			}
			w.revNatIDs.release(rn.id)
			delete(w.revNats, k)
		}
		delete(w.gcRevNats, k)
	}
	for k := range w.gcMatch {
		if w.matchRefs[k] <= 0 {
			w.stats.Writes++
			if err := w.q.match.del(k); err != nil {
				errs = append(errs, fmt.Errorf("delete membership %+v: %w", k, err))
				continue
			}
			delete(w.matchRefs, k)
		}
		delete(w.gcMatch, k)
	}
	for _, id := range w.orphanRevNats {
		w.stats.Writes++
		if err := w.q.revNat.del(id); err != nil {
			errs = append(errs, fmt.Errorf("delete orphan reverse NAT %d: %w", id, err))
			continue
		}
		w.revNatIDs.release(id)
	}
	w.orphanRevNats = nil
	// Every candidate was handled: start afresh, because a Go map keeps
	// the buckets of its largest size and a full sync fills these with
	// every new backend.
	w.gcBackends = map[Backend]struct{}{}
	w.gcRevNats = map[revNatKey]struct{}{}
	w.gcMatch = map[MemberKey]struct{}{}
	return errors.Join(errs...)
}

// svcIDFor returns the id of the ServicePort owner: the one it has, else
// the one its frontend had in the kernel (kept across restarts), else a new
// one.
func (w *Writer) svcIDFor(owner model.ServicePortName, had uint32) (uint32, error) {
	if id, ok := w.ownerSvc[owner]; ok {
		return id, nil
	}
	id := had
	if _, taken := w.svcOwner[id]; id == 0 || taken {
		var err error
		if id, err = w.svcIDs.alloc(); err != nil {
			return 0, err
		}
	}
	w.ownerSvc[owner] = id
	w.svcOwner[id] = owner
	return id, nil
}

func (w *Writer) unrefSvc(id uint32) {
	if id == 0 {
		return
	}
	w.svcRefs[id]--
	if w.svcRefs[id] > 0 {
		return
	}
	delete(w.svcRefs, id)
	if owner, ok := w.svcOwner[id]; ok {
		delete(w.ownerSvc, owner)
		delete(w.svcOwner, id)
	}
	w.svcIDs.release(id)
}

func (w *Writer) refMatch(k MemberKey) error {
	if w.matchRefs[k] == 0 {
		w.stats.Writes++
		if err := w.q.match.put(k, 1); err != nil {
			return err
		}
	}
	w.matchRefs[k]++
	return nil
}

func (w *Writer) unrefMatch(k MemberKey) {
	w.matchRefs[k]--
	if w.matchRefs[k] <= 0 {
		w.gcMatch[k] = struct{}{}
	}
}

// Counts reports how many frontends and backends are programmed.
func (w *Writer) Counts() (frontends, backends int) { return len(w.frontends), len(w.backends) }

// BackendID returns the id of a programmed backend, for tests and dumps.
func (w *Writer) BackendID(b Backend) (uint32, bool) {
	ab, ok := w.backends[b]
	if !ok {
		return 0, false
	}
	return ab.id, true
}
