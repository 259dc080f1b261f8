package maps

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// maglevWeb is web with a NodePort and the Maglev algorithm.
func maglevWeb(st *model.State) *model.State {
	st.Node.Addrs = []netip.Addr{netip.MustParseAddr("192.168.77.10")}
	st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
	for _, svc := range st.Services {
		if svc.Port.Name.Name == "web" {
			svc.Port.NodePort = 30080
			svc.Port.LBAlgorithm = model.LBMaglev
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

// tableBackends returns the backends a table names, with their share.
func tableBackends(t *testing.T, f *fakes, table []uint32) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, id := range table {
		v, ok := f.backends.Entries[id]
		if !ok {
			t.Fatalf("table names backend %d, which is missing", id)
		}
		out[netip.AddrPortFrom(addrFromBE32(v.Address), portFromBE16(v.Port)).String()]++
	}
	return out
}

func TestMaglevTablesFollowTheExternalEndpoints(t *testing.T) {
	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	three := []string{"10.244.1.3:8080", "10.244.2.3:8080", "10.244.3.3:8080"}
	if err := w.Sync(full(maglevWeb(buildState(dns, webWith(three...))))); err != nil {
		t.Fatal(err)
	}
	if len(f.maglev.Tables) != 1 {
		t.Fatalf("%d tables, want one (web; dns uses random and has no NodePort)", len(f.maglev.Tables))
	}
	svcID := w.ownerSvc[webName]
	share := tableBackends(t, f, f.maglev.Tables[svcID])
	if len(share) != 3 {
		t.Fatalf("table names %v, want the three endpoints", share)
	}
	for b, n := range share {
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
		w2 := newWriter(t, f.m)
		sets := f.maglev.Sets
		if err := w2.Sync(full(maglevWeb(buildState(dns, webWith(three...))))); err != nil {
			t.Fatal(err)
		}
		if f.maglev.Sets != sets {
			t.Errorf("%d tables written after a restart", f.maglev.Sets-sets)
		}
	})
	t.Run("a removed endpoint leaves the table before its backend goes, and moves only its own entries", func(t *testing.T) {
		st := maglevWeb(buildState(dns, webWith(three[:2]...)))
		if err := w.Sync(partial(st, webName)); err != nil {
			t.Fatal(err)
		}
		now := f.maglev.Tables[svcID]
		if got := tableBackends(t, f, now); len(got) != 2 {
			t.Fatalf("table names %v, want two endpoints", got)
		}
		moved := 0
		for i := range old {
			if f.backends.Entries[old[i]].Address != 0 && old[i] != now[i] {
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
