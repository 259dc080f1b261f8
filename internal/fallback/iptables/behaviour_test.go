package iptables

import (
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// factory programs each sandbox node with the iptables dataplane, the
// rules living in the node's namespace only.
func factory(backend string, ipv6 bool) behaviour.Factory {
	return func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
		family, cidr := metrics.IPv4, example.ClusterCIDR
		if ipv6 {
			family, cidr = metrics.IPv6, example.ClusterCIDR6
		}
		m := metrics.New(family)
		d, err := New(behaviour.Context(t), Config{Backend: backend, Netfilter: xtables.Netfilter{Netns: node.NS.Path(), IPv6: ipv6, ClusterCIDR: cidr, Metrics: &m.FamilyMetrics}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

func TestTrafficFollowsTheModelVerdicts(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			e := behaviour.NewEnv(t, factory(backend, false))
			behaviour.Run(t, e, behaviour.Cases())
		})
	}
}

// TestIPv6TrafficFollowsTheModelVerdicts runs the same table over IPv6:
// the IPv6 dataplane (ip6tables) of each node serves the example cluster's
// IPv6 twin, and every row connects to the IPv6 twin of its destination.
func TestIPv6TrafficFollowsTheModelVerdicts(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			requireTools(t, "ip6tables", backend)
			e := behaviour.NewEnv6(t, factory(backend, true))
			behaviour.Run(t, e, behaviour.Cases())
		})
	}
}
