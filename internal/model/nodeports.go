package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// NodePortPrimary is the --nodeport-addresses value naming the node's
// primary IP.
const NodePortPrimary = "primary"

// NodePortSpec is --nodeport-addresses (with --iptables-localhost-nodeports)
// parsed for one IP family, before it meets the node's addresses. The zero
// value accepts NodePorts on every local address, as the unset flag does.
//
// The semantics are upstream kube-proxy's:
//   - unset, or no CIDR of the family: every local address of the family;
//   - a zero CIDR (0.0.0.0/0) anywhere in the list: every local address;
//   - CIDRs: the local addresses inside them;
//   - "primary", alone: the node's primary IP, as a /32 (/128); without a
//     known, non-loopback primary IP it means every local address.
type NodePortSpec struct {
	prefixes []netip.Prefix
	primary  bool
	// localhost is --iptables-localhost-nodeports: the node's own sockets
	// reach NodePorts on 127.0.0.1 where the addresses hold it.
	localhost bool
	// ipv6 is the family: Resolve keeps local addresses of it alone.
	ipv6 bool
}

// ParseNodePortSpec validates the --nodeport-addresses values as kube-proxy
// does (CIDRs, or "primary" alone) and keeps those of the family (ipv6
// false: IPv4). localhost is --iptables-localhost-nodeports. The error names
// the first bad value.
func ParseNodePortSpec(values []string, ipv6, localhost bool) (NodePortSpec, error) {
	s := NodePortSpec{localhost: localhost && !ipv6, ipv6: ipv6}
	for i, v := range values {
		v = strings.TrimSpace(v)
		if v == NodePortPrimary {
			if len(values) != 1 {
				return NodePortSpec{}, fmt.Errorf("--nodeport-addresses: %q cannot be combined with CIDRs", NodePortPrimary)
			}
			s.primary = true
			return s, nil
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return NodePortSpec{}, fmt.Errorf("--nodeport-addresses: value %d (%q) is neither a CIDR nor %q: %w", i, v, NodePortPrimary, err)
		}
		if p.Addr().Is4() == ipv6 {
			continue
		}
		if p.Bits() == 0 {
			// A zero CIDR anywhere means every address.
			return NodePortSpec{localhost: s.localhost, ipv6: ipv6}, nil
		}
		s.prefixes = append(s.prefixes, p.Masked())
	}
	return s, nil
}

// String returns the value for logs: "all", "primary" or the CIDRs.
func (s NodePortSpec) String() string {
	switch {
	case s.primary:
		return NodePortPrimary
	case len(s.prefixes) == 0:
		return "all"
	}
	out := make([]string, len(s.prefixes))
	for i, p := range s.prefixes {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}

// NodePortAddresses is --nodeport-addresses resolved against the node for one
// sync: where NodePorts (and the health check node ports) are served. Every
// dataplane and the health check server read it from State.Node; nothing
// else interprets the flag.
type NodePortAddresses struct {
	// All is set when every local address accepts NodePorts. Rule-based
	// dataplanes then match the kernel's notion of a local destination
	// and servers listen on the unspecified address.
	All bool
	// Prefixes are the CIDRs that accept NodePorts when All is not set,
	// "primary" resolved to the node's primary IP.
	Prefixes []netip.Prefix
	// Addrs are the node's local addresses that accept NodePorts (every
	// one when All), loopback ones included, sorted.
	Addrs []netip.Addr
	// Localhost is set when the node's own sockets reach NodePorts on
	// 127.0.0.1 (kube-proxy's iptables mode, by default): Addrs hold a
	// loopback address and --iptables-localhost-nodeports is on.
	Localhost bool
}

// Resolve returns where NodePorts are served on node, whose interfaces hold
// the addresses local. Node.Addrs[0], the address the node is known by, is
// its primary IP.
func (s NodePortSpec) Resolve(node *Node, local []netip.Addr) NodePortAddresses {
	out := NodePortAddresses{Prefixes: s.prefixes}
	if s.primary {
		out.Prefixes = nil
		if len(node.Addrs) > 0 && !node.Addrs[0].IsLoopback() {
			ip := node.Addrs[0].Unmap()
			out.Prefixes = []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}
		}
	}
	out.All = len(out.Prefixes) == 0
	for _, a := range local {
		a = a.Unmap()
		if a.Is6() != s.ipv6 || slices.Contains(out.Addrs, a) {
			continue
		}
		if out.All || slices.ContainsFunc(out.Prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
			out.Addrs = append(out.Addrs, a)
			if a.IsLoopback() && s.localhost {
				out.Localhost = true
			}
		}
	}
	slices.SortFunc(out.Addrs, netip.Addr.Compare)
	return out
}

// External returns the addresses that accept NodePorts from the network:
// Addrs without the loopback ones.
func (n *NodePortAddresses) External() []netip.Addr {
	out := make([]netip.Addr, 0, len(n.Addrs))
	for _, a := range n.Addrs {
		if !a.IsLoopback() {
			out = append(out, a)
		}
	}
	return out
}

// Equal reports whether n and o serve NodePorts in the same places.
func (n *NodePortAddresses) Equal(o *NodePortAddresses) bool {
	return n.All == o.All && n.Localhost == o.Localhost &&
		slices.Equal(n.Prefixes, o.Prefixes) && slices.Equal(n.Addrs, o.Addrs)
}
