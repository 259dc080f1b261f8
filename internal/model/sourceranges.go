package model

import (
	"net/netip"
	"slices"
)

// SourceRangesAdmitNode is kube-proxy's rule for a node reaching its own
// LoadBalancer IPs through their loadBalancerSourceRanges (allowFromNode):
// given the node's addresses, it reports whether the ranges admit the node
// and, if so, the source addresses the node is admitted with besides its
// own: the LoadBalancer IPs. A node that holds a LoadBalancer IP locally
// (the VIP routed to it) reaches that IP with the IP itself as the source,
// which no range names.
//
// The node is admitted when a range contains one of nodeAddrs; a range and
// an address of different families never match. Ranges restrict only
// LoadBalancer IPs, so a ServicePort without a LoadBalancer IP, or without
// ranges, restricts nothing and has nothing to admit: false, nil. Which
// addresses count as the node's is the caller's to say.
func (sp *ServicePort) SourceRangesAdmitNode(nodeAddrs []netip.Addr) (admitted bool, sources []netip.Addr) {
	if len(sp.LoadBalancerIPs) == 0 {
		return false, nil
	}
	for _, r := range sp.LoadBalancerSourceRanges {
		if slices.ContainsFunc(nodeAddrs, r.Contains) {
			return true, sp.LoadBalancerIPs
		}
	}
	return false, nil
}
