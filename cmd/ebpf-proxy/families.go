package main

import (
	"context"
	"net/netip"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
)

// nodeLookupTimeout bounds the one read of the own Node at start.
const nodeLookupTimeout = 10 * time.Second

// families returns the IP families the node serves, primary first: those
// of its Node's addresses, else (no API server, or no Node registered) of
// its interfaces' addresses, with the family of --bind-address first when
// it names an address, as kube-proxy picks its primary family. Each gets
// its own dataplane and sync loop; a family the node has no address of is
// not served.
func (o *options) families(ctx context.Context, client kubernetes.Interface, nodeName string, log *zap.Logger) []string {
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
		addrs, err := proxymode.LocalAddrs()
		if err != nil {
			log.Warn("cannot list the interfaces' addresses for the IP families", zap.Error(err))
		}
		found = addrFamilies(addrs)
	}
	fams := orderFamilies(o.nodeIP, found)
	log.Info("IP families of the node", zap.Strings("ipFamilies", fams), zap.String("from", from))
	return fams
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

// orderFamilies puts the family of bind (when valid) first, then found;
// with neither, IPv4.
func orderFamilies(bind netip.Addr, found []v1.IPFamily) []string {
	var out []string
	if bind.IsValid() {
		out = append(out, familyOf(bind))
	}
	for _, f := range found {
		if s := string(f); len(out) == 0 || out[0] != s {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		out = []string{metrics.IPv4}
	}
	return out
}

func familyOf(a netip.Addr) string {
	if a.Unmap().Is4() {
		return metrics.IPv4
	}
	return metrics.IPv6
}
