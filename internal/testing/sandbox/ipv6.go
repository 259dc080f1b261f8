package sandbox

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
)

// The IPv6 half of the address plan: every IPv4 network above has a twin
// here, and every host of a sandbox has an address in both (see IPv6Of).
// Like the IPv4 networks, they exist only inside sandbox namespaces.
var (
	// PodCIDR6 holds every pod; node i (from 1) gets the /64
	// fd00:10:244:<i in hex>::/64 (the same as i's decimal below 10).
	PodCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
	// ServiceCIDR6 is where tests allocate IPv6 ClusterIPs; like
	// ServiceCIDR, no route leads there.
	ServiceCIDR6 = netip.MustParsePrefix("fd00:10:96::/112")
	// NodeCIDR6 is the node network; the router is ::1, node i is
	// ::<10+i>, beside its IPv4 .(10+i).
	NodeCIDR6 = netip.MustParsePrefix("fd00:192:168:77::/64")
	// ExternalCIDR6 holds clients outside the cluster; the router is ::1.
	ExternalCIDR6 = netip.MustParsePrefix("fd00:198:18::/64")
	// LoadBalancerCIDR6 is where tests allocate IPv6 LoadBalancer and
	// external IPs; see RouteToNode.
	LoadBalancerCIDR6 = netip.MustParsePrefix("fd00:198:19::/64")
)

// IPv6Of returns the IPv6 twin of an IPv4 address of the address plan, so
// that a test written with IPv4 literals can name the same host's or
// frontend's IPv6 address. The twin keeps the host part's decimal digits,
// read as hex, so that both addresses end alike:
//
//   - a pod or client 10.244.i.x is fd00:10:244:i::x (node i's /64; the
//     node's index is the /64's last byte);
//   - a node or the router 192.168.77.x is fd00:192:168:77::x;
//   - an external client 198.18.0.x is fd00:198:18::x;
//   - a LoadBalancer or external IP 198.19.0.x is fd00:198:19::x;
//   - a ClusterIP 10.96.a.b with a below 10 is fd00:10:96::<a><b in three
//     digits>: 10.96.0.10 is fd00:10:96::10, 10.96.1.2 is fd00:10:96::1002.
//
// For example 10.244.1.10 is fd00:10:244:1::10 and 192.168.77.11 is
// fd00:192:168:77::11. IPv6Of returns the zero Addr for an address outside
// the plan, or a ClusterIP without a twin, so that a probe to it fails
// instead of going somewhere unplanned.
func IPv6Of(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if !ip.Is4() {
		return netip.Addr{}
	}
	v4 := ip.As4()
	var twin netip.Prefix
	switch {
	case PodCIDR.Contains(ip):
		twin = PodCIDR6
		// The node's /24 becomes the node's /64.
		a := twin.Addr().As16()
		a[7] = v4[2]
		twin = netip.PrefixFrom(netip.AddrFrom16(a), 64)
	case ServiceCIDR.Contains(ip):
		if v4[2] >= 10 {
			return netip.Addr{}
		}
		return withLow16(ServiceCIDR6, decimalAsHex(int(v4[2])*1000+int(v4[3])))
	case NodeCIDR.Contains(ip):
		twin = NodeCIDR6
	case ExternalCIDR.Contains(ip):
		twin = ExternalCIDR6
	case LoadBalancerCIDR.Contains(ip):
		twin = LoadBalancerCIDR6
	default:
		return netip.Addr{}
	}
	return withLow16(twin, decimalAsHex(int(v4[3])))
}

// decimalAsHex is the number whose hex digits are n's decimal ones (n below
// 10,000): 10 gives 0x10, 255 gives 0x255.
func decimalAsHex(n int) uint16 {
	var v uint16
	for shift := uint16(1); n > 0; n, shift = n/10, shift*16 {
		v += uint16(n%10) * shift
	}
	return v
}

// withLow16 is the address of prefix p whose last 16 bits are v.
func withLow16(p netip.Prefix, v uint16) netip.Addr {
	a := p.Addr().As16()
	a[14], a[15] = byte(v>>8), byte(v)
	return netip.AddrFrom16(a)
}

// ipv6Settings are the IPv6 sysctls of every namespace of a sandbox, set
// before any interface exists there so that every interface inherits them
// through "default":
//   - accept_dad 0: addresses are usable at once, without the second or so
//     of duplicate address detection, during which a test's first packets
//     would find no source address (nothing else could claim an address
//     inside a sandbox);
//   - accept_ra 0: addresses and routes come only from the sandbox, never
//     from a router advertisement (which nothing in a sandbox sends).
var ipv6Settings = []struct{ key, value string }{
	{"all/accept_dad", "0"},
	{"default/accept_dad", "0"},
	{"all/accept_ra", "0"},
	{"default/accept_ra", "0"},
}

// setUpIPv6 applies ipv6Settings in the calling thread's network namespace;
// it must run inside Netns.Do (see enableForwarding).
func setUpIPv6() error {
	for _, s := range ipv6Settings {
		if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", s.key), []byte(s.value+"\n"), 0o644); err != nil {
			return fmt.Errorf("set net.ipv6.conf.%s: %w", s.key, err)
		}
	}
	return nil
}
