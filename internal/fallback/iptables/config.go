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
	// Backend is xtables.BackendAuto (legacy where its tools and kernel
	// tables exist, else nf_tables), xtables.BackendLegacy or
	// xtables.BackendNFT.
	Backend string
	// ClusterCIDR holds every pod address (kube-proxy's --cluster-cidr with
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
	// upstream does. Empty uses the addresses of the model's Node.
	NodeIPs []netip.Addr
	// Timeout bounds each iptables run; 0 means DefaultTimeout.
	Timeout time.Duration
	// Logger receives one line per failure and per start-up; nil logs
	// nothing.
	Logger *zap.Logger
	// Metrics, if set, receives kubeproxy_sync_proxy_rules_iptables_*.
	Metrics *metrics.FamilyMetrics
}

func (c *Config) setDefaults() error {
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = DefaultMasqueradeBit
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("masquerade bit %d: want 0..31", c.MasqueradeBit)
	}
	if c.ClusterCIDR.IsValid() && !c.ClusterCIDR.Addr().Is4() {
		return fmt.Errorf("cluster CIDR %s: the iptables dataplane is IPv4 only", c.ClusterCIDR)
	}
	if !c.LocalDetector.IsSet() {
		c.LocalDetector.CIDR = c.ClusterCIDR
	}
	if err := c.LocalDetector.Validate(); err != nil {
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
