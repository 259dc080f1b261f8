package maps

import (
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// applied is what the maps hold, as the Writer knows it: restored from them
// at start and after an error, and updated by every plan as if it were
// written. A plan that fails to be written leaves it wrong, which is why
// the Writer restores it from the maps before the next sync.
type applied struct {
	frontends map[Frontend]*appliedFrontend
	// serviceEntries counts the services map entries of the frontends
	// (their master entries and filled slots), kept as they change so
	// that a sync does not count every frontend again.
	serviceEntries int
	byOwner        map[model.ServicePortName][]Frontend
	// backends are the backends map's entries.
	backends backendLedger
	// revNats are the reverse NAT entries.
	revNats revNatLedger
	// svcs are the ServicePort ids.
	svcs svcLedger
	// members are the membership entries, counted by the frontends that
	// need them.
	members memberLedger
	// ranges is the source ranges trie.
	ranges rangeLedger
	// held are the ids of the backends each ServicePort keeps for the
	// endpoints its EndpointSlices list (see hold): ids, an eighth of the
	// memory of the backends themselves.
	held map[model.ServicePortName][]uint32
	// maglev are the Maglev tables.
	maglev maglevLedger

	// scratch is upsert's list of its frontend's backends, kept for the
	// next frontend's.
	scratch []*appliedBackend

	// fam is the family of the maps' addresses.
	fam family
	// ports is the port filter.
	ports portLedger
}

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

// entries counts f's entries in the services map: its master entry and its
// filled slots (restored slots past the count included).
func (f *appliedFrontend) entries() int {
	n := 0
	if f.hasMaster {
		n++
	}
	for _, id := range f.slots {
		if id != 0 {
			n++
		}
	}
	return n
}

// backendKey is a Backend in 20 bytes without a pointer (a netip.Addr
// keeps its zone in one; a backend never has a zone): the key of the map
// of every backend and what each applied backend keeps, 300,000 of each at
// 30,000 Services of 10 endpoints.
type backendKey struct {
	addr  [16]byte
	port  uint16
	proto model.Protocol
	is4   bool
}

func keyOf(b Backend) backendKey {
	return backendKey{addr: b.Addr.As16(), port: b.Port, proto: b.Proto, is4: b.Addr.Is4()}
}

func (k backendKey) backend() Backend {
	a := netip.AddrFrom16(k.addr)
	if k.is4 {
		a = a.Unmap()
	}
	return Backend{Addr: a, Port: k.port, Proto: k.proto}
}

type appliedBackend struct {
	k     backendKey
	id    uint32
	flags uint8
	refs  int32
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

// appliedRanges are the trie entries written for one ServicePort.
type appliedRanges struct {
	svcID uint32
	keys  map[rangeKey]bool
}

// newApplied returns the empty state of maps of family fam with the given
// capacities; rangesOn and maglevSize say which optional maps exist.
func newApplied(fam family, lim Limits, rangesOn bool, maglevSize int) applied {
	a := applied{fam: fam, ranges: rangeLedger{on: rangesOn}, maglev: maglevLedger{size: maglevSize}}
	a.backends.ids = newIDAllocator(lim.Backends)
	a.revNats.ids = newIDAllocator(lim.RevNat)
	// A ServicePort has at least one frontend, so there are no more
	// ServicePorts than reverse-NAT entries.
	a.svcs.ids = newIDAllocator(lim.RevNat)
	a.reset()
	return a
}

// reset forgets everything, keeping the capacities.
func (a *applied) reset() {
	a.frontends = map[Frontend]*appliedFrontend{}
	a.serviceEntries = 0
	a.byOwner = map[model.ServicePortName][]Frontend{}
	a.backends.reset()
	a.revNats.reset()
	a.svcs.reset()
	a.members.reset()
	a.ranges.reset()
	a.held = map[model.ServicePortName][]uint32{}
	a.maglev.reset()
}

func (a *applied) unrefMatch(k MemberKey) { a.members.unref(k) }
