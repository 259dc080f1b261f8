package iptables

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// BenchmarkSync measures syncs of 1,000 and 10,000 Services with 10
// endpoints each, applied for real inside a test namespace:
//
//	first    New and the first sync on a fresh node: every rule written
//	full     a periodic full sync with nothing changed: every Service
//	         rendered and compared, the hooks checked, nothing written
//	partial  one endpoint of one Service changed
//
// It reports the rules the dataplane owns and the bytes handed to
// iptables-restore. The first sync of 10,000 Services through
// iptables-nft-restore, which is quadratic in user space, takes tens of
// minutes; nft at 10,000 Services runs only with EBPF_PROXY_BENCH_SLOW=1.
func BenchmarkSync(b *testing.B) {
	for _, backend := range backends {
		for _, n := range example.BenchScales {
			for _, kind := range example.SyncKinds {
				b.Run(fmt.Sprintf("%s/services=%d/%s", backend, n, kind), func(b *testing.B) {
					requireBackend(b, backend)
					if backend == xtables.BackendNFT && n > 1000 && os.Getenv("EBPF_PROXY_BENCH_SLOW") != "1" {
						b.Skip("iptables-nft-restore takes tens of minutes for 10,000 Services; set EBPF_PROXY_BENCH_SLOW=1")
					}
					scale := example.NewScale(n, 10)
					m := metrics.New(metrics.IPv4)
					var bytes int
					example.BenchSync(b, scale, kind, example.SyncBenchmark[*Dataplane]{
						New: func() *Dataplane {
							// iptables-nft-restore needs more than the default
							// timeout for 10,000 Services: it is quadratic.
							d, err := New(b.Context(), Config{Backend: backend, Netfilter: xtables.Netfilter{Netns: sandbox.TestNetns(b, "ipt-bench").Path(), ClusterCIDR: example.ClusterCIDR, Metrics: &m.FamilyMetrics, Timeout: 30 * time.Minute}})
							if err != nil {
								b.Fatal(err)
							}
							return d
						},
						TimeNew: true,
						// Rendering again to count costs no kernel time.
						After: func(d *Dataplane, up model.Update) {
							switch kind {
							case "first":
								p := newPlanner(&d.cfg)
								p.r.comments = d.plan.r.comments
								pl, _ := p.full(up.State, freshHooks)
								bytes = len(pl.tx.Bytes())
							case "partial":
								bytes = len(d.plan.partial(up).tx.Bytes())
							}
						},
					})
					b.ReportMetric(gaugeValue(b, m.IPTablesRulesTotal.WithLabelValues("nat")), "nat-rules")
					b.ReportMetric(gaugeValue(b, m.IPTablesRulesLast.WithLabelValues("nat")), "nat-rules-written")
					b.ReportMetric(float64(bytes), "restore-bytes")
				})
			}
		}
	}
}
