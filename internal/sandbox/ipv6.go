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
	// fd00:10:244:<i in hex>::/64.
	PodCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
	// ServiceCIDR6 is where tests allocate IPv6 ClusterIPs; like
	// ServiceCIDR, no route leads there.
	ServiceCIDR6 = netip.MustParsePrefix("fd00:10:96::/112")
	// NodeCIDR6 is the node network; the router is ::1, node i is
	// ::<10+i in hex>, beside its IPv4 .(10+i).
	NodeCIDR6 = netip.MustParsePrefix("fd00:192:168:77::/64")
	// ExternalCIDR6 holds clients outside the cluster; the router is ::1.
	ExternalCIDR6 = netip.MustParsePrefix("fd00:198:18::/64")
	// LoadBalancerCIDR6 is where tests allocate IPv6 LoadBalancer and
	// external IPs; see RouteToNode.
	LoadBalancerCIDR6 = netip.MustParsePrefix("fd00:198:19::/64")
)

// IPv6Of returns the IPv6 twin of an IPv4 address of the address plan, so
// that a test written with IPv4 literals can name the same host's or
// frontend's IPv6 address. The address keeps its host part, written into
// the low bits of the twin network:
//
//   - a pod or client 10.244.i.x is fd00:10:244:i::x (node i's /64);
//   - a node or the router 192.168.77.x is fd00:192:168:77::x;
//   - an external client 198.18.0.x is fd00:198:18::x;
//   - a LoadBalancer or external IP 198.19.0.x is fd00:198:19::x;
//   - a ClusterIP 10.96.a.b is fd00:10:96::<a><b>, its two low bytes as
//     the last 16 bits.
//
// The numbers are the same bytes written in hex: 10.244.1.10 is
// fd00:10:244:1::a, 192.168.77.11 is fd00:192:168:77::b and 10.96.1.2 is
// fd00:10:96::102. IPv6Of returns the zero Addr for an address outside the
// plan, so that a probe to it fails instead of going somewhere unplanned.
func IPv6Of(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if !ip.Is4() {
		return netip.Addr{}
	}
	v4 := ip.As4()
	var twin netip.Prefix
	switch {
	case PodCIDR.Contains(ip):
		a := PodCIDR6.Addr().As16()
		// The node's /24 becomes the node's /64.
		a[7], a[15] = v4[2], v4[3]
		return netip.AddrFrom16(a)
	case ServiceCIDR.Contains(ip):
		a := ServiceCIDR6.Addr().As16()
		a[14], a[15] = v4[2], v4[3]
		return netip.AddrFrom16(a)
	case NodeCIDR.Contains(ip):
		twin = NodeCIDR6
	case ExternalCIDR.Contains(ip):
		twin = ExternalCIDR6
	case LoadBalancerCIDR.Contains(ip):
		twin = LoadBalancerCIDR6
	default:
		return netip.Addr{}
	}
	a := twin.Addr().As16()
	a[15] = v4[3]
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
