package k8swatch

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
)

// NodeName is the name of the node the agent runs on: --hostname-override,
// else the host name, lowercased as the Node object's.
func NodeName(override string) (string, error) {
	if override != "" {
		return strings.ToLower(strings.TrimSpace(override)), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return strings.ToLower(strings.TrimSpace(h)), nil
}

// InvalidReason keeps the invalid-objects metric's label set small: the first words of a
// reason, which the translator words as a fixed prefix followed by detail.
func InvalidReason(reason string) string {
	const max = 40
	for i, r := range reason {
		if r == ':' || i >= max {
			return reason[:i]
		}
	}
	return reason
}

// NodeFamilies returns the IP families of a Node's addresses, the primary
// first, as kube-proxy reads them: InternalIPs before ExternalIPs, the
// family of the first one primary. Addresses that do not parse are left
// out (the watch reports them).
func NodeFamilies(n *v1.Node) []v1.IPFamily {
	var out []v1.IPFamily
	for _, a := range nodeAddrs(n) {
		f := v1.IPv4Protocol
		if a.Is6() {
			f = v1.IPv6Protocol
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// nodeAddrs are a Node's InternalIPs, then its ExternalIPs, leaving out
// those that do not parse.
func nodeAddrs(n *v1.Node) []netip.Addr {
	var all []netip.Addr
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, na := range n.Status.Addresses {
			if na.Type != typ {
				continue
			}
			if a, ok := parseIP(na.Address); ok {
				all = append(all, a)
			}
		}
	}
	return all
}

// GetNode reads the Node named name once, for the IP families the node
// serves before the watch starts. Not found is (nil, nil).
func GetNode(ctx context.Context, client *kubeapi.Client, name string) (*v1.Node, error) {
	n, err := client.GetNode(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("k8swatch: reading Node %s: %w", name, err)
	}
	return n, nil
}

// NodeHostIPs returns a Node's IPs as kube-proxy reads them to know when
// to start again: its first address (InternalIPs before ExternalIPs), then
// the first of the other family, if any. Addresses that do not parse are
// left out.
func NodeHostIPs(n *v1.Node) []netip.Addr {
	all := nodeAddrs(n)
	if len(all) == 0 {
		return nil
	}
	out := []netip.Addr{all[0]}
	for _, a := range all[1:] {
		if a.Is6() != all[0].Is6() {
			return append(out, a)
		}
	}
	return out
}
