package maps

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// inMaps counts the entries the fakes hold, what Entries must report.
func (f *fakes) inMaps() Entries {
	return Entries{Services: len(f.services.Entries), Backends: len(f.backends.Entries), RevNat: len(f.revnat.Entries),
		Members: len(f.match.Entries)}
}

// TestWriterEntriesFollowTheMaps checks Entries against the maps after
// adds, removals, a restart (restored from the maps, orphans included) and
// a sync that ran a map full.
func TestWriterEntriesFollowTheMaps(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	if got := w.Entries(); got != (Entries{}) {
		t.Fatalf("empty maps: Entries %+v", got)
	}
	check := func(when string) {
		t.Helper()
		if got, want := w.Entries(), f.inMaps(); got != want {
			t.Errorf("%s: Entries %+v, the maps hold %+v", when, got, want)
		}
	}
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	check("two Services")
	// web: master and 3 slots; dns: master and 2 slots.
	if got := w.Entries(); got.Services != 7 || got.Backends != 5 || got.RevNat != 2 || got.Members != 5 {
		t.Errorf("two Services: Entries %+v, want 7 services, 5 backends, 2 reverse NAT, 5 members", got)
	}
	grown := web
	grown.eps = append(slices.Clone(web.eps), "10.244.4.3:8080", "10.244.5.3:8080")
	if err := w.Sync(partial(buildState(grown, dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	check("web grown by two endpoints")
	if err := w.Sync(partial(buildState(web, dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	check("web shrunk back")
	if err := w.Sync(partial(buildState(dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	check("web removed")

	// A restart finds what an earlier agent left, including a reverse
	// NAT entry no frontend uses: it is counted until a sync deletes it.
	f.revnat.Entries[900] = RevNatValue{}
	w = newWriter(t, f.m)
	check("restored")
	if err := w.Sync(full(buildState(dns))); err != nil {
		t.Fatal(err)
	}
	check("after the orphan's deletion")

	// A map that runs full fails the sync; the next one re-reads the
	// maps, so Entries shows them as full even while syncs keep failing.
	f.backends.Max = 4
	big := web
	big.eps = append(slices.Clone(web.eps), "10.244.4.3:8080", "10.244.5.3:8080")
	if err := w.Sync(full(buildState(big, dns))); !errors.Is(err, ErrMapFull) {
		t.Fatalf("got %v, want ErrMapFull", err)
	}
	if err := w.Sync(full(buildState(big, dns))); !errors.Is(err, ErrMapFull) {
		t.Fatalf("retry: got %v, want ErrMapFull", err)
	}
	if got := w.Entries(); got.Backends != 4 {
		t.Errorf("after a failed retry: Entries %+v, want the 4 backends the full map holds", got)
	}
}

// TestWriterEntriesRaceFreeWithSync reads Entries while syncs run, as a
// metrics scrape does; `go test -race` checks it.
func TestWriterEntriesRaceFreeWithSync(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
				_ = w.Entries()
			}
		}
	}()
	for i := 0; i < 50; i++ {
		st := buildState(dns)
		if i%2 == 0 {
			st = buildState(web, dns)
		}
		if err := w.Sync(full(st)); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	check := f.inMaps()
	if got := w.Entries(); got != check {
		t.Errorf("Entries %+v, the maps hold %+v", got, check)
	}
}
