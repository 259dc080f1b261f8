package maps

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// TestUnbatchedRetryLeavesOnlyWhatDoesNotFit follows a sync that runs a
// full map and its retry, which writes entry by entry: a frontend whose new
// backend does not fit stays as it was, and so does every other frontend
// that would name that backend, and everything they still name; a Service
// that fits is written. Consistency is checked after every single write.
func TestUnbatchedRetryLeavesOnlyWhatDoesNotFit(t *testing.T) {
	webName := spn("default", "web", model.TCP)
	// web has a ClusterIP and a NodePort, two frontends over the same
	// backends.
	state := func(webEps, dnsEps []string) *model.State {
		s, d := web, dns
		s.eps, d.eps = webEps, dnsEps
		st := buildState(s, d)
		st.Node.Addrs = []netip.Addr{netip.MustParseAddr("192.168.77.11")}
		st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
		st.Services[webName].Port.NodePort = 30080
		return st
	}
	// Room for web's three backends and dns's two, no more.
	f := newFakes(0, 5, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	if err := w.Sync(full(state(web.eps, dns.eps))); err != nil {
		t.Fatal(err)
	}
	before := dump(t, f.m)

	// Two of web's endpoints replaced by one new one, which does not fit.
	newWeb := []string{"10.244.1.3:8080", "10.244.5.3:8080"}
	if err := w.Sync(partial(state(newWeb, dns.eps), webName)); !errors.Is(err, ErrMapFull) {
		t.Fatalf("got %v, want ErrMapFull", err)
	}
	if got := dump(t, f.m); got != before {
		t.Errorf("a batched sync that ran the map full changed the maps:\n%s\nwant:\n%s", got, before)
	}

	// The retry, unbatched, with a change to dns as well.
	err := w.Sync(full(state(newWeb, dns.eps[:1])))
	if !errors.Is(err, ErrMapFull) {
		t.Fatalf("retry: got %v, want ErrMapFull", err)
	}
	got := dump(t, f.m)
	for _, want := range []string{
		// web's frontends as they were, with the backends they name.
		"service 10.96.0.20:80/TCP count=3 ",
		"service 192.168.77.11:30080/TCP count=3 ",
		"backend 2 10.244.2.3:8080/TCP",
		"backend 3 10.244.3.3:8080/TCP",
		// dns written, its dropped endpoint gone.
		"service 10.96.0.10:53/UDP count=1 ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "10.244.2.2:5353") {
		t.Errorf("dns's dropped endpoint is still a backend:\n%s", got)
	}

	// With room again the next retry converges.
	f.backends.Max = 0
	if err := w.Sync(full(state(newWeb, dns.eps[:1]))); err != nil {
		t.Fatal(err)
	}
	got = dump(t, f.m)
	for _, want := range []string{
		"service 10.96.0.20:80/TCP count=2 ",
		"service 192.168.77.11:30080/TCP count=2 ",
		"10.244.5.3:8080/TCP",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "10.244.2.3") || strings.Contains(got, "10.244.3.3") {
		t.Errorf("web's replaced endpoints are left:\n%s", got)
	}
}
