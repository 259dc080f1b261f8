package maps

import (
	"fmt"
	"maps"
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// The ledgers of the optional and the membership maps: what each holds as
// the Writer knows it, restored from its map alone (applied.restore calls
// each), and changed by the plan. The frontends, backends, reverse NAT
// entries and ServicePort ids stay in applied, whose restore reads them
// together: a frontend's entries name the others' ids.

// rangeLedger is what the source ranges trie holds.
type rangeLedger struct {
	// on says the trie exists.
	on bool
	// byOwner are the entries written per ServicePort.
	byOwner map[model.ServicePortName]*appliedRanges
	// orphans are entries found in the kernel and not claimed since; the
	// next full sync deletes those no ServicePort wants.
	orphans map[rangeKey]struct{}
}

func (l *rangeLedger) reset() {
	l.byOwner = map[model.ServicePortName]*appliedRanges{}
	l.orphans = map[rangeKey]struct{}{}
}

// restore takes every entry of m as an orphan, claimed again by the
// ServicePorts that want them. m is nil without the trie.
func (l *rangeLedger) restore(m Map[rangeKey, uint8]) error {
	if m == nil {
		return nil
	}
	err := m.Iterate(func(k rangeKey, _ uint8) bool {
		l.orphans[k] = struct{}{}
		return true
	})
	if err != nil {
		return fmt.Errorf("restore source ranges: %w", err)
	}
	return nil
}

// maglevLedger is what the Maglev tables hold: each ServicePort's
// table's fingerprint, by ServicePort id.
type maglevLedger struct {
	// size is the entries of a table; 0 without the tables.
	size int
	fps  map[uint32]uint64
}

func (l *maglevLedger) reset() { l.fps = map[uint32]uint64{} }

// restore reads the tables' fingerprints; m is nil without the tables.
func (l *maglevLedger) restore(m MaglevTables) error {
	if m == nil {
		return nil
	}
	fps, err := m.Fingerprints()
	if err != nil {
		return fmt.Errorf("restore maglev tables: %w", err)
	}
	maps.Copy(l.fps, fps)
	return nil
}

// portLedger is the port filter map as the Writer knows it.
type portLedger struct {
	// on says the map exists.
	on     bool
	filter portFilter
}

// restore reads the filter map into the copy. m is nil without the map.
func (l *portLedger) restore(m Map[uint32, uint32]) error {
	l.filter = portFilter{}
	if m == nil {
		return nil
	}
	err := m.Iterate(func(w, bits uint32) bool {
		if w < PortFilterWords {
			l.filter.words[w] = bits
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("restore the port filter: %w", err)
	}
	return nil
}

// memberLedger is what the membership map holds: each entry with the
// number of frontends that need it.
type memberLedger struct {
	refs map[MemberKey]int
	// gc holds the entries that may have lost their last user.
	gc map[MemberKey]struct{}
}

func (l *memberLedger) reset() {
	l.refs = map[MemberKey]int{}
	l.gc = map[MemberKey]struct{}{}
}

// restore reads m's entries, unreferenced until the frontends restored
// claim them; it returns them, for the frontends to claim.
func (l *memberLedger) restore(m Map[MemberKey, uint8]) (map[MemberKey]bool, error) {
	inKernel := map[MemberKey]bool{}
	err := m.Iterate(func(k MemberKey, _ uint8) bool {
		inKernel[k] = true
		l.refs[k] = 0
		l.gc[k] = struct{}{}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("restore members: %w", err)
	}
	return inKernel, nil
}

// ref adds a user of k; it reports whether k is new, to be written.
func (l *memberLedger) ref(k MemberKey) bool {
	n := l.refs[k]
	l.refs[k] = n + 1
	return n == 0
}

// unref drops a user of k, which the next collection deletes when it was
// the last.
func (l *memberLedger) unref(k MemberKey) {
	l.refs[k]--
	if l.refs[k] <= 0 {
		l.gc[k] = struct{}{}
	}
}

// collect plans the deletion of the entries that lost their last user.
func (l *memberLedger) collect(p *plan) {
	for k := range l.gc {
		if l.refs[k] <= 0 {
			p.deleteMember(k)
			delete(l.refs, k)
		}
	}
	// Every candidate was handled: start afresh (a Go map keeps the
	// buckets of its largest size).
	l.gc = map[MemberKey]struct{}{}
}

// svcLedger are the ServicePort ids: one per ServicePort, shared by its
// frontends (the services map's svc_id, which session affinity, the
// membership entries, the source ranges and the Maglev tables are keyed
// by), counted by the frontends that carry it.
type svcLedger struct {
	byOwner map[model.ServicePortName]uint32
	owner   map[uint32]model.ServicePortName
	refs    map[uint32]int
	ids     *idAllocator
}

// reset forgets every id, keeping the allocator's capacity.
func (l *svcLedger) reset() {
	l.byOwner = map[model.ServicePortName]uint32{}
	l.owner = map[uint32]model.ServicePortName{}
	l.refs = map[uint32]int{}
	l.ids = newIDAllocator(l.ids.max)
}

// restoreRef takes id, restored from a frontend's master entry, as used
// by that frontend.
func (l *svcLedger) restoreRef(id uint32) {
	l.ids.reserve(id)
	l.ref(id)
}

// idFor returns the id of owner: the one it has, else the one its
// frontend had in the kernel (had, kept across restarts), else a new one.
func (l *svcLedger) idFor(owner model.ServicePortName, had uint32) (uint32, error) {
	if id, ok := l.byOwner[owner]; ok {
		return id, nil
	}
	id := had
	if _, taken := l.owner[id]; id == 0 || taken {
		var err error
		if id, err = l.ids.alloc(); err != nil {
			return 0, err
		}
	}
	l.byOwner[owner] = id
	l.owner[id] = owner
	return id, nil
}

// ref adds a frontend's use of id.
func (l *svcLedger) ref(id uint32) { l.refs[id]++ }

// unref drops a frontend's use of id, which is freed with its last.
func (l *svcLedger) unref(id uint32) {
	if id == 0 {
		return
	}
	l.refs[id]--
	if l.refs[id] > 0 {
		return
	}
	delete(l.refs, id)
	if owner, ok := l.owner[id]; ok {
		delete(l.byOwner, owner)
		delete(l.owner, id)
	}
	l.ids.release(id)
}

// revNatLedger are the reverse NAT entries: one per frontend address,
// port and protocol, counted by the frontends (of every kind) that share
// it.
type revNatLedger struct {
	byKey map[revNatKey]*appliedRevNat
	// gc holds the entries that may have lost their last user.
	gc map[revNatKey]struct{}
	// orphans are ids found in the kernel that no frontend uses; the
	// next sync deletes them.
	orphans []uint32
	ids     *idAllocator
}

// reset forgets every entry, keeping the allocator's capacity.
func (l *revNatLedger) reset() {
	l.byKey = map[revNatKey]*appliedRevNat{}
	l.gc = map[revNatKey]struct{}{}
	l.orphans = nil
	l.ids = newIDAllocator(l.ids.max)
}

// restore reads m's ids, none used until the frontends restored claim
// them (claim); it returns them, each false until claimed.
func (l *revNatLedger) restore(m Map[uint32, netip.AddrPort]) (map[uint32]bool, error) {
	ids := map[uint32]bool{}
	err := m.Iterate(func(id uint32, _ netip.AddrPort) bool {
		ids[id] = false
		l.ids.reserve(id)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("restore reverse NAT: %w", err)
	}
	return ids, nil
}

// claim takes the restored entry id as fe's.
func (l *revNatLedger) claim(fe Frontend, id uint32) {
	k := revNatKey{fe.Addr, fe.Port, fe.Proto}
	rn := l.byKey[k]
	if rn == nil {
		rn = &appliedRevNat{id: id}
		l.byKey[k] = rn
	}
	rn.refs++
}

// ensure returns the id of fe's entry, planning it when it is new.
func (l *revNatLedger) ensure(p *plan, fe Frontend) (uint32, error) {
	k := revNatKey{fe.Addr, fe.Port, fe.Proto}
	if rn := l.byKey[k]; rn != nil {
		return rn.id, nil
	}
	id, err := l.ids.alloc()
	if err != nil {
		return 0, err
	}
	p.putRevNat(id, fe)
	l.byKey[k] = &appliedRevNat{id: id}
	l.gc[k] = struct{}{}
	return id, nil
}

// ref adds a frontend's use of fe's entry.
func (l *revNatLedger) ref(fe Frontend) { l.byKey[revNatKey{fe.Addr, fe.Port, fe.Proto}].refs++ }

// unref drops fe's use of its entry id, which the next collection
// deletes when it was the last.
func (l *revNatLedger) unref(fe Frontend, id uint32) {
	k := revNatKey{fe.Addr, fe.Port, fe.Proto}
	if rn := l.byKey[k]; rn != nil && rn.id == id {
		rn.refs--
		l.gc[k] = struct{}{}
	}
}

// collect plans the deletion of the entries that lost their last user and
// of the orphans, and frees their ids.
func (l *revNatLedger) collect(p *plan) {
	for k := range l.gc {
		if rn := l.byKey[k]; rn != nil && rn.refs <= 0 {
			p.deleteRevNat(rn.id)
			l.ids.release(rn.id)
			delete(l.byKey, k)
		}
	}
	for _, id := range l.orphans {
		p.deleteRevNat(id)
		l.ids.release(id)
	}
	l.orphans = nil
	l.gc = map[revNatKey]struct{}{}
}

// count is the entries the map holds.
func (l *revNatLedger) count() int { return len(l.byKey) + len(l.orphans) }

// backendLedger are the backends map's entries: one per backend address,
// port and protocol, counted by the frontends and the held endpoints that
// name it.
type backendLedger struct {
	byKey map[backendKey]*appliedBackend
	// byID are the same backends by id (nil: no backend), for ids up to
	// the allocator's max: 8 bytes an id where a map took 50. An id above
	// max, restored from larger maps, is in byIDOver.
	byID     []*appliedBackend
	byIDOver map[uint32]*appliedBackend
	// gc holds backends that may have lost their last user, so a sync
	// need not scan every backend.
	gc  map[backendKey]struct{}
	ids *idAllocator
}

// reset forgets every backend, keeping the allocator's capacity.
func (l *backendLedger) reset() {
	l.byKey = map[backendKey]*appliedBackend{}
	l.byID, l.byIDOver = nil, nil
	l.gc = map[backendKey]struct{}{}
	l.ids = newIDAllocator(l.ids.max)
}

// restore reads m's backends, unreferenced until the frontends restored
// claim them (and collected if none does).
func (l *backendLedger) restore(m Map[uint32, backendEntry]) error {
	err := m.Iterate(func(id uint32, v backendEntry) bool {
		k := keyOf(v.b)
		ab := &appliedBackend{k: k, id: id, flags: v.flags}
		l.byKey[k] = ab
		l.ids.reserve(id)
		l.index(ab)
		l.gc[k] = struct{}{}
		return true
	})
	if err != nil {
		return fmt.Errorf("restore backends: %w", err)
	}
	return nil
}

// byIDOf returns the backend with id, or nil.
func (l *backendLedger) byIDOf(id uint32) *appliedBackend {
	if int(id) < len(l.byID) {
		return l.byID[id]
	}
	return l.byIDOver[id]
}

// index makes ab found by its id.
func (l *backendLedger) index(ab *appliedBackend) {
	if ab.id > l.ids.max {
		if l.byIDOver == nil {
			l.byIDOver = map[uint32]*appliedBackend{}
		}
		l.byIDOver[ab.id] = ab
		return
	}
	for len(l.byID) <= int(ab.id) {
		l.byID = append(l.byID, nil)
	}
	l.byID[ab.id] = ab
}

// unindex forgets id's backend.
func (l *backendLedger) unindex(id uint32) {
	if int(id) < len(l.byID) {
		l.byID[id] = nil
		return
	}
	delete(l.byIDOver, id)
}

// ensure returns b's state (its id), planning its entry when it is new or
// its flags changed. A new backend starts without references: the caller
// takes one (upsert, hold), or, when it fails first, hands it to the
// garbage collection (unused). A first sync of 100,000 backends thus does
// not list every one of them as a candidate for deletion.
func (l *backendLedger) ensure(p *plan, b Backend, flags uint8) (*appliedBackend, error) {
	k := keyOf(b)
	ab := l.byKey[k]
	if ab != nil && ab.flags == flags {
		return ab, nil
	}
	if ab == nil {
		id, err := l.ids.alloc()
		if err != nil {
			return nil, err
		}
		ab = &appliedBackend{k: k, id: id}
		l.byKey[k] = ab
		l.index(ab)
	}
	p.putBackend(ab.id, b, flags)
	ab.flags = flags
	return ab, nil
}

// unused hands b to the next collection if nothing holds it.
func (l *backendLedger) unused(b Backend) {
	k := keyOf(b)
	if ab := l.byKey[k]; ab != nil && ab.refs <= 0 {
		l.gc[k] = struct{}{}
	}
}

// unrefID drops one reference to the backend with id, which the next
// collection deletes when it was the last.
func (l *backendLedger) unrefID(id uint32) {
	if ab := l.byIDOf(id); ab != nil {
		ab.refs--
		if ab.refs <= 0 {
			l.gc[ab.k] = struct{}{}
		}
	}
}

// collect plans the deletion of the backends that lost their last user,
// and frees their ids.
func (l *backendLedger) collect(p *plan) {
	for k := range l.gc {
		if ab := l.byKey[k]; ab != nil && ab.refs <= 0 {
			p.deleteBackend(ab.id, k.backend())
			l.ids.release(ab.id)
			l.unindex(ab.id)
			delete(l.byKey, k)
		}
	}
	// Every candidate was handled: start afresh, because a Go map keeps
	// the buckets of its largest size and a full sync fills it with
	// every new backend.
	l.gc = map[backendKey]struct{}{}
}
