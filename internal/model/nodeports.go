package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The --nodeport-addresses keywords (kube-proxy 1.37): each may be given
// once, and they combine with each other and with CIDRs.
const (
	// NodePortPrimary names the node's primary IP of each family.
	NodePortPrimary = "primary"
	// NodePortLocalhost names the loopback CIDRs, 127.0.0.0/8 and ::1/128.
	NodePortLocalhost = "localhost"
	// NodePortAll names the zero CIDRs: every local address.
	NodePortAll = "all"
)

// NodePortSpec is --nodeport-addresses (with --iptables-localhost-nodeports)
// parsed for one IP family, before it meets the node's addresses. The zero
// value accepts NodePorts on every local address, as the unset flag does.
//
// The semantics are upstream kube-proxy's (1.37):
//   - unset, or nothing of the family: every local address of the family;
//   - "all", or a zero CIDR (0.0.0.0/0) anywhere in the list: every local
//     address;
//   - CIDRs: the local addresses inside them; "localhost" is the loopback
//     CIDR of the family;
//   - "primary": the node's primary IP of the family, as a /32 (/128),
//     beside the CIDRs; a family whose primary IP is unknown or loopback
//     adds nothing, so that "primary" alone there means every address.
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
// 1.37 does (CIDRs and the keywords "primary", "localhost" and "all", each
// keyword once) and keeps those of the family (ipv6 false: IPv4).
// localhost is --iptables-localhost-nodeports. The error names the first
// bad value.
func ParseNodePortSpec(values []string, ipv6, localhost bool) (NodePortSpec, error) {
	s := NodePortSpec{localhost: localhost && !ipv6, ipv6: ipv6}
	all := false
	seen := map[string]bool{}
	for i, v := range values {
		v = strings.TrimSpace(v)
		switch v {
		case NodePortPrimary, NodePortLocalhost, NodePortAll:
			if seen[v] {
				return NodePortSpec{}, fmt.Errorf("--nodeport-addresses: value %d: keyword %q given twice", i, v)
			}
			seen[v] = true
			switch v {
			case NodePortPrimary:
				s.primary = true
			case NodePortLocalhost:
				lo := netip.MustParsePrefix("127.0.0.0/8")
				if ipv6 {
					lo = netip.MustParsePrefix("::1/128")
				}
				s.prefixes = append(s.prefixes, lo)
			case NodePortAll:
				all = true
			}
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return NodePortSpec{}, fmt.Errorf("--nodeport-addresses: value %d (%q) is neither a CIDR nor one of the keywords %q, %q, %q: %w",
				i, v, NodePortPrimary, NodePortLocalhost, NodePortAll, err)
		}
		if p.Addr().Is4() == ipv6 {
			continue
		}
		if p.Bits() == 0 {
			// A zero CIDR anywhere means every address.
			all = true
			continue
		}
		s.prefixes = append(s.prefixes, p.Masked())
	}
	if all {
		return NodePortSpec{localhost: s.localhost, ipv6: ipv6}, nil
	}
	return s, nil
}

// String returns the value for logs: "all", "primary" or the CIDRs.
func (s NodePortSpec) String() string {
	if !s.primary && len(s.prefixes) == 0 {
		return NodePortAll
	}
	var out []string
	if s.primary {
		out = append(out, NodePortPrimary)
	}
	for _, p := range s.prefixes {
		out = append(out, p.String())
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
	if s.primary && len(node.Addrs) > 0 && !node.Addrs[0].IsLoopback() {
		ip := node.Addrs[0].Unmap()
		out.Prefixes = append(slices.Clone(s.prefixes), netip.PrefixFrom(ip, ip.BitLen()))
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
