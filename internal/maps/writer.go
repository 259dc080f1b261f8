package maps

import (
	"errors"
	"math"
	"slices"
	"sync/atomic"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Capacities the Writer enforces before the kernel would.
const (
	// MaxBackendsPerFrontend is the largest slot count a master entry holds.
	MaxBackendsPerFrontend = math.MaxUint16
)

// SyncStats says what one Sync wrote.
type SyncStats struct {
	Frontends int // frontends written or deleted
	Writes    int // map updates and deletions
}

// Writer is the only writer of the service, backend and reverse-NAT maps.
// Each Sync plans its writes against what the maps hold (plan.go, pure) and
// then writes the plan (apply.go). It is not safe for concurrent use: the
// sync loop owns it.
type Writer struct {
	// applied is what the maps hold, kept in memory between syncs.
	applied
	m familyMaps

	// plan is the last sync's plan; its memory is reused. written is
	// the other plan of a sync in chunks, which holds the chunk being
	// written while plan takes the next.
	plan        plan
	written     plan
	needRestore bool
	// unbatched makes the next sync write entry by entry: after a map ran
	// full, so that one Service that does not fit fails alone.
	unbatched bool
	// chunkEntries is the plan size past which a sync is written in
	// chunks (syncChunkEntries; tests make it small). onChunk, set by
	// tests, is told the size of each chunk handed over for writing.
	chunkEntries int
	onChunk      func(size int)
	// entries is what Entries returns: published after every restore and
	// every successful Sync, read by metrics scrapes on other goroutines.
	entries atomic.Pointer[Entries]
}

// Entries are how many entries the maps a Writer programs hold, as the
// Writer knows them (see Writer.Entries).
type Entries struct {
	// Services counts the entries of the services map: a master entry
	// and one entry per backend slot for every frontend.
	Services int
	// Backends counts the entries of the backends map, one per backend.
	Backends int
	// RevNat counts the entries of the reverse-NAT map, including those
	// no frontend uses any more that the next sync deletes.
	RevNat int
	// Members counts the entries of the membership map, one per
	// (backend, ServicePort) pair.
	Members int
}

// Limits are the capacities of the maps, as loaded.
type Limits struct {
	Backends uint32
	RevNat   uint32
}

// NewWriter returns a Writer for the IPv4 maps m, with its applied state
// restored from whatever the maps already hold (pinned maps of an earlier
// agent), so that backend and reverse-NAT ids survive a restart. It
// programs the IPv4 addresses of the states it syncs and ignores others.
func NewWriter(m Maps, lim Limits) (*Writer, error) {
	return newFamilyWriter(m.coded(), ipv4, lim)
}

// NewWriter6 is NewWriter for the IPv6 maps m: the Writer programs the
// IPv6 addresses of the states it syncs (an IPv6 model.State) and ignores
// others. Its ids are the IPv6 maps' own, restored from them as NewWriter
// restores the IPv4 ones.
func NewWriter6(m Maps6, lim Limits) (*Writer, error) {
	return newFamilyWriter(m.coded(), ipv6, lim)
}

func newFamilyWriter(m familyMaps, fam family, lim Limits) (*Writer, error) {
	maglevSize := 0
	if m.maglev != nil {
		maglevSize = m.maglev.Size()
	}
	w := &Writer{applied: newApplied(fam, lim, m.ranges != nil, maglevSize), m: m, chunkEntries: syncChunkEntries}
	w.ports.on = m.ports != nil
	if err := w.restore(m); err != nil {
		return nil, err
	}
	w.publishEntries()
	return w, nil
}

// Sync brings the maps to the desired state of up. With up.Full every
// frontend is reconciled and any entry no ServicePort wants is removed;
// otherwise only the ServicePorts in up.Changed are.
//
// A large sync is written in chunks of ServicePorts, each make-before-break
// (planAndApply). Errors of one frontend do not stop the others; they are
// joined in the returned error. A chunk that the kernel refuses stops the
// sync: the ServicePorts of later chunks keep what they had. After an
// error the Writer re-reads the kernel maps on the next Sync, which must
// then be a full one.
func (w *Writer) Sync(up model.Update) error {
	w.plan.reset()
	full := up.Full
	if w.needRestore {
		if err := w.restore(w.m); err != nil {
			return err
		}
		// What the kernel holds, also if this sync fails again (a map
		// that ran full stays near its capacity in the metrics).
		w.publishEntries()
		w.needRestore = false
		full = true
	}
	err := w.planAndApply(up, full)
	w.unbatched = false
	if err != nil {
		w.needRestore = true
		w.plan.removed = w.plan.removed[:0]
		w.unbatched = errors.Is(err, ErrMapFull)
		return err
	}
	w.publishEntries()
	return nil
}

// planAndApply plans the sync of up and writes it, in chunks: whenever the
// plan holds chunkEntries entries, the ServicePorts planned so far are
// written and the plan starts over, and the last chunk also holds the
// deletions (see syncRun). A chunk is written while the next one is
// planned, one chunk at a time and in order: in a first sync the kernel's
// writes take about as long as the planning, which the other CPU then
// does meanwhile. It stops at the first chunk that fails to be written;
// the ServicePorts of the later chunks keep what they had (the one
// planned meanwhile is not written), and the next Sync re-reads the maps.
// The plan ends with the statistics and planning errors of the whole sync.
// An unbatched sync (the retry after a map ran full) is one chunk: it goes
// on past what fails, so that one Service that does not fit fails alone,
// which a later chunk could not do once an earlier one left out an entry
// it needs.
func (w *Writer) planAndApply(up model.Update, full bool) error {
	p, next := &w.plan, &w.written
	// w.plan is the sync's plan when it returns: the last chunk's. The
	// other one serves only within a sync in chunks.
	defer func() {
		if p != &w.plan {
			w.plan, w.written = w.written, w.plan
		}
		w.written = plan{}
	}()
	r := w.beginSync(p, up, full)
	// The sync's statistics and planning errors, of the chunks counted
	// so far; ended gives them to the plan it returns in, with err.
	var stats SyncStats
	var errs []error
	count := func() {
		stats.Frontends += p.stats.Frontends
		stats.Writes += p.stats.Writes
		errs = append(errs, p.errs...)
	}
	ended := func(err error) error {
		p.stats, p.errs = stats, errs
		return errors.Join(append(errs, err)...)
	}
	var writing chan error
	// wrote waits for the chunk being written, if any.
	wrote := func() error {
		if writing == nil {
			return nil
		}
		err := <-writing
		writing = nil
		return err
	}
	chunks := 0
	for i, owner := range r.owners {
		w.planOwner(p, &r, owner)
		if w.unbatched || p.size() < w.chunkEntries || i == len(r.owners)-1 {
			continue
		}
		count()
		if err := wrote(); err != nil {
			return ended(err)
		}
		if w.onChunk != nil {
			w.onChunk(p.size())
		}
		writing = make(chan error, 1)
		go func(p *plan, done chan<- error) { done <- apply(w.m, p, true) }(p, writing)
		p, next = next, p
		p.reset()
		chunks++
	}
	if err := wrote(); err != nil {
		count()
		return ended(err)
	}
	w.finishSync(p, &r)
	err := apply(w.m, p, !w.unbatched)
	count()
	err = ended(err)
	if chunks > 0 {
		// A sync of several chunks (a first sync, a node change) is
		// rare: the later ones are small and need not keep a chunk's
		// memory for the agent's life.
		*p = plan{removed: p.removed, stats: p.stats, errs: p.errs}
	}
	return err
}

// Entries returns how many entries the Writer's maps hold as of its last
// successful Sync, or of the last time it read them back from the kernel
// (at NewWriter, and at the Sync after a failed one). Unlike the rest of the
// Writer it is safe to call while a Sync runs: metrics scrapes call it.
// The counts come from the Writer's memory, so reading them costs no
// system call.
func (w *Writer) Entries() Entries { return *w.entries.Load() }

// publishEntries publishes the applied state's entry counts for Entries.
// They are kept as the state changes: a sync that changes one Service
// costs no pass over every frontend.
func (w *Writer) publishEntries() {
	e := Entries{Backends: len(w.backends.byKey), RevNat: w.revNats.count(), Members: len(w.members.refs),
		Services: w.serviceEntries}
	w.entries.Store(&e)
}

// Name is the proxy mode the Writer implements.
func (w *Writer) Name() string { return "ebpf" }

// Removed returns the backends the last successful Sync took out of every
// frontend and every ServicePort's endpoints: no new connection goes to
// them, and sockets still connected to them are the ones to end. An
// endpoint that is only terminating stays (see hold).
func (w *Writer) Removed() []Backend { return slices.Clone(w.plan.removed) }

// LastStats says what the last Sync wrote.
func (w *Writer) LastStats() SyncStats { return w.plan.stats }

// Counts reports how many frontends and backends are programmed.
func (w *Writer) Counts() (frontends, backends int) { return len(w.frontends), len(w.backends.byKey) }

// BackendID returns the id of a programmed backend, for tests and dumps.
func (w *Writer) BackendID(b Backend) (uint32, bool) {
	ab, ok := w.backends.byKey[keyOf(b)]
	if !ok {
		return 0, false
	}
	return ab.id, true
}
