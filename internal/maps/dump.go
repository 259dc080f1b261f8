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
