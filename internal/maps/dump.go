package maps

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Dump renders the maps as sorted lines, one entry per line, with ids
// resolved to addresses: the canonical form used by golden tests and by
// `ebpf-proxy dump` when debugging a node.
func Dump(m Maps) ([]string, error) {
	backends := map[uint32]string{}
	var lines []string
	err := m.Backends.Iterate(func(id uint32, v BackendValue) bool {
		b := Backend{Addr: addrFromBE32(v.Address), Port: portFromBE16(v.Port), Proto: model.Protocol(v.Proto)}
		backends[id] = b.String()
		lines = append(lines, fmt.Sprintf("backend %d %s%s", id, b, backendFlagString(v.Flags)))
		return true
	})
	if err != nil {
		return nil, err
	}
	err = m.RevNat.Iterate(func(id uint32, v RevNatValue) bool {
		lines = append(lines, fmt.Sprintf("revnat %d %s", id, netip.AddrPortFrom(addrFromBE32(v.Address), portFromBE16(v.Port))))
		return true
	})
	if err != nil {
		return nil, err
	}
	err = m.Services.Iterate(func(k ServiceKey, v ServiceValue) bool {
		fe := Frontend{Addr: addrFromBE32(k.Address), Port: portFromBE16(k.Dport), Proto: model.Protocol(k.Proto), Scope: k.Scope}
		if k.Slot == 0 {
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
		lines = append(lines, fmt.Sprintf("service %s slot=%d backend=%d %s", fe, k.Slot, v.BackendId, be))
		return true
	})
	if err != nil {
		return nil, err
	}
	err = m.Members.Iterate(func(k MemberKey, _ uint8) bool {
		lines = append(lines, fmt.Sprintf("member svc=%d backend=%d %s", k.SvcId, k.BackendId, backends[k.BackendId]))
		return true
	})
	if err != nil {
		return nil, err
	}
	if m.SourceRanges != nil {
		err = m.SourceRanges.Iterate(func(k SourceRangeKey, _ uint8) bool {
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
