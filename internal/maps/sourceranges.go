package maps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// appliedRanges are the trie entries written for one ServicePort.
type appliedRanges struct {
	svcID uint32
	keys  map[SourceRangeKey]bool
}

// NodeSourceRange marks, in the ServicePort id of a trie key with address
// 0, the entry that admits the node's own sockets whose source address the
// kernel picks (SRC_RANGE_NODE in bpf/lib/structs.h).
const NodeSourceRange = 1 << 31

// sourceRanges are the loadBalancerSourceRanges a ServicePort's LoadBalancer
// IPs admit: its IPv4 ones, and none when it has no LoadBalancer IP (the
// ranges restrict LoadBalancer IPs only). An empty result means no
// restriction, as kube-proxy applies ranges only when some remain after
// filtering by family.
func sourceRanges(sp *model.ServicePort) []netip.Prefix {
	if len(sp.LoadBalancerIPs) == 0 {
		return nil
	}
	var out []netip.Prefix
	for _, p := range sp.LoadBalancerSourceRanges {
		if p.Addr().Is4() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// admittedKeys are the trie entries of a ServicePort with id svcID: its
// source ranges and, when they admit node (the model's
// SourceRangesAdmitNode), the sources it is admitted with (its LoadBalancer
// IPs) as single addresses and the node's entry. kube-proxy sees the node's
// other sockets with a node address as their source, that of the route to
// the LoadBalancer IP, where the socket hooks connect them straight to an
// endpoint by another route (see RANGE_DST_F_AS_NODE).
func admittedKeys(sp *model.ServicePort, node *model.Node, svcID uint32) map[SourceRangeKey]bool {
	ranges := sourceRanges(sp)
	if len(ranges) == 0 {
		return nil
	}
	keys := map[SourceRangeKey]bool{}
	for _, p := range ranges {
		keys[rangeKey(svcID, p)] = true
	}
	if node == nil {
		return keys
	}
	admitted, sources := sp.SourceRangesAdmitNode(node.Addrs)
	if !admitted {
		return keys
	}
	for _, ip := range sources {
		if ip.Is4() {
			keys[rangeKey(svcID, netip.PrefixFrom(ip, 32))] = true
		}
	}
	keys[SourceRangeKey{Prefixlen: 64, SvcId: svcID | NodeSourceRange}] = true
	return keys
}

// WantsSourceRangeCheck says whether up leaves some ServicePort with source
// ranges among those it changes (all of them when up is full): the egress
// program that holds the node's own sockets to the ranges must be attached
// before such an update is written.
func WantsSourceRangeCheck(up model.Update) bool {
	has := func(svc *model.Service) bool { return svc != nil && len(sourceRanges(svc.Port)) > 0 }
	if up.Full {
		for _, svc := range up.State.Services {
			if has(svc) {
				return true
			}
		}
		return false
	}
	for spn := range up.Changed {
		if has(up.State.Services[spn]) {
			return true
		}
	}
	return false
}

// HasSourceRanges says whether the maps hold source ranges of some
// ServicePort: while they do, the egress program must stay attached.
func (w *Writer) HasSourceRanges() bool { return len(w.ranges) > 0 }

func rangeKey(svcID uint32, p netip.Prefix) SourceRangeKey {
	return SourceRangeKey{Prefixlen: 32 + uint32(p.Bits()), SvcId: svcID, Address: be32(p.Addr())}
}

// syncRanges writes the source ranges of owner (svc nil: deleted) before
// its frontends are flushed, and returns the keys to delete after them, so
// that a LoadBalancer IP with SVC_F_SOURCE_RANGES never finds its ranges
// missing. The LPM trie takes no batches: these are single writes.
func (w *Writer) syncRanges(owner model.ServicePortName, svc *model.Service, node *model.Node) ([]SourceRangeKey, error) {
	if w.m.SourceRanges == nil {
		return nil, nil
	}
	cur := w.ranges[owner]
	var want map[SourceRangeKey]bool
	if id := w.ownerSvc[owner]; svc != nil && id != 0 {
		want = admittedKeys(svc.Port, node, id)
	}
	var stale []SourceRangeKey
	if cur != nil {
		for k := range cur.keys {
			if !want[k] {
				stale = append(stale, k)
			}
		}
	}
	if len(want) == 0 {
		delete(w.ranges, owner)
		return stale, nil
	}
	var errs []error
	for k := range want {
		if cur != nil && cur.keys[k] {
			continue
		}
		w.stats.Writes++
		if err := w.m.SourceRanges.Put(k, 1); err != nil {
			errs = append(errs, fmt.Errorf("source range %s: %w", describeRangeKey(k), err))
		}
	}
	w.ranges[owner] = &appliedRanges{svcID: w.ownerSvc[owner], keys: want}
	return stale, errors.Join(errs...)
}

// describeRangeKey is a trie entry as the dump shows it.
func describeRangeKey(k SourceRangeKey) string {
	if k.SvcId&NodeSourceRange != 0 {
		return fmt.Sprintf("svc=%d node", k.SvcId&^NodeSourceRange)
	}
	return fmt.Sprintf("svc=%d %s", k.SvcId, netip.PrefixFrom(addrFromBE32(k.Address), int(k.Prefixlen)-32))
}

// deleteRanges deletes source range entries after the frontends that used
// them are gone; with full, also every entry in the map that no ServicePort
// wants (left by an earlier agent).
func (w *Writer) deleteRanges(stale []SourceRangeKey, full bool) error {
	if w.m.SourceRanges == nil {
		return nil
	}
	if full {
		wanted := map[SourceRangeKey]bool{}
		for _, r := range w.ranges {
			for k := range r.keys {
				wanted[k] = true
			}
		}
		err := w.m.SourceRanges.Iterate(func(k SourceRangeKey, _ uint8) bool {
			if !wanted[k] {
				stale = append(stale, k)
			}
			return true
		})
		if err != nil {
			return fmt.Errorf("read source ranges: %w", err)
		}
	}
	var errs []error
	for _, k := range stale {
		w.stats.Writes++
		if err := w.m.SourceRanges.Delete(k); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
