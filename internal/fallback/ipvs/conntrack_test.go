package ipvs

import (
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
)

// TestConntrackCleanerFollowsTheConfig: each family's dataplane cleans the
// conntrack table of its own family in its own namespace.
func TestConntrackCleanerFollowsTheConfig(t *testing.T) {
	for _, cfg := range []Config{{Netfilter: xtables.Netfilter{Netns: "/run/netns/a"}}, {Netfilter: xtables.Netfilter{Netns: "/run/netns/b", IPv6: true}}, {}} {
		c := cfg.conntrackCleaner()
		if c.Netns() != cfg.Netns || c.IPv6() != cfg.IPv6 {
			t.Errorf("config (netns %q, IPv6 %t): cleaner of netns %q, IPv6 %t", cfg.Netns, cfg.IPv6, c.Netns(), c.IPv6())
		}
	}
}

// TestStaleUDPFlowsAreCleared runs behaviour.StaleUDPFlows against the
// IPVS dataplane of each family. IPVS moves the resolver off a removed
// endpoint by itself (expire_nodest_conn; that case passes without the
// deletion of stale entries too), but a flow that left the node
// untranslated before its Service was programmed stays untranslated
// unless its conntrack entry is deleted (on kernel 6.12, the blackholed
// case fails without it).
func TestStaleUDPFlowsAreCleared(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam testFamily) {
		requireIPVS(t)
		behaviour.StaleUDPFlows(t, fam.newEnv(t, factory(Config{Netfilter: xtables.Netfilter{IPv6: fam.ipv6}})))
	})
}
