package iptables

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/fallbacktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
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
		for _, n := range []int{1000, 10000} {
			for _, kind := range []string{"first", "full", "partial"} {
				b.Run(fmt.Sprintf("%s/services=%d/%s", backend, n, kind), func(b *testing.B) {
					requireBackend(b, backend)
					if backend == xtables.BackendNFT && n > 1000 && os.Getenv("EBPF_PROXY_BENCH_SLOW") != "1" {
						b.Skip("iptables-nft-restore takes tens of minutes for 10,000 Services; set EBPF_PROXY_BENCH_SLOW=1")
					}
					scale := fallbacktest.NewScale(n, 10)
					m := metrics.New(metrics.IPv4)
					newDataplane := func() *Dataplane {
						// iptables-nft-restore needs more than the default
						// timeout for 10,000 Services: it is quadratic.
						d, err := New(ctxFor(b), Config{Netns: newNetns(b, "ipt-bench"), Backend: backend,
							ClusterCIDR: fallbacktest.ClusterCIDR, Metrics: &m.FamilyMetrics, Timeout: 30 * time.Minute})
						if err != nil {
							b.Fatal(err)
						}
						return d
					}
					var d *Dataplane
					if kind != "first" {
						d = newDataplane()
						if err := d.Sync(scale.Full()); err != nil {
							b.Fatal(err)
						}
					}
					var bytes int
					b.ResetTimer()
					for range b.N {
						up := scale.Full()
						switch kind {
						case "first":
							d = newDataplane()
						case "partial":
							up = scale.ChangeOneEndpoint()
						}
						if err := d.Sync(up); err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						// Rendering again to count costs no kernel time.
						switch kind {
						case "first":
							p := newPlanner(&d.cfg)
							p.r.comments = d.plan.r.comments
							pl, _ := p.full(up.State, freshHooks)
							bytes = len(pl.tx.Bytes())
						case "partial":
							bytes = len(d.plan.partial(up).tx.Bytes())
						}
						b.StartTimer()
					}
					b.StopTimer()
					b.ReportMetric(gaugeValue(b, m.IPTablesRulesTotal.WithLabelValues("nat")), "nat-rules")
					b.ReportMetric(gaugeValue(b, m.IPTablesRulesLast.WithLabelValues("nat")), "nat-rules-written")
					b.ReportMetric(float64(bytes), "restore-bytes")
				})
			}
		}
	}
}
