// Package nodeaddrs implements kube-proxy's --nodeport-addresses: which of
// the node's own addresses accept NodePort traffic and serve the health
// check node ports of externalTrafficPolicy=Local Services.
//
// The semantics are upstream's (pkg/proxy/util NodePortAddresses and
// cmd/kube-proxy's handling of "primary"), for one IP family:
//
//   - unset, or no CIDR of the family: every local address of the family;
//   - a zero CIDR (0.0.0.0/0) anywhere in the list: every local address;
//   - CIDRs: the local addresses (of the node's interfaces) inside them;
//   - "primary", alone: the node's primary IP, as a /32 (/128). Without a
//     known, non-loopback primary IP it means every local address.
package nodeaddrs

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Primary is the special --nodeport-addresses value naming the node's
// primary IP.
const Primary = "primary"

// NodePortAddresses is a parsed --nodeport-addresses for one IP family.
// The zero value matches every local address.
type NodePortAddresses struct {
	// prefixes are the CIDRs of the family, masked; empty means all.
	prefixes []netip.Prefix
	primary  bool
	matchAll bool
}

// Parse validates values as kube-proxy does (a list of CIDRs, or "primary"
// alone) and keeps what applies to the family (ipv6 false: IPv4). It
// returns an error naming the first bad value.
func Parse(values []string, ipv6 bool) (*NodePortAddresses, error) {
	npa := &NodePortAddresses{}
	for i, v := range values {
		v = strings.TrimSpace(v)
		if v == Primary {
			if len(values) != 1 {
				return nil, fmt.Errorf("--nodeport-addresses: %q cannot be combined with CIDRs", Primary)
			}
			npa.primary = true
			return npa, nil
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("--nodeport-addresses: value %d (%q) is not a CIDR: %w", i, v, err)
		}
		if p.Addr().Is4() == ipv6 {
			continue
		}
		npa.prefixes = append(npa.prefixes, p.Masked())
	}
	npa.matchAll = len(npa.prefixes) == 0
	for _, p := range npa.prefixes {
		if p.Bits() == 0 {
			npa.matchAll = true
		}
	}
	if npa.matchAll {
		npa.prefixes = nil
	}
	return npa, nil
}

// IsPrimary reports whether the value was "primary", whose meaning depends
// on the node's primary IP.
func (n *NodePortAddresses) IsPrimary() bool { return n != nil && n.primary }

// String returns the CIDRs the value stands for, for logs.
func (n *NodePortAddresses) String() string {
	switch {
	case n == nil || n.matchAll:
		return "all"
	case n.primary:
		return Primary
	}
	s := make([]string, len(n.prefixes))
	for i, p := range n.prefixes {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Resolve returns the prefixes the value stands for on a node whose primary
// IP is primaryIP (the zero Addr when unknown), and whether it matches every
// local address instead. kube-proxy expands "primary" to the primary IP as
// a single-address prefix, and an unknown or loopback primary IP (its
// fallback when the Node object never appeared) to every address.
func (n *NodePortAddresses) Resolve(primaryIP netip.Addr) (prefixes []netip.Prefix, all bool) {
	if n == nil || n.matchAll {
		return nil, true
	}
	if !n.primary {
		return n.prefixes, false
	}
	if !primaryIP.IsValid() || primaryIP.IsLoopback() {
		return nil, true
	}
	ip := primaryIP.Unmap()
	return []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}, false
}

// Match returns the addresses of local (the node's interface addresses)
// that lie in prefixes, deduplicated, in the order of local. An address in
// none of them is not served, even when that leaves nothing: kube-proxy
// then serves on no address at all.
func Match(prefixes []netip.Prefix, local []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range local {
		a = a.Unmap()
		for _, p := range prefixes {
			if p.Contains(a) && !contains(out, a) {
				out = append(out, a)
				break
			}
		}
	}
	return out
}

func contains(addrs []netip.Addr, a netip.Addr) bool {
	for _, b := range addrs {
		if a == b {
			return true
		}
	}
	return false
}

// InterfaceAddrs returns the addresses of every interface of the calling
// process's network namespace (the node's, for the agent).
func InterfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		default:
			continue
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, addr.Unmap())
		}
	}
	return out, nil
}

// ListenAddrs returns the addresses a server bound to the node-port
// addresses listens on, for a node whose primary IP is primaryIP: the
// unspecified address when every address matches, else the local
// addresses (from local) inside the prefixes. When the local addresses
// cannot be listed it returns the unspecified address with the error, as
// kube-proxy falls back to listening on every address.
func (n *NodePortAddresses) ListenAddrs(primaryIP netip.Addr, local func() ([]netip.Addr, error)) ([]netip.Addr, error) {
	all := []netip.Addr{netip.IPv4Unspecified()}
	prefixes, matchAll := n.Resolve(primaryIP)
	if matchAll {
		return all, nil
	}
	addrs, err := local()
	if err != nil {
		return all, err
	}
	return Match(prefixes, addrs), nil
}
