// Package iptables is the iptables fallback dataplane: it renders the
// verdicts of the model (model.Service.Internal, External and ShortCircuit)
// as kube-proxy's iptables mode does, and writes them with iptables-restore,
// one transaction per sync.
//
// The rule layout is kube-proxy's, under our own prefix, so that it never
// touches kube-proxy's KUBE- chains:
//
//	nat     EBPFPROXY-SERVICES      one dispatch rule per frontend, NodePorts last
//	        EBPFPROXY-NODEPORTS     one rule per NodePort
//	        EBPFPROXY-SVC-<hash>    Cluster endpoints (random, affinity)
//	        EBPFPROXY-SVL-<hash>    Local endpoints
//	        EBPFPROXY-EXT-<hash>    external traffic: masquerade, short-circuit
//	        EBPFPROXY-FW-<hash>     loadBalancerSourceRanges
//	        EBPFPROXY-SEP-<hash>    one endpoint: hairpin SNAT, affinity, DNAT
//	        EBPFPROXY-MARK-MASQ     sets the masquerade bit
//	        EBPFPROXY-POSTROUTING   masquerades marked packets
//	filter  EBPFPROXY-SERVICES      REJECT/DROP for ClusterIPs without endpoints
//	        EBPFPROXY-EXTERNAL-SERVICES  REJECT/DROP for external frontends
//	        EBPFPROXY-NODEPORTS     ACCEPT health check node ports
//	        EBPFPROXY-FIREWALL      DROP LoadBalancer traffic from outside the ranges
//	        EBPFPROXY-FORWARD       accept marked and established forwarded traffic
//
// The dataplane serves one IP family, as each of upstream's per-family
// proxiers does: Config.IPv6 selects the ip6tables tools of the back end and
// the IPv6 rules (see family); a dual-stack node runs one dataplane per
// family, each fed the model State of its family.
//
// A full sync rewrites every chain and deletes our chains that are no longer
// wanted; a partial sync rewrites only the chains of the changed Services
// and edits their rules in the shared chains with -D and -I, so that its
// input grows with the change, not with the number of Services.
package iptables

import (
	"fmt"
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
)

// Prefix starts the name of every chain this package (and the IPVS
// dataplane) creates. Cleanup removes every chain that carries it.
const Prefix = xtables.Prefix

// largeClusterEndpoints is kube-proxy's threshold above which rules in
// the per-Service chains carry no comments, which makes the restore input
// about 40% smaller.
const largeClusterEndpoints = 1000

// Config configures the iptables dataplane of one IP family.
type Config struct {
	xtables.Netfilter
	// Backend is xtables.BackendAuto (legacy where its tools and kernel
	// tables exist, else nf_tables), xtables.BackendLegacy or
	// xtables.BackendNFT.
	Backend string
}

func (c *Config) setDefaults() error {
	if err := c.Netfilter.SetDefaults(); err != nil {
		return err
	}
	return xtables.CheckBackend(c.Backend)
}

// masqMark is the mark value and mask of the masquerade bit, "0x4000".
func (c *Config) masqMark() string { return fmt.Sprintf("%#x", uint32(1)<<c.MasqueradeBit) }

// family holds what the rules of the two IP families differ in, besides
// the addresses themselves. Upstream's iptables mode makes the same
// distinctions in its proxier for each family.
type family struct {
	name string
	// loopback never serves NodePorts. Upstream serves IPv4 NodePorts on
	// 127.0.0.0/8 only with route_localnet, which we never set
	// (CVE-2020-8558); IPv6 has no such sysctl, and upstream never serves
	// NodePorts on ::1.
	loopback netip.Prefix
	// hostMask is the -m recent mask that keeps one client address for
	// ClientIP affinity, as iptables-save prints the default.
	hostMask string
	// reject is the REJECT target's options. IPv4 relies on the default
	// (icmp-port-unreachable), which the IPv4 golden files show;
	// ip6tables' default is icmp6-port-unreachable, written out here
	// as ip6tables-save prints it (an IPv4 ICMP type is an error there).
	reject []string
}

var (
	familyIPv4 = family{
		name:     "IPv4",
		loopback: netip.MustParsePrefix("127.0.0.0/8"),
		hostMask: "255.255.255.255",
	}
	familyIPv6 = family{
		name:     "IPv6",
		loopback: netip.MustParsePrefix("::1/128"),
		hostMask: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
		reject:   []string{"--reject-with", "icmp6-port-unreachable"},
	}
)

// family returns the rules' differences for the configured family.
func (c *Config) family() *family {
	if c.IPv6 {
		return &familyIPv6
	}
	return &familyIPv4
}

// inFamily reports whether a is of the configured family; an IPv4-mapped
// IPv6 address is IPv4.
func (c *Config) inFamily(a netip.Addr) bool { return a.Unmap().Is6() == c.IPv6 }
