package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Results of a pinned map's migration (MapMigration.Result), also the
// result label of ebpfproxy_bpf_map_migrations_total.
const (
	// MigrationResized: same layout, another size or allocation (a hash
	// map preallocated before); every entry copied.
	MigrationResized = "resized"
	// MigrationConverted: an older layout, every entry converted by a
	// registered Migration.
	MigrationConverted = "converted"
	// MigrationRecreated: an older layout of a map in rebuiltMaps, which
	// starts empty.
	MigrationRecreated = "recreated"
	// MigrationKept: the entries did not fit the new size; the old map
	// is kept, at its old size, and serves on (MapMigration.Err says why).
	MigrationKept = "kept"
	// MigrationCarried: an LRU map the programs write, resized, after the
	// new programs attached: the entries the earlier programs wrote to
	// the old map after the copy (Entries), carried over; Err, if some
	// could not be (a full map).
	MigrationCarried = "carried"
)

// MapMigration reports what the loader did with one pinned map that did
// not match the layout or size being loaded.
type MapMigration struct {
	// Map is the map's name in the layout being loaded; From is the pin
	// its entries came from (Map unless the name changed).
	Map, From string
	// Result is one of the Migration* results.
	Result string
	// Entries is the number of entries carried over.
	Entries int
	// Old and New describe the pinned map and the one wanted.
	Old, New string
	// Err is why the old map was kept (MigrationKept), else nil.
	Err error
}

// mapShape is what the kernel compares when a program adopts a pinned map.
type mapShape struct {
	Type                                  ebpf.MapType
	KeySize, ValueSize, MaxEntries, Flags uint32
}

func (s mapShape) String() string {
	return fmt.Sprintf("%s, key %d B, value %d B, %d entries, flags %#x", s.Type, s.KeySize, s.ValueSize, s.MaxEntries, s.Flags)
}

func shapeOfSpec(ms *ebpf.MapSpec) mapShape {
	s := mapShape{ms.Type, ms.KeySize, ms.ValueSize, ms.MaxEntries, ms.Flags}
	if ms.Type == ebpf.HashOfMaps || ms.Type == ebpf.ArrayOfMaps {
		// The kernel stores a map's id: what the ELF leaves out.
		s.ValueSize = 4
	}
	return s
}

func shapeOfMap(m *ebpf.Map) mapShape {
	return mapShape{m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), m.Flags()}
}

// sameLayout says whether entries of old can be copied as they are into a
// map of shape want: another size, or (for a hash map) preallocated where
// the new one is not or the other way round, takes a copy.
func sameLayout(old, want mapShape) bool {
	old.MaxEntries = want.MaxEntries
	if old.Type == ebpf.Hash || old.Type == ebpf.HashOfMaps {
		old.Flags = old.Flags&^unix.BPF_F_NO_PREALLOC | want.Flags&unix.BPF_F_NO_PREALLOC
	}
	return old == want
}

// copyable are the map types whose entries the loader can read and write
// back: plain key/value maps and maps of maps (their values are other
// maps). Per-CPU, device and socket storage maps are not.
var copyable = []ebpf.MapType{ebpf.Hash, ebpf.LRUHash, ebpf.Array, ebpf.LPMTrie, ebpf.HashOfMaps, ebpf.ArrayOfMaps}

// migrateAction is what becomes of a pinned map.
type migrateAction int

const (
	// adopt: the pin fits, or there is none; the load adopts or creates it.
	adopt migrateAction = iota
	resize
	convert
	recreate
)

func (a migrateAction) String() string {
	return [...]string{"adopt", "resize", "convert", "recreate"}[a]
}

// migratePlan is the decision for one map of the layout being loaded.
type migratePlan struct {
	name   string
	action migrateAction
	// from is the pin the entries come from; empty for adopt.
	from     string
	old, new mapShape
	// convert is the registered migration (action convert).
	convert *Migration
	// stale are pins of an older name whose entries already moved (an
	// upgrade stopped between renaming the new pin in place and removing
	// the old one): they are removed.
	stale []string
}

// planMap decides what to do for the map name, wanted in shape want, given
// the shapes of the pins found (by name), the registered migrations and
// whether the map's contents are rebuilt when lost. It returns an error
// wrapping ErrPinnedMapMismatch when the pinned map can be neither adopted
// nor migrated.
//
// innerStale says that the pinned map is a map of maps whose inner maps
// have another shape than the new layout's (a new --maglev-table-size):
// they cannot be copied, and the map starts empty for the agent to fill
// again.
func planMap(name string, want mapShape, pins map[string]mapShape, reg []Migration, rebuilt, innerStale bool) (migratePlan, error) {
	p := migratePlan{name: name, new: want}
	old, pinned := pins[name]
	if pinned && innerStale {
		p.action, p.from, p.old = recreate, name, old
		return p, nil
	}
	if pinned {
		for _, m := range reg {
			if m.To == name && m.From != name {
				if _, ok := pins[m.From]; ok && !slices.Contains(p.stale, m.From) {
					p.stale = append(p.stale, m.From)
				}
			}
		}
		if old == want || devmapFlagsOnly(old, want) {
			return p, nil
		}
		p.from, p.old = name, old
		if sameLayout(old, want) {
			switch {
			case slices.Contains(copyable, old.Type):
				p.action = resize
			case rebuilt:
				p.action = recreate
			default:
				return p, fmt.Errorf("%w: %s is %s, the new layout wants %s, and a map of type %s cannot be copied",
					ErrPinnedMapMismatch, name, old, want, old.Type)
			}
			return p, nil
		}
		if i := slices.IndexFunc(reg, func(m Migration) bool {
			return m.From == name && m.To == name && m.KeySize == old.KeySize && m.ValueSize == old.ValueSize
		}); i >= 0 {
			p.action, p.convert = convert, &reg[i]
			return p, nil
		}
		if rebuilt {
			p.action = recreate
			return p, nil
		}
		return p, fmt.Errorf("%w: %s is %s, the new layout wants %s, and no migration is registered for it",
			ErrPinnedMapMismatch, name, old, want)
	}
	var unmatched []string
	for i, m := range reg {
		if m.To != name || m.From == name {
			continue
		}
		old, ok := pins[m.From]
		if !ok {
			continue
		}
		if old.KeySize != m.KeySize || old.ValueSize != m.ValueSize {
			unmatched = append(unmatched, fmt.Sprintf("%s is %s, the migration to %s reads key %d B, value %d B", m.From, old, name, m.KeySize, m.ValueSize))
			continue
		}
		p.action, p.from, p.old, p.convert = convert, m.From, old, &reg[i]
		return p, nil
	}
	if len(unmatched) > 0 {
		return p, fmt.Errorf("%w: %s: no migration fits: %v", ErrPinnedMapMismatch, name, unmatched)
	}
	return p, nil
}

// devmapFlagsOnly says whether old and want differ only by
// BPF_F_RDONLY_PROG on a device map, which the kernel sets by itself.
func devmapFlagsOnly(old, want mapShape) bool {
	if want.Type != ebpf.DevMap && want.Type != ebpf.DevMapHash {
		return false
	}
	old.Flags &^= unix.BPF_F_RDONLY_PROG
	return old == want
}

// pinMigration is the migration of a collection's pinned maps under way:
// new maps, filled and pinned under temporary names, that replace the old
// pins (by rename, which is atomic) once the programs using them loaded.
// Until then, the old pins and the programs running with them are
// untouched.
type pinMigration struct {
	dir string
	// replacements are the new maps, by name, for
	// CollectionOptions.MapReplacements.
	replacements map[string]*ebpf.Map
	// temps are their temporary pins, by name.
	temps map[string]string
	// remove are old pins to remove at commit: older names.
	remove  []string
	reports []MapMigration
	// carries are the LRU maps resized, which the running programs may
	// still write until the new ones attach.
	carries []carry
}

// carry is an LRU map the programs write (connection tracking, socket
// reverse NAT, affinity) that a migration copied into a map of another
// size: the earlier agent's programs go on writing the old map from the
// copy until the new programs attach. What they wrote then (a flow that
// started in that moment) is carried over once they are attached
// (carryOver).
type carry struct {
	name     string
	from, to *ebpf.Map
}

// carryOver copies the entries of each carry's old map that its new map
// lacks (never overwriting what the new programs wrote), releases the
// maps, and reports each map to migrated (if set) as MigrationCarried.
func carryOver(cs []carry, migrated func(MapMigration)) {
	for _, c := range cs {
		rep := MapMigration{Map: c.name, From: c.name, Result: MigrationCarried}
		var errs []error
		var k, v []byte
		it := c.from.Iterate()
		for it.Next(&k, &v) {
			err := c.to.Update(k, v, ebpf.UpdateNoExist)
			switch {
			case err == nil:
				rep.Entries++
			case errors.Is(err, ebpf.ErrKeyExist):
			default:
				errs = append(errs, err)
			}
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("read the old map: %w", err))
		}
		if len(errs) > 0 {
			rep.Err = fmt.Errorf("carry %d entries of %s over: %w", len(errs), c.name, errs[0])
		}
		rep.Old, rep.New = shapeOfMap(c.from).String(), shapeOfMap(c.to).String()
		if migrated != nil {
			migrated(rep)
		}
	}
	closeCarries(cs)
}

func closeCarries(cs []carry) {
	for _, c := range cs {
		c.from.Close()
		c.to.Close()
	}
}

// errMigrationPending is migratePins' answer, asked to adopt only, when a
// pinned map must migrate.
var errMigrationPending = errors.New("pinned maps must migrate")

// tempPin is where a migrated map waits for its programs to load: a name
// no map has (a C identifier has no "-"; bpffs refuses names with ".").
func tempPin(dir, name string) string { return filepath.Join(dir, "migrating-"+name) }

// migratePins prepares the migration of every map of spec pinned by name
// under dir that does not match spec: it plans every map first (so that
// an unmigratable map changes nothing), then copies or converts the
// entries into new maps. A state map whose entries do not fit its new
// size is kept as it is: spec is patched to its old size, and the report
// says so. The caller commits after loading with the replacements, or
// aborts. With adoptOnly, a map that would migrate (or a stale pin to
// remove) makes it return errMigrationPending having changed nothing.
func migratePins(spec *ebpf.CollectionSpec, dir string, adoptOnly bool) (*pinMigration, error) {
	reg := registeredMigrations()
	pm := &pinMigration{dir: dir, replacements: map[string]*ebpf.Map{}, temps: map[string]string{}}
	open := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range open {
			m.Close()
		}
	}()
	pins := map[string]mapShape{}
	lookup := func(name string) error {
		if _, done := pins[name]; done {
			return nil
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open pinned map %s: %w", filepath.Join(dir, name), err)
		}
		open[name] = m
		pins[name] = shapeOfMap(m)
		return nil
	}
	var names []string
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var plans []migratePlan
	for _, name := range names {
		if err := lookup(name); err != nil {
			return nil, err
		}
		for _, m := range reg {
			if m.To == name && m.From != name {
				if err := lookup(m.From); err != nil {
					return nil, err
				}
			}
		}
		innerStale := false
		if m := open[name]; m != nil && spec.Maps[name].InnerMap != nil {
			var err error
			if innerStale, err = innerMapStale(m, spec.Maps[name].InnerMap); err != nil {
				return nil, err
			}
		}
		p, err := planMap(name, shapeOfSpec(spec.Maps[name]), pins, reg, rebuiltMaps[name], innerStale)
		if err != nil {
			return nil, fmt.Errorf("pinned under %s (run with --cleanup to start afresh, which loses every id): %w", dir, err)
		}
		plans = append(plans, p)
	}
	// A map that describes another one starts empty with it.
	for i, p := range plans {
		if j := slices.IndexFunc(plans, func(q migratePlan) bool { return q.name == rebuiltWith[p.name] }); j < 0 || plans[j].action != recreate {
			continue
		}
		if old, ok := pins[p.name]; ok && p.action != recreate {
			plans[i] = migratePlan{name: p.name, action: recreate, from: p.name, old: old, new: p.new, stale: p.stale}
		}
	}
	if adoptOnly && slices.ContainsFunc(plans, func(p migratePlan) bool { return p.action != adopt || len(p.stale) > 0 }) {
		return nil, errMigrationPending
	}
	for _, p := range plans {
		pm.remove = append(pm.remove, p.stale...)
		if p.action == adopt {
			continue
		}
		if err := pm.migrate(spec, p, open[p.from]); err != nil {
			pm.abort()
			return nil, err
		}
	}
	return pm, nil
}

// migrate makes the new map of p from the pinned map old.
func (pm *pinMigration) migrate(spec *ebpf.CollectionSpec, p migratePlan, old *ebpf.Map) error {
	ms := spec.Maps[p.name].Copy()
	ms.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return fmt.Errorf("create %s to migrate the pinned map into: %w", p.name, err)
	}
	rep := MapMigration{Map: p.name, From: p.from, Old: p.old.String(), New: p.new.String()}
	switch {
	case p.action == resize:
		rep.Result = MigrationResized
		rep.Entries, err = copyEntries(old, m, nil)
		if err != nil {
			// Never lose what the old map holds: the programs load
			// with it, at its old size, and the agent serves on.
			m.Close()
			spec.Maps[p.name].MaxEntries = p.old.MaxEntries
			rep.Result, rep.Entries = MigrationKept, 0
			rep.Err = fmt.Errorf("the entries of %s do not fit %d entries, so it keeps its %d: %w", p.name, p.new.MaxEntries, p.old.MaxEntries, err)
			pm.reports = append(pm.reports, rep)
			return nil
		}
		if old.Type() == ebpf.LRUHash {
			if err := pm.keepCarry(p.name, old, m); err != nil {
				m.Close()
				return err
			}
		}
	case p.action == convert && p.convert.Convert != nil:
		rep.Result = MigrationConverted
		if rep.Entries, err = copyEntries(old, m, p.convert.Convert); err != nil {
			m.Close()
			return fmt.Errorf("%w: convert %s (%s) into %s (%s): %w", ErrPinnedMapMismatch, p.from, p.old, p.name, p.new, err)
		}
	default:
		// A cache, or a migration that says the map starts empty.
		rep.Result = MigrationRecreated
	}
	tmp := tempPin(pm.dir, p.name)
	if err := unpin(tmp); err != nil {
		m.Close()
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	if err := m.Pin(tmp); err != nil {
		m.Close()
		return fmt.Errorf("pin migrated %s: %w", p.name, err)
	}
	pm.replacements[p.name] = m
	pm.temps[p.name] = tmp
	if p.from != p.name {
		pm.remove = append(pm.remove, p.from)
	}
	pm.reports = append(pm.reports, rep)
	return nil
}

// keepCarry remembers the LRU map old, copied into m, for carryOver.
func (pm *pinMigration) keepCarry(name string, old, m *ebpf.Map) error {
	from, err := old.Clone()
	if err != nil {
		return fmt.Errorf("keep the old %s: %w", name, err)
	}
	to, err := m.Clone()
	if err != nil {
		from.Close()
		return fmt.Errorf("keep the new %s: %w", name, err)
	}
	pm.carries = append(pm.carries, carry{name: name, from: from, to: to})
	return nil
}

// innerMapStale says whether the map of maps outer, pinned by an earlier
// agent, refuses inner maps made from spec: the kernel fixed the shape of
// its inner maps when it was created. It tries one under key 0, which no
// ServicePort id takes, and removes it again.
func innerMapStale(outer *ebpf.Map, spec *ebpf.MapSpec) (bool, error) {
	if outer.KeySize() != 4 {
		return false, nil
	}
	probe, err := ebpf.NewMap(spec)
	if err != nil {
		return false, fmt.Errorf("create an inner map to check %s: %w", outer, err)
	}
	defer probe.Close()
	err = outer.Update(uint32(0), probe, ebpf.UpdateNoExist)
	switch {
	case err == nil:
		if err := outer.Delete(uint32(0)); err != nil {
			return false, fmt.Errorf("remove the probe entry of %s: %w", outer, err)
		}
		return false, nil
	case errors.Is(err, unix.EINVAL):
		return true, nil
	default:
		// Full, or key 0 taken: nothing learnt; the load goes on as
		// before.
		return false, nil
	}
}

// copyEntries copies every entry of from into to, through conv if it is
// not nil, and returns how many it wrote. The values of a map of maps are
// the inner maps themselves.
func copyEntries(from, to *ebpf.Map, conv func(k, v []byte) ([]byte, []byte, error)) (int, error) {
	n := 0
	var k []byte
	it := from.Iterate()
	if t := from.Type(); t == ebpf.HashOfMaps || t == ebpf.ArrayOfMaps {
		var id uint32
		for it.Next(&k, &id) {
			inner, err := ebpf.NewMapFromID(ebpf.MapID(id))
			if err != nil {
				return n, fmt.Errorf("open inner map %d of %s: %w", id, from, err)
			}
			err = to.Update(k, inner, ebpf.UpdateAny)
			inner.Close()
			if err != nil {
				return n, fmt.Errorf("copy entry %d of %s: %w", n+1, from, err)
			}
			n++
		}
		return n, it.Err()
	}
	var v []byte
	for it.Next(&k, &v) {
		nk, nv := k, v
		if conv != nil {
			var err error
			if nk, nv, err = conv(k, v); err != nil {
				return n, fmt.Errorf("entry %x: %w", k, err)
			}
			if nk == nil {
				continue
			}
		}
		if err := to.Update(nk, nv, ebpf.UpdateAny); err != nil {
			return n, fmt.Errorf("copy entry %d of %s: %w", n+1, from, err)
		}
		n++
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("read %s: %w", from, err)
	}
	return n, nil
}

// commit renames the new maps over the old pins and removes the pins of
// older names. The programs already use the new maps, and later loads
// (TC, XDP) adopt them from the pins: a rename that fails is an error.
func (pm *pinMigration) commit() error {
	var errs []error
	for name, tmp := range pm.temps {
		if err := os.Rename(tmp, filepath.Join(pm.dir, name)); err != nil {
			errs = append(errs, fmt.Errorf("put migrated %s in place: %w", name, err))
		}
	}
	if len(errs) == 0 {
		for _, name := range pm.remove {
			if err := unpin(filepath.Join(pm.dir, name)); err != nil {
				errs = append(errs, fmt.Errorf("remove migrated pin %s: %w", name, err))
			}
		}
	}
	pm.close()
	return errors.Join(errs...)
}

// abort removes the new maps; the old pins stay as they were.
func (pm *pinMigration) abort() {
	for _, tmp := range pm.temps {
		unpin(tmp)
	}
	closeCarries(pm.carries)
	pm.carries = nil
	pm.close()
}

// unpin removes the pin at path; a missing one is no error. (os.Remove
// would try rmdir after unlink, which bpffs answers with EPERM.)
func unpin(path string) error {
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "unlink", Path: path, Err: err}
	}
	return nil
}

func (pm *pinMigration) close() {
	for _, m := range pm.replacements {
		m.Close()
	}
	pm.replacements, pm.temps = nil, nil
}

// report hands every migration to f, if it is set.
func (pm *pinMigration) report(f func(MapMigration)) {
	if f == nil {
		return
	}
	for _, r := range pm.reports {
		f(r)
	}
}
