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
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// Prefix starts the name of every chain this package (and the IPVS
// dataplane) creates. Cleanup removes every chain that carries it.
const Prefix = xtables.Prefix

// Defaults.
const (
	// DefaultMasqueradeBit is kube-proxy's --iptables-masquerade-bit.
	DefaultMasqueradeBit = 14
	// DefaultTimeout bounds one iptables-restore run. iptables-nft-restore
	// takes about half a minute for a ruleset of 10,000 Services.
	DefaultTimeout = 5 * time.Minute
	// largeClusterEndpoints is kube-proxy's threshold above which rules in
	// the per-Service chains carry no comments, which makes the restore
	// input about 40% smaller.
	largeClusterEndpoints = 1000
)

// Config configures the iptables dataplane.
type Config struct {
	// Netns is the path of the network namespace to program; "" is the
	// agent's own. Tests program a sandbox node's namespace.
	Netns string
	// IPv6 makes this the IPv6 dataplane: it writes with the ip6tables
	// tools of the back end, and the State it syncs holds IPv6 addresses
	// only. False is IPv4.
	IPv6 bool
	// Backend is xtables.BackendAuto (legacy where its tools and kernel
	// tables exist, else nf_tables), xtables.BackendLegacy or
	// xtables.BackendNFT.
	Backend string
	// ClusterCIDR holds every pod address of the family (kube-proxy's
	// --cluster-cidr with
	// --detect-local-mode=ClusterCIDR). When set, ClusterIP traffic from
	// outside it is masqueraded and pod traffic to the external frontends of
	// an externalTrafficPolicy=Local Service is short-circuited to all
	// endpoints. The zero Prefix disables both, as upstream's no-op
	// detector does.
	ClusterCIDR netip.Prefix
	// LocalDetector, when set, tells pod traffic from the rest instead of
	// ClusterCIDR (--detect-local-mode=BridgeInterface or
	// InterfaceNamePrefix), for the same two rules.
	LocalDetector xtables.LocalDetector
	// MasqueradeAll masquerades all ClusterIP traffic (--masquerade-all).
	MasqueradeAll bool
	// MasqueradeBit is the bit of the packet mark that asks for masquerade
	// (--iptables-masquerade-bit, 0..31); 0 means DefaultMasqueradeBit.
	MasqueradeBit int
	// NodeIPs are the node's addresses; a LoadBalancer source range that
	// holds one also admits traffic from the LoadBalancer IP itself, as
	// upstream does. Addresses of the other family are ignored. Empty
	// uses the addresses of the model's Node.
	NodeIPs []netip.Addr
	// Timeout bounds each iptables run; 0 means DefaultTimeout.
	Timeout time.Duration
	// Logger receives one line per failure and per start-up, and the
	// deletions of stale conntrack entries; nil logs nothing.
	Logger *zap.Logger
	// Metrics, if set, receives kubeproxy_sync_proxy_rules_iptables_* and
	// kubeproxy_conntrack_reconciler_*.
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
	switch c.Backend {
	case xtables.BackendAuto, xtables.BackendLegacy, xtables.BackendNFT:
	default:
		return fmt.Errorf("iptables back end %q: want %q, %q or empty for auto", c.Backend, xtables.BackendLegacy, xtables.BackendNFT)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
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
