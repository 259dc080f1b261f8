package ipvs

import (
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
)

// TestConntrackCleanerFollowsTheConfig: each family's dataplane cleans the
// conntrack table of its own family in its own namespace.
func TestConntrackCleanerFollowsTheConfig(t *testing.T) {
	for _, cfg := range []Config{{Netns: "/run/netns/a"}, {Netns: "/run/netns/b", IPv6: true}, {}} {
		c := cfg.conntrackCleaner()
		if c.Netns() != cfg.Netns || c.IPv6() != cfg.IPv6 {
			t.Errorf("config (netns %q, IPv6 %t): cleaner of netns %q, IPv6 %t", cfg.Netns, cfg.IPv6, c.Netns(), c.IPv6())
		}
	}
}

// TestStaleUDPFlowsAreCleared runs behaviour.StaleUDPFlows against the
// IPVS dataplane of each family. IPVS forgets a removed UDP real server's
// connections, but the flow's conntrack entry keeps the reply tuple IPVS
// gave it at the first packet, so that without the deletion of stale
// entries the resolver stays with the removed endpoint (upstream's IPVS
// mode deletes them too).
func TestStaleUDPFlowsAreCleared(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam testFamily) {
		requireIPVS(t)
		behaviour.StaleUDPFlows(t, fam.newEnv(t, factory(Config{IPv6: fam.ipv6})))
	})
}
