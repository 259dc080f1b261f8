package maps_test

import (
	"fmt"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/fallbacktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// BenchmarkSync is the BPF baseline of the fallback dataplanes' benchmarks
// of the same name (internal/fallback/iptables, internal/fallback/ipvs):
// the same states (fallbacktest.Scale: 1,000 and 10,000 Services of 10
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
	for _, n := range []int{1000, 10000} {
		for _, kind := range []string{"first", "full", "partial"} {
			b.Run(fmt.Sprintf("services=%d/%s", n, kind), func(b *testing.B) {
				scale := fallbacktest.NewScale(n, 10)
				newWriter := func() *maps.Writer {
					w, err := maps.NewWriter(kernelMaps(b), maps.Limits{Backends: 262144, RevNat: 65536})
					if err != nil {
						b.Fatal(err)
					}
					return w
				}
				var w *maps.Writer
				if kind != "first" {
					w = newWriter()
					if err := w.Sync(scale.Full()); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				for range b.N {
					up := scale.Full()
					switch kind {
					case "first":
						// Creating the maps is the loader's part, not the sync's.
						b.StopTimer()
						w = newWriter()
						b.StartTimer()
					case "partial":
						up = scale.ChangeOneEndpoint()
					}
					if err := w.Sync(up); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				fe, be := w.Counts()
				b.ReportMetric(float64(fe), "frontends")
				b.ReportMetric(float64(be), "backends")
			})
		}
	}
}
