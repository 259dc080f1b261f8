package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// appliedRanges are the source ranges written for one ServicePort.
type appliedRanges struct {
	svcID    uint32
	prefixes map[netip.Prefix]bool
}

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

// admittedSources are the entries the trie holds for a ServicePort: its
// source ranges and, when they hold an address of node, its LoadBalancer IPs
// as single addresses. kube-proxy admits the LoadBalancer IPs as a source
// then, because a node that holds a LoadBalancer IP locally reaches it from
// that address.
func admittedSources(sp *model.ServicePort, node *model.Node) []netip.Prefix {
	out := sourceRanges(sp)
	if len(out) == 0 || node == nil {
		return out
	}
	if !slices.ContainsFunc(out, func(p netip.Prefix) bool { return slices.ContainsFunc(node.Addrs, p.Contains) }) {
		return out
	}
	for _, ip := range sp.LoadBalancerIPs {
		if ip.Is4() {
			out = append(out, netip.PrefixFrom(ip, 32))
		}
	}
	return out
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
	var want []netip.Prefix
	var id uint32
	if svc != nil {
		want = admittedSources(svc.Port, node)
		id = w.ownerSvc[owner]
	}
	if len(want) == 0 || id == 0 {
		if cur == nil {
			return nil, nil
		}
		delete(w.ranges, owner)
		var stale []SourceRangeKey
		for p := range cur.prefixes {
			stale = append(stale, rangeKey(cur.svcID, p))
		}
		return stale, nil
	}
	next := &appliedRanges{svcID: id, prefixes: map[netip.Prefix]bool{}}
	var errs []error
	for _, p := range want {
		next.prefixes[p] = true
		if cur != nil && cur.svcID == id && cur.prefixes[p] {
			continue
		}
		w.stats.Writes++
		if err := w.m.SourceRanges.Put(rangeKey(id, p), 1); err != nil {
			errs = append(errs, fmt.Errorf("source range %s: %w", p, err))
		}
	}
	var stale []SourceRangeKey
	if cur != nil {
		for p := range cur.prefixes {
			if cur.svcID != id || !next.prefixes[p] {
				stale = append(stale, rangeKey(cur.svcID, p))
			}
		}
	}
	w.ranges[owner] = next
	return stale, errors.Join(errs...)
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
			for p := range r.prefixes {
				wanted[rangeKey(r.svcID, p)] = true
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
