package maps_test

import (
	"fmt"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// BenchmarkSync is the BPF baseline of the fallback dataplanes' benchmarks
// of the same name (internal/fallback/iptables, internal/fallback/ipvs):
// the same states (example.Scale: 1,000 and 10,000 Services of 10
// endpoints) and the same three syncs, written into real kernel maps:
//
//	first    a fresh writer and maps and the first sync: every entry written
//	full     a periodic full sync with nothing changed
//	partial  one endpoint of one Service changed
//
// `make bench` runs the three in one go test run. It reports the
// frontends and backends the maps hold, the BPF counterpart of the rule
// count.
func BenchmarkSync(b *testing.B) {
	for _, n := range example.BenchScales {
		for _, kind := range example.SyncKinds {
			b.Run(fmt.Sprintf("services=%d/%s", n, kind), func(b *testing.B) {
				w := example.BenchSync(b, example.NewScale(n, 10), kind, example.SyncBenchmark[*maps.Writer]{
					New: func() *maps.Writer {
						w, err := maps.NewWriter(kernelMaps(b), maps.Limits{Backends: 262144, RevNat: 65536})
						if err != nil {
							b.Fatal(err)
						}
						return w
					},
				})
				fe, be := w.Counts()
				b.ReportMetric(float64(fe), "frontends")
				b.ReportMetric(float64(be), "backends")
			})
		}
	}
}
