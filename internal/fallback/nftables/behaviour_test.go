package nftables

import (
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// factory programs each sandbox node with the nftables dataplane of a
// family, the table living in the node's namespace only.
func factory(ipv6 bool) behaviour.Factory {
	return func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
		cidr := example.ClusterCIDR
		if ipv6 {
			cidr = example.ClusterCIDR6
		}
		d, err := New(behaviour.Context(t), Config{Netfilter: xtables.Netfilter{Netns: node.NS.Path(), IPv6: ipv6, ClusterCIDR: cidr}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

func TestTrafficFollowsTheModelVerdicts(t *testing.T) {
	e := behaviour.NewEnv(t, factory(false))
	behaviour.Run(t, e, behaviour.Cases())
}

// TestIPv6TrafficFollowsTheModelVerdicts runs the same table over IPv6:
// the IPv6 dataplane (table ip6 ebpf-proxy) of each node serves the example
// cluster's IPv6 twin, and every row connects to the IPv6 twin of its
// destination.
func TestIPv6TrafficFollowsTheModelVerdicts(t *testing.T) {
	e := behaviour.NewEnv6(t, factory(true))
	behaviour.Run(t, e, behaviour.Cases())
}
