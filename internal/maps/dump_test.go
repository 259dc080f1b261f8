package maps

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// ReadFrontends gives the frontends the Writer programmed, with their
// backends in slot order and the flags, ids and verdicts Dump prints.
func TestReadFrontends(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	term := web
	term.eps, term.terminate = term.eps[:1], []string{"10.244.9.9:8080"}
	empty := dns
	empty.name, empty.clusterIP, empty.eps = "empty", "10.96.0.30", nil
	if err := w.Sync(full(buildState(term, empty))); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFrontends(f.m)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d frontends, want 2: %+v", len(got), got)
	}
	webFE, emptyFE := got[0], got[1]
	if webFE.Frontend.Addr != netip.MustParseAddr("10.96.0.20") || webFE.Frontend.Port != 80 || webFE.Frontend.Proto != model.TCP {
		t.Errorf("first frontend %v, want 10.96.0.20:80/TCP", webFE.Frontend)
	}
	if FlagNames(webFE.Flags) != "cluster-ip" || webFE.Count != 1 || webFE.SvcID == 0 || webFE.RevNatID == 0 {
		t.Errorf("web: flags %s count %d svc %d revnat %d", FlagNames(webFE.Flags), webFE.Count, webFE.SvcID, webFE.RevNatID)
	}
	if len(webFE.Backends) != 1 || webFE.Backends[0].Addr != netip.MustParseAddr("10.244.1.3") || webFE.Backends[0].Port != 8080 ||
		webFE.Backends[0].Terminating() || webFE.Backends[0].ID == 0 {
		t.Errorf("web backends %+v, want the ready endpoint only (the terminating one is held back while one is ready)", webFE.Backends)
	}
	if emptyFE.Frontend.Addr != netip.MustParseAddr("10.96.0.30") || FlagNames(emptyFE.Flags) != "cluster-ip,reject" || len(emptyFE.Backends) != 0 {
		t.Errorf("empty: %v flags %s backends %+v, want a rejecting ClusterIP without backends", emptyFE.Frontend, FlagNames(emptyFE.Flags), emptyFE.Backends)
	}
}

// A slot naming a backend the backends map lacks reads as missing, not
// as the zero address.
func TestReadFrontendsMissingBackend(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(dns))); err != nil {
		t.Fatal(err)
	}
	id, _ := w.BackendID(Backend{Addr: netip.MustParseAddr("10.244.1.2"), Port: 5353, Proto: model.UDP})
	delete(f.backends.Entries, id)
	got, err := ReadFrontends(f.m)
	if err != nil {
		t.Fatal(err)
	}
	var missing int
	for _, b := range got[0].Backends {
		if b.Missing {
			missing++
			if b.ID != id {
				t.Errorf("missing backend id %d, want %d", b.ID, id)
			}
		}
	}
	if missing != 1 || len(got[0].Backends) != 2 {
		t.Errorf("backends %+v, want 2 with 1 missing", got[0].Backends)
	}
}
