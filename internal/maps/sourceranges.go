package maps

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// NodeSourceRange marks, in the ServicePort id of a trie key with address
// 0, the entry that admits the node's own sockets whose source address the
// kernel picks (SRC_RANGE_NODE in bpf/lib/structs.h).
const NodeSourceRange = 1 << 31

// sourceRanges are the loadBalancerSourceRanges a ServicePort's LoadBalancer
// IPs of family fam admit: its ranges of that family, and none when it has
// no LoadBalancer IP of the family (the ranges restrict LoadBalancer IPs
// only). An empty result means no restriction, as kube-proxy applies ranges
// only when some remain after filtering by family.
func sourceRanges(sp *model.ServicePort, fam family) []netip.Prefix {
	if !slices.ContainsFunc(sp.LoadBalancerIPs, fam.holds) {
		return nil
	}
	var out []netip.Prefix
	for _, p := range sp.LoadBalancerSourceRanges {
		if fam.holds(p.Addr()) {
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
func admittedKeys(sp *model.ServicePort, node *model.Node, svcID uint32, fam family) map[rangeKey]bool {
	ranges := sourceRanges(sp, fam)
	if len(ranges) == 0 {
		return nil
	}
	keys := map[rangeKey]bool{}
	for _, p := range ranges {
		keys[rangeKey{svcID, p}] = true
	}
	if node == nil {
		return keys
	}
	admitted, sources := sp.SourceRangesAdmitNode(node.Addrs)
	if !admitted {
		return keys
	}
	for _, ip := range sources {
		if fam.holds(ip) {
			keys[rangeKey{svcID, netip.PrefixFrom(ip, fam.bits())}] = true
		}
	}
	keys[rangeKey{svcID: svcID | NodeSourceRange}] = true
	return keys
}

// WantsSourceRangeCheck says whether up leaves some ServicePort with source
// ranges (of either family) among those it changes (all of them when up is
// full): the egress program that holds the node's own sockets to the ranges
// must be attached before such an update is written.
func WantsSourceRangeCheck(up model.Update) bool {
	has := func(svc *model.Service) bool {
		return svc != nil && (len(sourceRanges(svc.Port, ipv4)) > 0 || len(sourceRanges(svc.Port, ipv6)) > 0)
	}
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
func (w *Writer) HasSourceRanges() bool { return len(w.ranges.byOwner) > 0 }

// planRanges plans the source ranges of owner (svc nil: deleted). They
// are written before the frontends that use them and deleted after them,
// so that a LoadBalancer IP with SVC_F_SOURCE_RANGES never finds its
// ranges missing.
func (a *applied) planRanges(p *plan, owner model.ServicePortName, svc *model.Service, node *model.Node) {
	if !a.ranges.on {
		return
	}
	cur := a.ranges.byOwner[owner]
	var want map[rangeKey]bool
	if id := a.svcs.byOwner[owner]; svc != nil && id != 0 {
		want = admittedKeys(svc.Port, node, id, a.fam)
	}
	var stale, fresh []rangeKey
	if cur != nil {
		for k := range cur.keys {
			if !want[k] {
				stale = append(stale, k)
			}
		}
	}
	for k := range want {
		if cur == nil || !cur.keys[k] {
			fresh = append(fresh, k)
		}
	}
	// Sorted, so that plans are the same from one run to the next.
	slices.SortFunc(stale, compareRangeKeys)
	slices.SortFunc(fresh, compareRangeKeys)
	for _, k := range stale {
		p.deleteRange(k)
	}
	for _, k := range fresh {
		p.putRange(k)
	}
	if len(want) == 0 {
		delete(a.ranges.byOwner, owner)
		return
	}
	a.ranges.byOwner[owner] = &appliedRanges{svcID: a.svcs.byOwner[owner], keys: want}
}

// planOrphanRanges plans, in a full sync, the deletion of the trie entries
// found in the kernel that no ServicePort claimed (left by an earlier
// agent).
func (a *applied) planOrphanRanges(p *plan) {
	if len(a.ranges.orphans) == 0 {
		return
	}
	wanted := map[rangeKey]bool{}
	for _, r := range a.ranges.byOwner {
		for k := range r.keys {
			wanted[k] = true
		}
	}
	var stale []rangeKey
	for k := range a.ranges.orphans {
		if !wanted[k] {
			stale = append(stale, k)
		}
	}
	slices.SortFunc(stale, compareRangeKeys)
	for _, k := range stale {
		p.deleteRange(k)
	}
	clear(a.ranges.orphans)
}

func compareRangeKeys(a, b rangeKey) int {
	return cmp.Or(
		cmp.Compare(a.svcID, b.svcID),
		a.prefix.Addr().Compare(b.prefix.Addr()),
		cmp.Compare(a.prefix.Bits(), b.prefix.Bits()),
	)
}

// describeRangeKey is a trie entry as the dump shows it.
func describeRangeKey(k rangeKey) string {
	if k.svcID&NodeSourceRange != 0 {
		return fmt.Sprintf("svc=%d node", k.svcID&^NodeSourceRange)
	}
	return fmt.Sprintf("svc=%d %s", k.svcID, k.prefix)
}
