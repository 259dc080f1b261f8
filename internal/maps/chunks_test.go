package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// chunkedState builds Services svc-<i> for i in ids: ClusterIP 10.96.1.i,
// endpoints 10.244.i.1-3:<port> plus, with shared, 10.244.250.1:8080,
// which every such Service shares; every fourth one also a NodePort with
// Maglev and every third one ClientIP affinity. ipOf may give a Service
// another Service's ClusterIP (a frontend that moves).
func chunkedState(ids []int, port uint16, shared func(int) bool, ipOf func(int) int) *model.State {
	var specs []svcSpec
	for _, i := range ids {
		s := svcSpec{ns: "default", name: fmt.Sprintf("svc-%02d", i), clusterIP: fmt.Sprintf("10.96.1.%d", ipOf(i)),
			port: 80, proto: model.TCP}
		for j := 1; j <= 3; j++ {
			s.eps = append(s.eps, fmt.Sprintf("10.244.%d.%d:%d", i, j, port))
		}
		if shared(i) {
			s.eps = append(s.eps, "10.244.250.1:8080")
		}
		if i%3 == 0 {
			s.affinity = 3 * time.Hour
		}
		specs = append(specs, s)
	}
	st := buildState(specs...)
	st.Node.Addrs = []netip.Addr{netip.MustParseAddr("192.168.0.1")}
	st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
	for _, svc := range st.Services {
		var i int
		fmt.Sscanf(svc.Port.Name.Name, "svc-%d", &i)
		if i%4 == 0 {
			svc.Port.NodePort = uint16(30000 + i)
			svc.Port.LBAlgorithm = model.LBMaglev
		}
	}
	return st
}

func span(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// TestWriterWritesALargeSyncInChunks: a sync larger than a chunk is written
// a chunk at a time (the service entries of one chunk before the backends
// of the next), every write keeps what a lookup relies on (make-before-break
// across chunks: a backend shared with a later chunk, a frontend taken over
// by another Service, a Maglev table), and each sync leaves the maps, the
// removed backends and the statistics exactly as one plan of the whole sync
// does: first sync, a full resync that deletes, replaces, moves and adds,
// a partial sync of many Services, and a full sync that removes nearly all.
func TestWriterWritesALargeSyncInChunks(t *testing.T) {
	all := func(int) bool { return true }
	odd := func(i int) bool { return i%2 == 1 }
	self := func(i int) int { return i }
	// svc-12's ClusterIP moves to svc-35, while svc-12 takes 10.96.1.112.
	moved := func(i int) int {
		switch i {
		case 35:
			return 12
		case 12:
			return 112
		}
		return i
	}
	syncs := []struct {
		name   string
		chunks bool
		up     model.Update
	}{
		{"first sync", true, full(chunkedState(span(0, 40), 8080, all, self))},
		{"full resync", true, full(chunkedState(span(10, 50), 8080, odd, moved))},
		{"partial sync of twenty", true, func() model.Update {
			st := chunkedState(span(10, 50), 8080, odd, moved)
			changed := chunkedState(span(20, 40), 9090, all, self)
			var names []model.ServicePortName
			for n, svc := range changed.Services {
				if n.Name != "svc-35" {
					st.Services[n] = svc
					names = append(names, n)
				}
			}
			return partial(st, names...)
		}()},
		// Deletions only, and two Services: one chunk.
		{"full sync to two", false, full(chunkedState([]int{44, 48}, 8080, all, self))},
	}

	chunked, whole := newFakes(0, 0, 0), newFakes(0, 0, 0)
	chunked.watchConsistency(t)
	whole.watchConsistency(t)
	var order []string
	// keep are the master entries both before and after a sync: none of
	// them may be missing at any moment of it.
	var keep []ServiceKey
	note := func(name string) func() {
		return func() {
			if err := chunked.consistent(); err != nil {
				t.Fatalf("inconsistent between two writes: %v", err)
			}
			for _, k := range keep {
				if _, ok := chunked.services.Entries[k]; !ok {
					t.Fatalf("master %+v, there before and after the sync, is missing during it", k)
				}
			}
			if n := len(order); n == 0 || order[n-1] != name {
				order = append(order, name)
			}
		}
	}
	chunked.services.OnChange, chunked.backends.OnChange = note("services"), note("backends")
	cw, ww := newWriter(t, chunked.m), newWriter(t, whole.m)
	cw.chunkEntries, ww.chunkEntries = 24, 1<<30
	for _, s := range syncs {
		order = order[:0]
		if err := ww.Sync(s.up); err != nil {
			t.Fatalf("%s, one plan: %v", s.name, err)
		}
		keep = keep[:0]
		for k := range chunked.services.Entries {
			if _, after := whole.services.Entries[k]; after && k.Slot == 0 {
				keep = append(keep, k)
			}
		}
		if err := cw.Sync(s.up); err != nil {
			t.Fatalf("%s, chunked: %v", s.name, err)
		}
		if got, want := withoutIDs(dump(t, chunked.m)), withoutIDs(dump(t, whole.m)); got != want {
			t.Errorf("%s: chunked, the maps hold\n%s\nwant, as one plan writes them:\n%s", s.name, got, want)
		}
		if got, want := sortedBackends(cw.Removed()), sortedBackends(ww.Removed()); !slices.Equal(got, want) {
			t.Errorf("%s: chunked removes %v, one plan %v", s.name, got, want)
		}
		// The port filter's words are written once a chunk, not once a
		// sync: a few writes more.
		if got, want := cw.LastStats(), ww.LastStats(); got.Frontends != want.Frontends ||
			got.Writes < want.Writes || got.Writes > want.Writes+16 {
			t.Errorf("%s: chunked stats %+v, one plan %+v", s.name, got, want)
		}
		// Backends written after service entries: a chunk after another.
		if n := strings.Count(strings.Join(order, " "), "services backends"); s.chunks && n < 2 {
			t.Errorf("%s: written in %d chunks (maps in write order: %v), want several", s.name, n+1, order)
		}
	}
	if got := len(chunked.services.Entries); got == 0 {
		t.Fatal("the last sync left no service")
	}
}

// TestAFirstSyncHoldsAChunkAtATime: the first sync of 1,000 Services of ten
// endpoints (about 32,000 entries) never holds a plan much larger than a
// chunk (two of them: one is written while the next is planned), lets the
// plans' memory go once done, and programs every Service.
func TestAFirstSyncHoldsAChunkAtATime(t *testing.T) {
	var specs []svcSpec
	for i := range 1000 {
		s := svcSpec{ns: "default", name: fmt.Sprintf("svc-%d", i),
			clusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), port: 80, proto: model.TCP}
		for j := range 10 {
			s.eps = append(s.eps, fmt.Sprintf("10.%d.%d.%d:8080", 100+i/250, i%250, j+1))
		}
		specs = append(specs, s)
	}
	f := newFakes(0, 0, 0)
	w, err := NewWriter(f.m, Limits{Backends: 20000, RevNat: 2000})
	if err != nil {
		t.Fatal(err)
	}
	largest, chunks := 0, 0
	w.onChunk = func(n int) { largest, chunks = max(largest, n), chunks+1 }
	if err := w.Sync(full(buildState(specs...))); err != nil {
		t.Fatal(err)
	}
	// A chunk ends with the Service that takes it past syncChunkEntries:
	// 32 entries here. One is written while the next is planned: two
	// chunks at once.
	if largest > syncChunkEntries+32 || chunks < 2 {
		t.Errorf("%d chunks, the largest of %d entries, want several of at most %d", chunks, largest, syncChunkEntries+32)
	}
	for _, p := range []*plan{&w.plan, &w.written} {
		if c := cap(p.servicePuts.keys) + cap(p.changes); c != 0 {
			t.Errorf("after the sync a plan keeps room for %d entries, want its memory let go", c)
		}
	}
	if got := strings.Count(dump(t, f.m), " count=10 "); got != 1000 {
		t.Errorf("%d Services programmed with their ten endpoints, want 1000", got)
	}
}

func sortedBackends(bs []Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.String()
	}
	slices.Sort(out)
	return out
}

var dumpIDs = regexp.MustCompile(`(backend|revnat|svc)[= ][0-9]+`)

// withoutIDs is a dump with its ids left out, its lines sorted: which ids
// a sync hands out depends on the order the last one released them in (a
// map's), chunked or not. consistent checks what the ids link.
func withoutIDs(d string) string {
	lines := strings.Split(dumpIDs.ReplaceAllString(d, "$1"), "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestAChunkThatFailsStopsTheSync: when the kernel refuses a write of one
// chunk, nothing is written after it, not the chunk planned meanwhile
// either; the error is returned, and the next sync (which re-reads the
// maps) leaves them as a sync that never failed does.
func TestAChunkThatFailsStopsTheSync(t *testing.T) {
	up := full(chunkedState(span(0, 40), 8080, func(int) bool { return true }, func(i int) int { return i }))
	f, whole := newFakes(0, 0, 0), newFakes(0, 0, 0)
	w, ww := newWriter(t, f.m), newWriter(t, whole.m)
	w.chunkEntries = 24
	chunks := 0
	w.onChunk = func(int) { chunks++ }
	puts, atFailure := 0, -1
	f.services.Fail = func(op string, _ ServiceKey) error {
		if op != "put" {
			return nil
		}
		if puts++; puts == 60 {
			atFailure = f.writes()
			return errors.New("refused")
		}
		return nil
	}
	err := w.Sync(up)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("sync: %v, want the refused write", err)
	}
	if atFailure < 0 || chunks < 3 {
		t.Fatalf("the write failed at %d, after %d chunks: the test wants it in a later chunk", atFailure, chunks)
	}
	if got := f.writes(); got != atFailure {
		t.Errorf("%d writes after the refused one, want none", got-atFailure)
	}

	f.services.Fail = nil
	if err := w.Sync(up); err != nil {
		t.Fatal(err)
	}
	if err := ww.Sync(up); err != nil {
		t.Fatal(err)
	}
	if got, want := withoutIDs(dump(t, f.m)), withoutIDs(dump(t, whole.m)); got != want {
		t.Errorf("after the failed sync and another, the maps hold\n%s\nwant, as a sync that never failed:\n%s", got, want)
	}
}
