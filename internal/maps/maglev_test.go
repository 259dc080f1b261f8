package maps

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// maglevWeb is web with a NodePort and the Maglev algorithm, on an IPv4
// node.
func maglevWeb(st *model.State) *model.State {
	return maglevWebOn(st, netip.MustParseAddr("192.168.77.10"))
}

// maglevWebOn is maglevWeb on a node with the address node.
func maglevWebOn(st *model.State, node netip.Addr) *model.State {
	st.Node.Addrs = []netip.Addr{node}
	st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
	for _, svc := range st.Services {
		if svc.Port.Name.Name == "web" {
			svc.Port.NodePort = 30080
			svc.Port.LBAlgorithm = model.LBMaglev
		}
	}
	return st
}

// randomWeb is maglevWeb with web choosing at random again.
func randomWeb(st *model.State) *model.State {
	st = maglevWeb(st)
	for _, svc := range st.Services {
		if svc.Port.Name.Name == "web" {
			svc.Port.LBAlgorithm = model.LBRandom
		}
	}
	return st
}

var webName = model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: "web"}, Protocol: model.TCP}

func webWith(eps ...string) svcSpec {
	s := web
	s.eps = eps
	return s
}

// maglevFamily is what TestMaglevTablesFollowTheExternalEndpoints needs of
// an address family: its Services and node, and fake maps of its layouts
// with a Writer over them.
type maglevFamily struct {
	name     string
	node     netip.Addr
	dns, web svcSpec
	// three are endpoints of web.
	three []string
	// maps makes the fake maps, and fails t should a Maglev table ever
	// name a backend that is missing between two writes.
	maps func(t *testing.T) *maglevFakes
}

// maglevFakes are one family's fake maps as the Maglev test sees them.
type maglevFakes struct {
	maglev *FakeMaglev
	// writer makes a Writer over the maps, restoring from them as a
	// restarted agent does.
	writer func() *Writer
	// backend names a backend id's address, or says it is missing.
	backend func(id uint32) (netip.AddrPort, bool)
}

// tablesConsistent says whether every table names present backends only.
func (f *maglevFakes) tablesConsistent() error {
	for id, table := range f.maglev.Tables {
		for i, b := range table {
			if _, ok := f.backend(b); !ok {
				return fmt.Errorf("maglev table of service %d: entry %d names backend %d, which is missing", id, i, b)
			}
		}
	}
	return nil
}

var maglevFamilies = []maglevFamily{
	{
		name: "IPv4", node: netip.MustParseAddr("192.168.77.10"), dns: dns, web: web,
		three: []string{"10.244.1.3:8080", "10.244.2.3:8080", "10.244.3.3:8080"},
		maps: func(t *testing.T) *maglevFakes {
			f := newFakes(0, 0, 0)
			f.watchConsistency(t)
			return &maglevFakes{
				maglev: f.maglev,
				writer: func() *Writer { return newWriter(t, f.m) },
				backend: func(id uint32) (netip.AddrPort, bool) {
					v, ok := f.backends.Entries[id]
					return netip.AddrPortFrom(addrFromBE32(v.Address), portFromBE16(v.Port)), ok
				},
			}
		},
	},
	{
		name: "IPv6", node: netip.MustParseAddr("fd00:77::10"), dns: dns6, web: web6,
		three: []string{"[fd00:10:244:1::3]:8080", "[fd00:10:244:2::3]:8080", "[fd00:10:244:3::3]:8080"},
		maps: func(t *testing.T) *maglevFakes {
			f := newFakes6()
			mf := &maglevFakes{
				maglev: f.maglev,
				writer: func() *Writer {
					w, err := NewWriter6(f.maps(), Limits{Backends: 1000, RevNat: 1000})
					if err != nil {
						t.Fatal(err)
					}
					return w
				},
				backend: func(id uint32) (netip.AddrPort, bool) {
					v, ok := f.backends.Entries[id]
					return netip.AddrPortFrom(addrFromBE128(v.Address), portFromBE16(v.Port)), ok
				},
			}
			check := func() {
				if err := mf.tablesConsistent(); err != nil {
					t.Helper()
					t.Fatalf("inconsistent between two writes: %v", err)
				}
			}
			f.backends.OnChange, f.maglev.OnChange = check, check
			return mf
		},
	},
}

// TestMaglevTablesFollowTheExternalEndpoints: each family's Writer keeps a
// Maglev table per ServicePort that uses Maglev externally, keyed by the
// family's ServicePort id and naming the family's backends in equal
// shares; it writes a table only when its backends change, also after a
// restart (the fingerprints restored from the maps), and removes it with
// the ServicePort, the setting or the last endpoint.
func TestMaglevTablesFollowTheExternalEndpoints(t *testing.T) {
	for _, fam := range maglevFamilies {
		t.Run(fam.name, func(t *testing.T) { testMaglevTables(t, fam) })
	}
}

func testMaglevTables(t *testing.T, fam maglevFamily) {
	f := fam.maps(t)
	w := f.writer()
	webWith := func(eps ...string) svcSpec {
		s := fam.web
		s.eps, s.terminate, s.affinity = eps, nil, 0
		return s
	}
	maglevWeb := func(st *model.State) *model.State { return maglevWebOn(st, fam.node) }
	three := fam.three
	dns := fam.dns
	if err := w.Sync(full(maglevWeb(buildState(dns, webWith(three...))))); err != nil {
		t.Fatal(err)
	}
	if len(f.maglev.Tables) != 1 {
		t.Fatalf("%d tables, want one (web; dns uses random and has no NodePort)", len(f.maglev.Tables))
	}
	svcID := w.svcs.byOwner[webName]
	tableBackends := func(t *testing.T, table []uint32) map[netip.AddrPort]int {
		t.Helper()
		out := map[netip.AddrPort]int{}
		for _, id := range table {
			b, ok := f.backend(id)
			if !ok {
				t.Fatalf("table names backend %d, which is missing", id)
			}
			out[b]++
		}
		return out
	}
	share := tableBackends(t, f.maglev.Tables[svcID])
	if len(share) != 3 {
		t.Fatalf("table names %v, want the three endpoints", share)
	}
	for b, n := range share {
		if b.Addr().Is4() != fam.node.Is4() || !slices.Contains(three, b.String()) {
			t.Errorf("table names %s, not an endpoint of web", b)
		}
		if n < FakeMaglevSize/3 || n > FakeMaglevSize/3+1 {
			t.Errorf("%s holds %d of %d entries, want a third", b, n, FakeMaglevSize)
		}
	}
	old := f.maglev.Tables[svcID]

	t.Run("a sync that changes nothing writes no table", func(t *testing.T) {
		sets := f.maglev.Sets
		if err := w.Sync(full(maglevWeb(buildState(dns, webWith(three...))))); err != nil {
			t.Fatal(err)
		}
		if f.maglev.Sets != sets {
			t.Errorf("%d tables written", f.maglev.Sets-sets)
		}
	})
	t.Run("an agent restart writes no table", func(t *testing.T) {
		w2 := f.writer()
		sets := f.maglev.Sets
		if err := w2.Sync(full(maglevWeb(buildState(dns, webWith(three...))))); err != nil {
			t.Fatal(err)
		}
		if f.maglev.Sets != sets {
			t.Errorf("%d tables written after a restart", f.maglev.Sets-sets)
		}
	})
	t.Run("a restart with another endpoint set rewrites the table", func(t *testing.T) {
		w2 := f.writer()
		sets := f.maglev.Sets
		if err := w2.Sync(full(maglevWeb(buildState(dns, webWith(three[1:]...))))); err != nil {
			t.Fatal(err)
		}
		if f.maglev.Sets != sets+1 {
			t.Errorf("%d tables written after a restart with two endpoints, want 1", f.maglev.Sets-sets)
		}
		if got := tableBackends(t, f.maglev.Tables[w2.svcs.byOwner[webName]]); len(got) != 2 {
			t.Errorf("table names %v, want two endpoints", got)
		}
		// Back to the three, for the cases below.
		if err := w2.Sync(full(maglevWeb(buildState(dns, webWith(three...))))); err != nil {
			t.Fatal(err)
		}
		w = w2
		svcID = w.svcs.byOwner[webName]
		old = f.maglev.Tables[svcID]
	})
	t.Run("a removed endpoint leaves the table before its backend goes, and moves only its own entries", func(t *testing.T) {
		st := maglevWeb(buildState(dns, webWith(three[:2]...)))
		if err := w.Sync(partial(st, webName)); err != nil {
			t.Fatal(err)
		}
		now := f.maglev.Tables[svcID]
		if got := tableBackends(t, now); len(got) != 2 {
			t.Fatalf("table names %v, want two endpoints", got)
		}
		moved := 0
		for i := range old {
			if _, ok := f.backend(old[i]); ok && old[i] != now[i] {
				moved++
			}
		}
		if moved > FakeMaglevSize/50 {
			t.Errorf("%d entries of the remaining endpoints moved, want few", moved)
		}
	})
	t.Run("turning Maglev off removes the table", func(t *testing.T) {
		if err := w.Sync(partial(buildState(dns, webWith(three[:2]...)), webName)); err != nil {
			t.Fatal(err)
		}
		if len(f.maglev.Tables) != 0 {
			t.Errorf("tables %v left", f.maglev.Tables)
		}
	})
	t.Run("a deleted Service's table goes", func(t *testing.T) {
		if err := w.Sync(partial(maglevWeb(buildState(dns, webWith(three...))), webName)); err != nil {
			t.Fatal(err)
		}
		if len(f.maglev.Tables) != 1 {
			t.Fatalf("no table")
		}
		if err := w.Sync(partial(buildState(dns), webName)); err != nil {
			t.Fatal(err)
		}
		if len(f.maglev.Tables) != 0 {
			t.Errorf("tables %v left", f.maglev.Tables)
		}
	})
	t.Run("no endpoints, no table", func(t *testing.T) {
		if err := w.Sync(full(maglevWeb(buildState(dns, webWith())))); err != nil {
			t.Fatal(err)
		}
		if len(f.maglev.Tables) != 0 {
			t.Errorf("tables %v for a Service without endpoints", f.maglev.Tables)
		}
	})
}
