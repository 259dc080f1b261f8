package maps

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// inMap says whether port's bit is set in the port filter map itself.
func inMap(f *Fakes, port uint16) bool {
	return f.Ports.Entries[uint32(port/32)]&(1<<(port%32)) != 0
}

// externalWeb is the state of web with a NodePort and an ExternalIP, beside
// dns (ClusterIP only).
func externalWeb() (*model.State, model.ServicePortName) {
	st := buildState(dns, web)
	st.Node.Addrs = []netip.Addr{netip.MustParseAddr("192.168.77.11")}
	st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
	svc := st.Services[spn("default", "web", model.TCP)]
	sp := *svc.Port
	sp.NodePort = 30080
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.19.0.7")}
	st.Services[sp.Name] = &model.Service{Port: &sp, Endpoints: svc.Endpoints,
		Selection: model.Categorize(&sp, svc.Endpoints, &st.Node, model.DefaultOptions)}
	return st, sp.Name
}

func TestPortFilterHoldsTheExternalFrontendsPorts(t *testing.T) {
	f := NewFakes(0, 0, 0)
	w := newWriter(t, f.Maps())
	st, name := externalWeb()
	if err := w.Sync(full(st)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		port uint16
		want bool
		what string
	}{
		{30080, true, "the NodePort"},
		{80, true, "the ExternalIP's port"},
		{53, false, "a ClusterIP's port (the socket programs serve it)"},
		{8080, false, "a backend's port"},
		{30081, false, "the port beside the NodePort, in the same word"},
	} {
		if w.HasPort(c.port) != c.want || inMap(f, c.port) != c.want {
			t.Errorf("%s, %d: in the Writer's copy %v, in the map %v, want %v", c.what, c.port, w.HasPort(c.port), inMap(f, c.port), c.want)
		}
	}

	// The Service goes: its ports stay, for the flows that outlive it.
	delete(st.Services, name)
	if err := w.Sync(partial(st, name)); err != nil {
		t.Fatal(err)
	}
	for _, port := range []uint16{30080, 80} {
		if !inMap(f, port) {
			t.Errorf("port %d left the filter with its Service", port)
		}
	}

	// A restarted agent reads the filter back.
	w2 := newWriter(t, f.Maps())
	if !w2.HasPort(30080) || w2.HasPort(53) {
		t.Errorf("restored filter: 30080 %v (want true), 53 %v (want false)", w2.HasPort(30080), w2.HasPort(53))
	}
}

func TestPortFilterFilledFromTheFrontendsOfAnAgentWithoutIt(t *testing.T) {
	f := NewFakes(0, 0, 0)
	old := f.Maps()
	old.PortFilter = nil // an agent older than the filter
	w := newWriter(t, old)
	st, _ := externalWeb()
	if err := w.Sync(full(st)); err != nil {
		t.Fatal(err)
	}
	if len(f.Ports.Entries) != 0 {
		t.Fatalf("a Writer without the filter wrote it: %v", f.Ports.Entries)
	}
	// The upgrade: the new agent's Writer restores the frontends and
	// fills the new map before anything could read it.
	w2 := newWriter(t, f.Maps())
	for _, port := range []uint16{30080, 80} {
		if !w2.HasPort(port) || !inMap(f, port) {
			t.Errorf("port %d of a restored external frontend not in the filter", port)
		}
	}
	if inMap(f, 53) {
		t.Error("a restored ClusterIP's port is in the filter")
	}
	if err := w2.AddPorts([]uint16{31000, 31001, 443}); err != nil {
		t.Fatal(err)
	}
	for _, port := range []uint16{31000, 31001, 443, 30080} {
		if !inMap(f, port) {
			t.Errorf("port %d not in the filter after AddPorts", port)
		}
	}
}

func monotonicSeconds(t *testing.T) uint32 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		t.Fatal(err)
	}
	return uint32(ts.Sec)
}

// The Writer stamps the second in which it deletes a backend, so that the
// TC and XDP programs check every tracked flow in full in it, and only then.
func TestWriterStampsBackendRemovals(t *testing.T) {
	f := NewFakes(0, 0, 0)
	w := newWriter(t, f.Maps())
	st := buildState(web)
	if err := w.Sync(full(st)); err != nil {
		t.Fatal(err)
	}
	if len(f.RemovedAt.Entries) != 0 {
		t.Fatalf("stamped %v after a sync that removed nothing", f.RemovedAt.Entries)
	}
	less := web
	less.eps = less.eps[1:]
	before := monotonicSeconds(t)
	if err := w.Sync(full(buildState(less))); err != nil {
		t.Fatal(err)
	}
	after := monotonicSeconds(t)
	got, ok := f.RemovedAt.Entries[RemovedAtIPv4]
	if !ok || got < before || got > after {
		t.Errorf("stamp after an endpoint's removal: %d (set %v), want the second of the sync, %d to %d", got, ok, before, after)
	}
	if _, ok := f.RemovedAt.Entries[RemovedAtIPv6]; ok {
		t.Error("the IPv4 Writer stamped the IPv6 entry")
	}
}
