package nftables

import (
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
)

// TestStaleUDPFlowsAreCleared runs behaviour.StaleUDPFlows against the
// nftables dataplane of each family, as the iptables and IPVS dataplanes
// run it: a resolver through a ClusterIP must move to the live endpoint
// when its own is removed, and reach a Service that gained its first
// endpoint, which only the deletion of stale UDP conntrack entries makes
// happen.
func TestStaleUDPFlowsAreCleared(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) { behaviour.StaleUDPFlows(t, behaviour.NewEnv(t, factory(false))) })
	t.Run("IPv6", func(t *testing.T) { behaviour.StaleUDPFlows(t, behaviour.NewEnv6(t, factory(true))) })
}
