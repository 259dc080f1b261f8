package main

import (
	"context"
	"net/netip"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// nodeLookupTimeout bounds the one read of the own Node at start.
const nodeLookupTimeout = 10 * time.Second

// families returns the IP families to serve, primary first, and those the
// node has addresses of. As kube-proxy, the agent serves both families
// whenever the dataplane can, whatever the node's addresses, and picks the
// primary one as kube-proxy does: the family of --bind-address when it
// names an address, else of the Node's first address, else (no API
// server, or no Node registered) of the interfaces' addresses, else IPv4.
// Each family gets its own dataplane and sync loop.
func families(o *config.Options, ctx context.Context, client *kubeapi.Client, nodeName string, log *zap.Logger) (serve, node []string) {
	var found []v1.IPFamily
	from := "Node"
	if client != nil {
		ctx, cancel := context.WithTimeout(ctx, nodeLookupTimeout)
		n, err := k8swatch.GetNode(ctx, client, nodeName)
		cancel()
		switch {
		case err != nil:
			log.Warn("cannot read the own Node for its IP families; using the interfaces' addresses", zap.Error(err))
		case n == nil:
			log.Info("the own Node is not registered; using the interfaces' addresses for the IP families")
		default:
			found = k8swatch.NodeFamilies(n)
		}
	}
	if found == nil {
		from = "interfaces"
		addrs, err := localAddrs()
		if err != nil {
			log.Warn("cannot list the interfaces' addresses for the IP families", zap.Error(err))
		}
		found = addrFamilies(addrs)
	}
	serve = orderFamilies(o.NodeIP, found)
	for _, f := range found {
		node = append(node, string(f))
	}
	log.Info("IP families", zap.String("primary", serve[0]), zap.Strings("nodeAddresses", node), zap.String("from", from))
	return serve, node
}

// addrFamilies returns the families of the addresses that are neither
// loopback nor link-local, IPv4 first.
func addrFamilies(addrs []netip.Addr) []v1.IPFamily {
	var v4, v6 bool
	for _, a := range addrs {
		if a.IsLoopback() || a.IsLinkLocalUnicast() {
			continue
		}
		v4, v6 = v4 || a.Is4(), v6 || a.Is6()
	}
	var out []v1.IPFamily
	if v4 {
		out = append(out, v1.IPv4Protocol)
	}
	if v6 {
		out = append(out, v1.IPv6Protocol)
	}
	return out
}

// orderFamilies returns both families, the primary first: the family of
// bind when valid, else the first found, else IPv4.
func orderFamilies(bind netip.Addr, found []v1.IPFamily) []string {
	primary := metrics.IPv4
	switch {
	case bind.IsValid():
		primary = metrics.FamilyOf(bind)
	case len(found) > 0:
		primary = string(found[0])
	}
	if primary == metrics.IPv6 {
		return []string{metrics.IPv6, metrics.IPv4}
	}
	return []string{metrics.IPv4, metrics.IPv6}
}
