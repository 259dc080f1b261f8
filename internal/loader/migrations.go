package loader

import (
	"slices"
	"sync"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// Migration converts the entries of a map pinned by an older layout into
// the layout being loaded. A layout change registers one, in this file,
// when it ships: for a map whose name stays (From == To) or for one that
// gets a new name (lb4_backends_v1 to lb4_backends_v2), whose old pin is
// removed once the new one is in place. See "Pinned maps across upgrades"
// in docs/ARCHITECTURE.md.
type Migration struct {
	// From is the name the older layout pinned the map under, To its name
	// in the layout being loaded.
	From, To string
	// KeySize and ValueSize are the older layout's: a pin of other sizes
	// is not this migration's to convert.
	KeySize, ValueSize uint32
	// Convert returns the new layout's entry for an entry of the old one;
	// a nil key drops the entry. Keys that carry ids (backend, reverse NAT,
	// ServicePort ids) must keep them. A nil Convert starts the map empty,
	// which is right only for a map in rebuiltMaps.
	Convert func(key, value []byte) (newKey, newValue []byte, err error)
}

var (
	migrationsMu sync.Mutex
	// migrations is the registry. It is empty: every layout is still the
	// first one (_v1). Maps of maps cannot be converted, only resized.
	migrations []Migration
)

// RegisterMigration adds m to the registry of migrations and returns a
// function that removes it again. Layout changes register theirs at init;
// tests register synthetic older layouts.
func RegisterMigration(m Migration) (remove func()) {
	migrationsMu.Lock()
	defer migrationsMu.Unlock()
	migrations = append(migrations, m)
	return func() {
		migrationsMu.Lock()
		defer migrationsMu.Unlock()
		if i := slices.IndexFunc(migrations, func(x Migration) bool {
			return x.From == m.From && x.To == m.To &&
				x.KeySize == m.KeySize && x.ValueSize == m.ValueSize
		}); i >= 0 {
			migrations = slices.Delete(migrations, i, i+1)
		}
	}
}

func registeredMigrations() []Migration {
	migrationsMu.Lock()
	defer migrationsMu.Unlock()
	return slices.Clone(migrations)
}

// rebuiltMaps hold nothing that is lost for good when they start empty:
// caches the programs fill again as traffic flows (connection tracking,
// socket reverse NAT, UDP flow pinning, session affinity, socket tags),
// what the loader rewrites at every attach (source NAT addresses, XDP
// devices) and the event counters (a reset, as after a reboot). A pin of
// such a map in an older layout with no registered migration is replaced
// by an empty map.
//
// Every other map holds the agent's state, whose entries name ids the
// restarted agent restores (services, backends, reverse NAT, members,
// source ranges, Maglev tables): it is copied or converted, never dropped,
// and an older layout without a migration is an error.
var rebuiltMaps = map[string]bool{
	bpfobj.SockMapSock4RevnatV1:    true,
	bpfobj.SockMapSock4UdpFwdV1:    true,
	bpfobj.SockMapLb4AffinityV1:    true,
	bpfobj.SockMapSock4RangeTagsV1: true,
	bpfobj.SockMapSock6RangeTagsV1: true,
	bpfobj.SockMapSock6RevnatV1:    true,
	bpfobj.SockMapSock6UdpFwdV1:    true,
	bpfobj.SockMapLb6AffinityV1:    true,
	bpfobj.SockMapLbMetricsV1:      true,
	bpfobj.TcMapTc4CtV1:            true,
	bpfobj.TcMapTc4SnatAddrsV1:     true,
	bpfobj.TcMapTc6CtV1:            true,
	bpfobj.TcMapTc6SnatAddrsV1:     true,
	bpfobj.XdpMapXdp4DevsV1:        true,
}

// rebuiltWith names, for a map that describes another, that other: when
// the second starts empty, so does the first. The Maglev fingerprints say
// which tables need no rewriting; without them, the agent rewrites every
// table at its first sync.
var rebuiltWith = map[string]string{
	bpfobj.TcMapLb4MaglevFpV1: bpfobj.TcMapLb4MaglevV1,
	bpfobj.TcMapLb6MaglevFpV1: bpfobj.TcMapLb6MaglevV1,
}
