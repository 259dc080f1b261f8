// Package nodeaddrs lists the node's interface addresses, among which
// --nodeport-addresses (model.NodePortSpec) selects those that accept
// NodePorts and serve the health check node ports.
package nodeaddrs

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
)

// Local returns the IPv4 and IPv6 addresses (IPv6 link-local ones left
// out: they need a zone, and no Service is reached on them) of every interface of the calling
// thread's network namespace (the node's, for the agent), loopback ones
// included, except those of the interfaces named in skip: the IPVS
// dataplane's dummy interface holds Service addresses, which are no node
// addresses (kube-proxy leaves its kube-ipvs0 out in the same way).
func Local(skip ...string) ([]netip.Addr, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []netip.Addr
	for _, l := range links {
		if slices.Contains(skip, l.Attrs().Name) {
			continue
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLinkLocalUnicast() && !slices.Contains(out, ip.Unmap()) {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
