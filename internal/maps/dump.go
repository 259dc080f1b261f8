package maps

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Dump renders the maps as sorted lines, one entry per line, with ids
// resolved to addresses: the canonical form used by golden tests and by
// `ebpf-proxy dump` when debugging a node.
func Dump(m Maps) ([]string, error) { return dumpFamily(m.coded()) }

// Dump6 is Dump for the IPv6 maps. Maps6 of nil maps (pinned by an agent
// older than IPv6) dump as nothing.
func Dump6(m Maps6) ([]string, error) {
	if m.Services == nil {
		return nil, nil
	}
	return dumpFamily(m.coded())
}

func dumpFamily(m familyMaps) ([]string, error) {
	backends := map[uint32]string{}
	var lines []string
	err := m.backends.Iterate(func(id uint32, v backendEntry) bool {
		backends[id] = v.b.String()
		lines = append(lines, fmt.Sprintf("backend %d %s%s", id, v.b, backendFlagString(v.flags)))
		return true
	})
	if err != nil {
		return nil, err
	}
	err = m.revNat.Iterate(func(id uint32, v netip.AddrPort) bool {
		lines = append(lines, fmt.Sprintf("revnat %d %s", id, v))
		return true
	})
	if err != nil {
		return nil, err
	}
	err = m.services.Iterate(func(k serviceKey, v ServiceValue) bool {
		fe := k.fe
		if k.slot == 0 {
			line := fmt.Sprintf("service %s count=%d revnat=%d svc=%d flags=%s", fe, v.Count, v.RevNatId, v.SvcId, serviceFlagString(v.Flags))
			if v.AffinityTimeout != 0 {
				line += fmt.Sprintf(" affinity=%ds", v.AffinityTimeout)
			}
			lines = append(lines, line)
			return true
		}
		be, ok := backends[v.BackendId]
		if !ok {
			be = "<missing>"
		}
		lines = append(lines, fmt.Sprintf("service %s slot=%d backend=%d %s", fe, k.slot, v.BackendId, be))
		return true
	})
	if err != nil {
		return nil, err
	}
	err = m.members.Iterate(func(k MemberKey, _ uint8) bool {
		lines = append(lines, fmt.Sprintf("member svc=%d backend=%d %s", k.SvcId, k.BackendId, backends[k.BackendId]))
		return true
	})
	if err != nil {
		return nil, err
	}
	if m.ranges != nil {
		err = m.ranges.Iterate(func(k rangeKey, _ uint8) bool {
			lines = append(lines, "source-range "+describeRangeKey(k))
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(lines)
	return lines, nil
}

var serviceFlagNames = []struct {
	f    uint16
	name string
}{
	{FlagClusterIP, "cluster-ip"},
	{FlagNodePort, "node-port"},
	{FlagLocalhostNodePort, "localhost-node-port"},
	{FlagExternalIP, "external-ip"},
	{FlagLoadBalancer, "load-balancer"},
	{FlagTwoScopes, "two-scopes"},
	{FlagReject, "reject"},
	{FlagDrop, "drop"},
	{FlagSourceRanges, "source-ranges"},
	{FlagExternalLocal, "external-local"},
	{FlagMaglev, "maglev"},
}

func serviceFlagString(f uint16) string {
	var names []string
	for _, n := range serviceFlagNames {
		if f&n.f != 0 {
			names = append(names, n.name)
			f &^= n.f
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("%#x", f))
	}
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ",")
}

func backendFlagString(f uint8) string {
	var s string
	if f&BackendFlagLocal != 0 {
		s += " local"
	}
	if f&BackendFlagTerminating != 0 {
		s += " terminating"
	}
	return s
}

// FrontendEntry is one frontend of the services map as the programs see it:
// its master entry and the backends its slots name, in slot order.
type FrontendEntry struct {
	Frontend Frontend
	// Flags are the master entry's FLAG_* bits (FlagNames spells them).
	Flags uint16
	// SvcID is the ServicePort's id (membership and source range maps),
	// RevNatID the frontend's reverse NAT id. Both are numbered per IP
	// family.
	SvcID, RevNatID uint32
	// AffinityTimeout is in seconds, 0 without session affinity.
	AffinityTimeout uint32
	// Count is the slot count the master entry announces.
	Count    int
	Backends []BackendEntry
}

// BackendEntry is a backend a frontend's slot names.
type BackendEntry struct {
	ID uint32
	// Addr and Port are zero when the backends map lacks the id (Missing).
	Addr    netip.Addr
	Port    uint16
	Flags   uint8
	Missing bool
}

// Local reports whether the backend is on this node (BE_F_LOCAL).
func (b BackendEntry) Local() bool { return b.Flags&BackendFlagLocal != 0 }

// Terminating reports whether the backend is terminating (BE_F_TERMINATING).
func (b BackendEntry) Terminating() bool { return b.Flags&BackendFlagTerminating != 0 }

// ReadFrontends reads every frontend of the IPv4 maps with its backends,
// sorted by frontend: the structured form of Dump.
func ReadFrontends(m Maps) ([]FrontendEntry, error) { return readFrontends(m.coded()) }

// ReadFrontends6 is ReadFrontends for the IPv6 maps; nil maps read as
// nothing, as in Dump6.
func ReadFrontends6(m Maps6) ([]FrontendEntry, error) {
	if m.Services == nil {
		return nil, nil
	}
	return readFrontends(m.coded())
}

func readFrontends(m familyMaps) ([]FrontendEntry, error) {
	backends := map[uint32]backendEntry{}
	err := m.backends.Iterate(func(id uint32, v backendEntry) bool {
		backends[id] = v
		return true
	})
	if err != nil {
		return nil, err
	}
	masters := map[Frontend]*FrontendEntry{}
	slots := map[Frontend]map[uint16]uint32{}
	err = m.services.Iterate(func(k serviceKey, v ServiceValue) bool {
		if k.slot == 0 {
			masters[k.fe] = &FrontendEntry{Frontend: k.fe, Flags: v.Flags, SvcID: v.SvcId, RevNatID: v.RevNatId,
				AffinityTimeout: v.AffinityTimeout, Count: int(v.Count)}
			return true
		}
		if slots[k.fe] == nil {
			slots[k.fe] = map[uint16]uint32{}
		}
		slots[k.fe][k.slot] = v.BackendId
		return true
	})
	if err != nil {
		return nil, err
	}
	out := make([]FrontendEntry, 0, len(masters))
	for fe, e := range masters {
		for slot := 1; slot <= e.Count; slot++ {
			id, ok := slots[fe][uint16(slot)]
			if !ok {
				continue
			}
			be := BackendEntry{ID: id}
			if b, ok := backends[id]; ok {
				be.Addr, be.Port, be.Flags = b.b.Addr, b.b.Port, b.flags
			} else {
				be.Missing = true
			}
			e.Backends = append(e.Backends, be)
		}
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b FrontendEntry) int { return a.Frontend.compare(b.Frontend) })
	return out, nil
}

// FlagNames spells a master entry's flags as Dump does ("cluster-ip",
// "node-port,two-scopes", "-" for none).
func FlagNames(f uint16) string { return serviceFlagString(f) }
