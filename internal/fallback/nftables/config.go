// Package nftables is the nftables fallback dataplane: it renders the
// verdicts of the model (model.Service.Internal, External and ShortCircuit)
// as kube-proxy's nftables mode does, and writes them with knftables
// (sigs.k8s.io/knftables, which drives the nft tool), one transaction per
// sync.
//
// The layout follows upstream's nftables mode, in a table of our own per IP
// family (ip ebpf-proxy, ip6 ebpf-proxy), so that it never touches
// kube-proxy's table:
//
//	base chains   nat-prerouting, nat-output   jump services
//	              nat-postrouting               jump masquerading
//	              filter-prerouting, filter-output  firewall-check (before DNAT)
//	              filter-input, filter-forward, filter-output-post-dnat
//	                                            the no-endpoint checks (after DNAT)
//	services      one lookup in the verdict map service-ips (ClusterIP,
//	              ExternalIP, LoadBalancer IP . protocol . port) and one in
//	              service-nodeports (protocol . port) for the node's
//	              addresses, so that the cost per packet does not grow
//	              with the number of Services
//	service-<h>-<ns>/<name>/<proto>/<port>   Cluster endpoints, picked by
//	              numgen rules (see balance)
//	local-<h>-...      Local endpoints
//	external-<h>-...   external traffic: masquerade, short-circuit
//	firewall-<h>-...   loadBalancerSourceRanges
//	endpoint-<h>-.../<ip>/<port>  one endpoint: hairpin masquerade, affinity, DNAT
//	affinity-<h>-...   the set of clients with ClientIP affinity to an endpoint
//	no-endpoint-services, no-endpoint-nodeports  verdict maps: reject (in
//	              the filter chain reject-chain) or drop
//	firewall-ips  verdict map: LoadBalancer IPs with source ranges
//
// The dataplane serves one IP family (Config.IPv6), as each of upstream's
// per-family proxiers does; a dual-stack node runs one per family, each
// with its own table.
//
// A full sync flushes every chain and map of the table and writes them
// again, deleting the chains and sets nothing wants any more, in one
// transaction; a partial sync rewrites only the chains, sets and map
// elements of the changed Services.
package nftables

import (
	"fmt"
	"net/netip"

	"sigs.k8s.io/knftables"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
)

// TableName names our table in both the ip and the ip6 family.
const TableName = "ebpf-proxy"

// Config configures the nftables dataplane: one IP family's table (the
// ip or the ip6 ebpf-proxy table, as Netfilter.IPv6 says).
type Config struct {
	xtables.Netfilter
	// Table names the table in place of TableName: a dataplane that
	// serves some ServicePorts beside another mode's (the BPF mode's SCTP
	// ones) keeps its own table, which the nftables mode's cleanup leaves.
	Table string
	// Beside says the table serves only the ServicePorts it is given,
	// beside another dataplane that serves the others: it leaves the
	// forwarded traffic of those alone (no INVALID drop in filter-forward,
	// which is the mode's own choice for its TCP).
	Beside bool
}

func (c *Config) setDefaults() error {
	if c.Table == "" {
		c.Table = TableName
	}
	return c.Netfilter.SetDefaults()
}

// masqMark is the mark value of the masquerade bit, "0x4000".
func (c *Config) masqMark() string { return fmt.Sprintf("%#x", uint32(1)<<c.MasqueradeBit) }

// family holds what the rules of the two IP families differ in.
type family struct {
	name string
	nft  knftables.Family
	// ip is the payload expression of the IP header ("ip", "ip6").
	ip string
	// addrType is the set type of an address ("ipv4_addr").
	addrType string
	// loopback never serves NodePorts, as in upstream's nftables mode
	// (route_localnet is never set, CVE-2020-8558).
	loopback netip.Prefix
	// icmp names the ICMP of the family in a reject ("icmp", "icmpv6").
	icmp string
}

var (
	familyIPv4 = family{name: "IPv4", nft: knftables.IPv4Family, ip: "ip", addrType: "ipv4_addr",
		loopback: netip.MustParsePrefix("127.0.0.0/8"), icmp: "icmp"}
	familyIPv6 = family{name: "IPv6", nft: knftables.IPv6Family, ip: "ip6", addrType: "ipv6_addr",
		loopback: netip.MustParsePrefix("::1/128"), icmp: "icmpv6"}
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
