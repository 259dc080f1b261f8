package loader

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// Migration converts the entries of a map pinned by an older layout into
// the layout being loaded. A layout change registers one, in this file,
// when it ships: for a map whose name stays (From == To) or for one that
// gets a new name (lb4_backends_v1 to lb4_backends_v2), whose old pin is
// removed once the new one is in place. See "Pinned maps across upgrades"
// in docs/architecture/loading.md.
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
	// migrations is the registry (see init). Maps of maps cannot be
	// converted, only resized.
	migrations []Migration
)

// The connection tracking entries of the first layout: struct ct4_entry
// and struct ct6_entry before the next hop (fib_*) was kept in them.
const (
	ct4EntryV1Size = 28
	ct6EntryV1Size = 52
)

func init() {
	// Connection tracking entries grew the next hop that XDP and TC keep
	// for a flow (fib_* in struct ct4_entry and ct6_entry). An earlier
	// agent's flows are kept, with no next hop yet, which their next
	// packet looks up: emptying the maps would break every flow through a
	// NodePort to another node, whose replies need their entry.
	for _, m := range []struct {
		name              string
		key, old, current int
	}{
		{bpfobj.TcMapTc4CtV1, binary.Size(bpfobj.TcCt4Key{}), ct4EntryV1Size, binary.Size(bpfobj.TcCt4Entry{})},
		{bpfobj.TcMapTc6CtV1, binary.Size(bpfobj.TcCt6Key{}), ct6EntryV1Size, binary.Size(bpfobj.TcCt6Entry{})},
	} {
		RegisterMigration(Migration{From: m.name, To: m.name, KeySize: uint32(m.key), ValueSize: uint32(m.old),
			Convert: zeroExtend(m.current)})
	}
}

// zeroExtend converts an entry whose value gained fields at its end, zero
// in the entries converted.
func zeroExtend(size int) func(key, value []byte) ([]byte, []byte, error) {
	return func(key, value []byte) ([]byte, []byte, error) {
		if len(value) > size {
			return nil, nil, fmt.Errorf("a value of %d bytes does not fit %d", len(value), size)
		}
		v := make([]byte, size)
		copy(v, value)
		return key, v, nil
	}
}

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
	// Rewritten by the agent from the pods on the node.
	bpfobj.SockMapSockNetnsPacketV1: true,
	bpfobj.SockMapSock6RevnatV1:     true,
	bpfobj.SockMapSock6UdpFwdV1:     true,
	bpfobj.SockMapLb6AffinityV1:     true,
	bpfobj.SockMapLbMetricsV1:       true,
	bpfobj.TcMapTc4CtV1:             true,
	bpfobj.TcMapTc4SnatAddrsV1:      true,
	bpfobj.TcMapTc6CtV1:             true,
	bpfobj.TcMapTc6SnatAddrsV1:      true,
	bpfobj.TcMapTc4NexthopV1:        true,
	bpfobj.TcMapTc6NexthopV1:        true,
	bpfobj.TcMapTcNexthopShareV1:    true,
	bpfobj.XdpMapXdp4DevsV1:         true,
}

// rebuiltWith names, for a map that describes another, that other: when
// the second starts empty, so does the first. The Maglev fingerprints say
// which tables need no rewriting; without them, the agent rewrites every
// table at its first sync.
var rebuiltWith = map[string]string{
	bpfobj.TcMapLb4MaglevFpV1: bpfobj.TcMapLb4MaglevV1,
	bpfobj.TcMapLb6MaglevFpV1: bpfobj.TcMapLb6MaglevV1,
}
