package maps

import (
	"fmt"
	"slices"
)

// PortFilterWords is the number of 32-bit words of a port filter map
// (lb4_ext_ports_v1, lb6_ext_ports_v1): one bit per port.
const PortFilterWords = 65536 / 32

// externalKinds are the frontend kinds the TC and XDP programs serve; their
// ports go into the port filter.
const externalKinds = FlagNodePort | FlagExternalIP | FlagLoadBalancer

// portFilter is the Writer's copy of its family's port filter map: the
// ports of every external frontend it wrote, or found written, and of the
// flows the agent found tracked (AddPorts). The TC and XDP programs pass a
// packet to any other port before connection tracking. Bits are only ever
// set, never cleared: a flow outlives its frontend, as conntrack's do under
// kube-proxy, and its packets must still reach the flow's lookup.
type portFilter struct {
	words [PortFilterWords]uint32
}

func (f *portFilter) has(port uint16) bool { return f.words[port/32]&(1<<(port%32)) != 0 }

// set sets port's bit and reports whether it was clear.
func (f *portFilter) set(port uint16) bool {
	if f.has(port) {
		return false
	}
	f.words[port/32] |= 1 << (port % 32)
	return true
}

// planPort adds fe's port to the filter if fe is an external frontend,
// with the write of its word before any frontend's (apply's order).
func (a *applied) planPort(p *plan, fe Frontend, flags uint16) {
	if !a.ports.on || flags&externalKinds == 0 || !a.ports.filter.set(fe.Port) {
		return
	}
	w := uint32(fe.Port / 32)
	if n := len(p.portPuts.keys); n > 0 && p.portPuts.keys[n-1] == w {
		p.portPuts.values[n-1] = a.ports.filter.words[w]
		return
	}
	p.stats.Writes++
	p.portPuts.add(w, a.ports.filter.words[w])
}

// addExternalPorts adds the ports of the external frontends restored
// from the services map that the filter lacks: an agent that had no
// filter wrote them (an upgrade), and their flows must not be passed once
// the programs that read the filter attach.
func (a *applied) addExternalPorts(m Map[uint32, uint32]) error {
	var ports []uint16
	for fe, af := range a.frontends {
		if af.hasMaster && af.flags&externalKinds != 0 {
			ports = append(ports, fe.Port)
		}
	}
	return a.addPorts(m, ports)
}

// addPorts sets the bits of ports in the copy and writes the words that
// changed, in word order.
func (a *applied) addPorts(m Map[uint32, uint32], ports []uint16) error {
	var changed []uint32
	for _, port := range ports {
		if a.ports.filter.set(port) {
			changed = append(changed, uint32(port/32))
		}
	}
	slices.Sort(changed)
	changed = slices.Compact(changed)
	for _, w := range changed {
		if err := m.Put(w, a.ports.filter.words[w]); err != nil {
			return fmt.Errorf("port filter word %d: %w", w, err)
		}
	}
	return nil
}

// AddPorts adds ports to the port filter: the destination ports of the
// client-side entries connection tracking holds, which the agent adds
// before it attaches the TC and XDP programs, so that a tracked flow whose
// frontend an earlier agent deleted keeps its translation. Without a port
// filter map it does nothing.
func (w *Writer) AddPorts(ports []uint16) error {
	if w.m.ports == nil {
		return nil
	}
	return w.addPorts(w.m.ports, ports)
}

// HasPort says whether port is in the port filter, as the Writer last
// wrote or read it.
func (w *Writer) HasPort(port uint16) bool { return w.ports.filter.has(port) }

// TrackedPorts returns the frontend ports of the client-side entries of an
// IPv4 connection tracking map (tc4_ct_v1), each once: what AddPorts needs
// so that no tracked flow's packets are passed by the port filter. Reply
// entries are left out: replies of source-NATed flows come to the source
// NAT range, which the programs let through anyway, and the others are
// translated at egress, which has no filter.
func TrackedPorts(m Reader[CTKey, CTValue]) ([]uint16, error) {
	return trackedPorts(m, func(k CTKey) (uint8, uint16) { return k.Dir, k.Dport })
}

// TrackedPorts6 is TrackedPorts for tc6_ct_v1.
func TrackedPorts6(m Reader[CT6Key, CT6Value]) ([]uint16, error) {
	return trackedPorts(m, func(k CT6Key) (uint8, uint16) { return k.Dir, k.Dport })
}

// trackedPorts is TrackedPorts over keys whose direction and destination
// port (network order) key gives.
func trackedPorts[K comparable, V any](m Reader[K, V], key func(K) (dir uint8, dport uint16)) ([]uint16, error) {
	var seen portFilter
	var out []uint16
	err := m.Iterate(func(k K, _ V) bool {
		dir, dport := key(k)
		if port := portFromBE16(dport); dir == CTDirOrig && seen.set(port) {
			out = append(out, port)
		}
		return true
	})
	return out, err
}
