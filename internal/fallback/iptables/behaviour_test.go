package iptables

import (
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/fallbacktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// factory programs each sandbox node with the iptables dataplane, the
// rules living in the node's namespace only.
func factory(backend string) fallbacktest.Factory {
	return func(t *testing.T, node *sandbox.Node) dataplane.Dataplane {
		m := metrics.New(metrics.IPv4)
		d, err := New(fallbacktest.Context(t), Config{
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
			e := fallbacktest.NewEnv(t, factory(backend))
			fallbacktest.Run(t, e, fallbacktest.Cases())
		})
	}
}
