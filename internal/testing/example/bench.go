package example

import (
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// SyncKinds are the syncs of every dataplane's BenchmarkSync (the BPF maps,
// iptables, IPVS), on the same Scale states:
//
//	first    a fresh dataplane and its first sync: every entry written
//	full     a periodic full sync with nothing changed
//	partial  one endpoint of one Service changed
var SyncKinds = []string{"first", "full", "partial"}

// BenchScales are the numbers of Services (of 10 endpoints) the sync
// benchmarks run at.
var BenchScales = []int{1000, 10000}

// Syncer is a dataplane as the sync benchmarks drive it.
type Syncer interface {
	Sync(model.Update) error
}

// SyncBenchmark says how BenchSync drives a dataplane.
type SyncBenchmark[D Syncer] struct {
	// New returns a fresh dataplane.
	New func() D
	// TimeNew counts New in the time of a "first" sync; otherwise making
	// the dataplane (for the maps, the loader's part) is not measured.
	TimeNew bool
	// After, if set, runs after every measured sync, with the timer
	// stopped.
	After func(d D, up model.Update)
}

// BenchSync runs b.N syncs of kind (see SyncKinds) of the state s into
// dataplanes made by bench.New and returns the dataplane of the last one,
// with the timer stopped, for the caller's metrics.
func BenchSync[D Syncer](b *testing.B, s *Scale, kind string, bench SyncBenchmark[D]) D {
	var d D
	if kind != "first" {
		d = bench.New()
		if err := d.Sync(s.Full()); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		up := s.Full()
		switch kind {
		case "first":
			if !bench.TimeNew {
				b.StopTimer()
			}
			d = bench.New()
			b.StartTimer()
		case "partial":
			up = s.ChangeOneEndpoint()
		}
		if err := d.Sync(up); err != nil {
			b.Fatal(err)
		}
		if bench.After != nil {
			b.StopTimer()
			bench.After(d, up)
			b.StartTimer()
		}
	}
	b.StopTimer()
	return d
}
