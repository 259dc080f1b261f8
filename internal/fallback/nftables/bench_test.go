package nftables

import (
	"fmt"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// BenchmarkSync measures syncs of 1,000 and 10,000 Services with 10
// endpoints each, applied for real inside a test namespace:
//
//	first    New and the first sync on a fresh node: everything written
//	full     a periodic full sync with nothing changed: the table flushed
//	         and written again, as upstream's full syncs do
//	partial  one endpoint of one Service changed
//
// It reports the operations of the last transaction handed to nft.
func BenchmarkSync(b *testing.B) {
	for _, n := range example.BenchScales {
		for _, kind := range example.SyncKinds {
			b.Run(fmt.Sprintf("services=%d/%s", n, kind), func(b *testing.B) {
				scale := example.NewScale(n, 10)
				var ops int
				example.BenchSync(b, scale, kind, example.SyncBenchmark[*Dataplane]{
					New: func() *Dataplane {
						d, err := New(b.Context(), Config{Netfilter: xtables.Netfilter{Netns: sandbox.TestNetns(b, "nft-bench").Path(), ClusterCIDR: example.ClusterCIDR}})
						if err != nil {
							b.Fatal(err)
						}
						return d
					},
					TimeNew: true,
					// Rendering again to count costs no kernel time.
					After: func(d *Dataplane, up model.Update) {
						if kind == "partial" {
							ops = d.plan.partial(d.nft.NewTransaction(), up).tx.NumOperations()
							return
						}
						p := newPlanner(&d.cfg)
						p.r = d.plan.r
						ops = p.full(d.nft.NewTransaction(), up.State).tx.NumOperations()
					},
				})
				b.ReportMetric(float64(ops), "nft-operations")
			})
		}
	}
}
