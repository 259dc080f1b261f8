package iptables

import (
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// factory programs each sandbox node with the iptables dataplane, the
// rules living in the node's namespace only.
func factory(backend string) behaviour.Factory {
	return func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
		m := metrics.New(metrics.IPv4)
		d, err := New(behaviour.Context(t), Config{
			Netns:       node.NS.Path(),
			Backend:     backend,
			ClusterCIDR: example.ClusterCIDR,
			Metrics:     &m.FamilyMetrics,
		})
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
			e := behaviour.NewEnv(t, factory(backend))
			behaviour.Run(t, e, behaviour.Cases())
		})
	}
}
