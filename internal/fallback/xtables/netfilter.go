package xtables

import (
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// Defaults of Netfilter.
const (
	// DefaultMasqueradeBit is kube-proxy's --iptables-masquerade-bit
	// default (the flag's, config's), which its nftables mode uses too.
	DefaultMasqueradeBit = config.DefaultMasqueradeBit
	// DefaultTimeout bounds one run of the dataplane's tool (nft,
	// iptables-restore). iptables-nft-restore takes about half a minute
	// for a ruleset of 10,000 Services.
	DefaultTimeout = 5 * time.Minute
)

// Netfilter is what the netfilter dataplanes (nftables, iptables, IPVS)
// are configured with alike; each embeds it in its Config.
type Netfilter struct {
	// Netns is the path of the network namespace to program; "" is the
	// agent's own. Tests program a sandbox node's namespace.
	Netns string
	// IPv6 makes this the dataplane of IPv6: it writes IPv6 rules
	// (ip6tables, an ip6 table, IPv6 virtual servers), and the State it
	// syncs holds IPv6 addresses only. False is IPv4.
	IPv6 bool
	// ClusterCIDR holds every pod address of the family (kube-proxy's
	// --cluster-cidr with --detect-local-mode=ClusterCIDR). When set,
	// ClusterIP traffic from outside it is masqueraded and pod traffic to
	// the external frontends of an externalTrafficPolicy=Local Service is
	// short-circuited to all endpoints. The zero Prefix disables both, as
	// upstream's no-op detector does.
	ClusterCIDR netip.Prefix
	// LocalDetector, when set, tells pod traffic from the rest instead of
	// ClusterCIDR (--detect-local-mode=BridgeInterface or
	// InterfaceNamePrefix), for the same two rules.
	LocalDetector LocalDetector
	// MasqueradeAll masquerades all ClusterIP traffic (--masquerade-all).
	MasqueradeAll bool
	// MasqueradeBit is the bit of the packet mark that asks for masquerade
	// (--iptables-masquerade-bit, 0..31); 0 means DefaultMasqueradeBit.
	MasqueradeBit int
	// NodeIPs are the node's addresses; a LoadBalancer source range that
	// holds one also admits traffic from the LoadBalancer IP itself, as
	// upstream does. Empty uses the addresses of the model's Node.
	NodeIPs []netip.Addr
	// Timeout bounds each run of the dataplane's tool; 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// Logger receives one line per failure and per start-up, and the
	// deletions of stale conntrack entries; nil logs nothing.
	Logger *zap.Logger
	// Metrics, if set, receives the dataplane's sync metrics
	// (kubeproxy_sync_proxy_rules_*) and kubeproxy_conntrack_reconciler_*.
	Metrics *metrics.FamilyMetrics
}

// NetfilterFrom is the Netfilter configuration of an IP family from the
// agent's settings.
func NetfilterFrom(o *config.Options, family string, m *metrics.Metrics, log *zap.Logger) (Netfilter, error) {
	local, err := LocalDetectorFor(o)
	if err != nil {
		return Netfilter{}, err
	}
	n := Netfilter{IPv6: family == metrics.IPv6, ClusterCIDR: o.ClusterPrefixes[family], LocalDetector: local,
		MasqueradeAll: o.MasqueradeAll, MasqueradeBit: int(o.MasqueradeBit), Logger: log}
	if m != nil {
		n.Metrics = m.Family(family)
	}
	return n, nil
}

// SetDefaults fills in the defaults of zero fields and checks the rest:
// the masquerade bit, and the cluster CIDR and the local detector against
// the family.
func (n *Netfilter) SetDefaults() error {
	if n.MasqueradeBit == 0 {
		n.MasqueradeBit = DefaultMasqueradeBit
	}
	if n.MasqueradeBit < 0 || n.MasqueradeBit > 31 {
		return fmt.Errorf("masquerade bit %d: want 0..31", n.MasqueradeBit)
	}
	if n.ClusterCIDR.IsValid() && n.ClusterCIDR.Addr().Is6() != n.IPv6 {
		return fmt.Errorf("cluster CIDR %s: not of the dataplane's family %s", n.ClusterCIDR, n.Family())
	}
	if !n.LocalDetector.IsSet() {
		n.LocalDetector.CIDR = n.ClusterCIDR
	}
	if err := n.LocalDetector.Validate(n.IPv6); err != nil {
		return err
	}
	if n.Timeout <= 0 {
		n.Timeout = DefaultTimeout
	}
	if n.Logger == nil {
		n.Logger = zap.NewNop()
	}
	return nil
}

// Family is the dataplane's IP family, metrics.IPv4 or metrics.IPv6.
func (n *Netfilter) Family() string {
	if n.IPv6 {
		return metrics.IPv6
	}
	return metrics.IPv4
}

// CheckBackend checks the name of an iptables back end a dataplane is
// configured with: BackendAuto (empty), BackendLegacy or BackendNFT.
func CheckBackend(name string) error {
	switch name {
	case BackendAuto, BackendLegacy, BackendNFT:
		return nil
	}
	return fmt.Errorf("iptables back end %q: want %q, %q or empty for auto", name, BackendLegacy, BackendNFT)
}
