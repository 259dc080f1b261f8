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
	"time"

	"go.uber.org/zap"
	"sigs.k8s.io/knftables"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// TableName names our table in both the ip and the ip6 family.
const TableName = "ebpf-proxy"

// Defaults.
const (
	// DefaultMasqueradeBit is kube-proxy's --iptables-masquerade-bit, which
	// its nftables mode uses too.
	DefaultMasqueradeBit = 14
	// DefaultTimeout bounds one nft run.
	DefaultTimeout = 5 * time.Minute
)

// Config configures the nftables dataplane.
type Config struct {
	// Netns is the path of the network namespace to program; "" is the
	// agent's own. Tests program a sandbox node's namespace.
	Netns string
	// IPv6 makes this the IPv6 dataplane (table ip6 ebpf-proxy); the State
	// it syncs holds IPv6 addresses only. False is IPv4.
	IPv6 bool
	// ClusterCIDR holds every pod address of the family (--cluster-cidr
	// with --detect-local-mode=ClusterCIDR). When set, ClusterIP traffic
	// from outside it is masqueraded and pod traffic to the external
	// frontends of an externalTrafficPolicy=Local Service is
	// short-circuited to all endpoints. The zero Prefix disables both.
	ClusterCIDR netip.Prefix
	// LocalDetector, when set, tells pod traffic from the rest instead of
	// ClusterCIDR (--detect-local-mode=BridgeInterface or
	// InterfaceNamePrefix).
	LocalDetector xtables.LocalDetector
	// MasqueradeAll masquerades all ClusterIP traffic (--masquerade-all).
	MasqueradeAll bool
	// MasqueradeBit is the bit of the packet mark that asks for masquerade
	// (0..31); 0 means DefaultMasqueradeBit.
	MasqueradeBit int
	// NodeIPs are the node's addresses; a LoadBalancer source range that
	// holds one also admits traffic from the LoadBalancer IP itself, as
	// upstream does. Addresses of the other family are ignored. Empty
	// uses the addresses of the model's Node.
	NodeIPs []netip.Addr
	// Timeout bounds each nft run; 0 means DefaultTimeout.
	Timeout time.Duration
	// Logger receives one line per failure and per start-up; nil logs
	// nothing.
	Logger *zap.Logger
	// Metrics, if set, receives
	// kubeproxy_sync_proxy_rules_nftables_sync_failures_total.
	Metrics *metrics.FamilyMetrics
}

func (c *Config) setDefaults() error {
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = DefaultMasqueradeBit
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("masquerade bit %d: want 0..31", c.MasqueradeBit)
	}
	if c.ClusterCIDR.IsValid() && c.ClusterCIDR.Addr().Is6() != c.IPv6 {
		return fmt.Errorf("cluster CIDR %s: not of the dataplane's family %s", c.ClusterCIDR, c.family().name)
	}
	if !c.LocalDetector.IsSet() {
		c.LocalDetector.CIDR = c.ClusterCIDR
	}
	if err := c.LocalDetector.Validate(c.IPv6); err != nil {
		return err
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
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
