package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// state builds a model.State from compact descriptions: each service port
// "ns/name:port/PROTO" with a ClusterIP and endpoints "ip:port".
type svcSpec struct {
	ns, name  string
	clusterIP string
	port      uint16
	proto     model.Protocol
	eps       []string
	terminate []string
	itpLocal  bool
	affinity  time.Duration
}

func buildState(specs ...svcSpec) *model.State {
	st := &model.State{Node: model.Node{Name: "node-a"}, Services: map[model.ServicePortName]*model.Service{}}
	for _, s := range specs {
		sp := builders.ModelServicePort(s.ns, s.name, s.proto, netip.MustParseAddr(s.clusterIP), s.port)
		sp.AffinityTimeout = s.affinity
		if s.itpLocal {
			sp.InternalPolicy = model.PolicyLocal
		}
		var eps []model.Endpoint
		for _, e := range s.eps {
			eps = append(eps, builders.ModelEndpoint(netip.MustParseAddrPort(e), "node-b"))
		}
		for _, e := range s.terminate {
			eps = append(eps, builders.ModelEndpoint(netip.MustParseAddrPort(e), "node-b", builders.ModelTerminating))
		}
		st.Services[sp.Name] = builders.ModelService(sp, eps, &st.Node)
	}
	return st
}

func full(st *model.State) model.Update { return model.Update{State: st, Full: true} }

func partial(st *model.State, changed ...model.ServicePortName) model.Update {
	cs := model.ChangeSet{}
	for _, c := range changed {
		cs[c] = struct{}{}
	}
	return model.Update{State: st, Changed: cs}
}

func spn(ns, name string, proto model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Protocol: proto}
}

type fakes struct {
	m        Maps
	services *FakeMap[ServiceKey, ServiceValue]
	backends *FakeMap[uint32, BackendValue]
	revnat   *FakeMap[uint32, RevNatValue]
	match    *FakeMap[MemberKey, uint8]
	maglev   *FakeMaglev
}

func newFakes(services, backends, revnat int) *fakes {
	f := NewFakes(services, backends, revnat)
	return &fakes{f.Maps(), f.Services, f.Backends, f.RevNat, f.Members, f.Maglev}
}

func (f *fakes) writes() int {
	return f.services.Writes + f.backends.Writes + f.revnat.Writes + f.match.Writes
}

// consistent is what a BPF lookup relies on: every master entry that
// forwards has all of its slots, each naming an existing backend, and a
// reverse-NAT entry.
func (f *fakes) consistent() error {
	for k, v := range f.services.Entries {
		if k.Slot != 0 {
			continue
		}
		if _, ok := f.revnat.Entries[v.RevNatId]; !ok {
			return fmt.Errorf("master %+v: reverse NAT %d missing", k, v.RevNatId)
		}
		if v.Flags&FlagTwoScopes != 0 {
			ik := k
			ik.Scope = ScopeInternal
			if _, ok := f.services.Entries[ik]; !ok {
				return fmt.Errorf("master %+v announces an internal entry that is missing", k)
			}
		}
		for s := uint16(1); s <= v.Count; s++ {
			sk := k
			sk.Slot = s
			sv, ok := f.services.Entries[sk]
			if !ok {
				return fmt.Errorf("master %+v count %d: slot %d missing", k, v.Count, s)
			}
			if _, ok := f.backends.Entries[sv.BackendId]; !ok {
				return fmt.Errorf("master %+v slot %d: backend %d missing", k, s, sv.BackendId)
			}
			// Affinity may pick any backend a slot names.
			if _, ok := f.match.Entries[MemberKey{BackendId: sv.BackendId, SvcId: v.SvcId}]; v.AffinityTimeout != 0 && !ok {
				return fmt.Errorf("master %+v slot %d: backend %d not in the affinity match map", k, s, sv.BackendId)
			}
		}
	}
	for id, table := range f.maglev.Tables {
		for i, b := range table {
			if _, ok := f.backends.Entries[b]; !ok {
				return fmt.Errorf("maglev table of service %d: entry %d names backend %d, which is missing", id, i, b)
			}
		}
	}
	return nil
}

// watchConsistency fails the test the moment any single map write leaves
// the maps in a state a racing reader could trip over.
func (f *fakes) watchConsistency(t *testing.T) {
	check := func() {
		if err := f.consistent(); err != nil {
			t.Helper()
			t.Fatalf("inconsistent between two writes: %v", err)
		}
	}
	f.services.OnChange, f.backends.OnChange, f.revnat.OnChange, f.match.OnChange = check, check, check, check
	f.maglev.OnChange = check
}

func dump(t *testing.T, m Maps) string {
	t.Helper()
	lines, err := Dump(m)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func newWriter(t *testing.T, m Maps) *Writer {
	t.Helper()
	w, err := NewWriter(m, Limits{Backends: 1000, RevNat: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

var (
	dns = svcSpec{ns: "kube-system", name: "dns", clusterIP: "10.96.0.10", port: 53, proto: model.UDP,
		eps: []string{"10.244.1.2:5353", "10.244.2.2:5353"}}
	web = svcSpec{ns: "default", name: "web", clusterIP: "10.96.0.20", port: 80, proto: model.TCP,
		eps: []string{"10.244.1.3:8080", "10.244.2.3:8080", "10.244.3.3:8080"}}
)

func TestWriterProgramsServices(t *testing.T) {
	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	empty := web
	empty.name, empty.clusterIP, empty.eps = "empty", "10.96.0.30", nil
	if err := w.Sync(full(buildState(dns, web, empty))); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"backend 1 10.244.1.3:8080/TCP",
		"backend 2 10.244.2.3:8080/TCP",
		"backend 3 10.244.3.3:8080/TCP",
		"backend 4 10.244.1.2:5353/UDP",
		"backend 5 10.244.2.2:5353/UDP",
		"member svc=2 backend=1 10.244.1.3:8080/TCP",
		"member svc=2 backend=2 10.244.2.3:8080/TCP",
		"member svc=2 backend=3 10.244.3.3:8080/TCP",
		"member svc=3 backend=4 10.244.1.2:5353/UDP",
		"member svc=3 backend=5 10.244.2.2:5353/UDP",
		"revnat 1 10.96.0.30:80",
		"revnat 2 10.96.0.20:80",
		"revnat 3 10.96.0.10:53",
		"service 10.96.0.10:53/UDP count=2 revnat=3 svc=3 flags=cluster-ip",
		"service 10.96.0.10:53/UDP slot=1 backend=4 10.244.1.2:5353/UDP",
		"service 10.96.0.10:53/UDP slot=2 backend=5 10.244.2.2:5353/UDP",
		"service 10.96.0.20:80/TCP count=3 revnat=2 svc=2 flags=cluster-ip",
		"service 10.96.0.20:80/TCP slot=1 backend=1 10.244.1.3:8080/TCP",
		"service 10.96.0.20:80/TCP slot=2 backend=2 10.244.2.3:8080/TCP",
		"service 10.96.0.20:80/TCP slot=3 backend=3 10.244.3.3:8080/TCP",
		"service 10.96.0.30:80/TCP count=0 revnat=1 svc=1 flags=cluster-ip,reject",
	}, "\n")
	if got := dump(t, f.m); got != want {
		t.Errorf("dump:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriterEndpointChangesAreMakeBeforeBreak(t *testing.T) {
	steps := []struct {
		name string
		eps  []string
		term []string
	}{
		{"one endpoint removed from the middle", []string{"10.244.1.3:8080", "10.244.3.3:8080"}, nil},
		{"endpoints added", []string{"10.244.1.3:8080", "10.244.3.3:8080", "10.244.4.3:8080", "10.244.5.3:8080"}, nil},
		{"all replaced", []string{"10.244.9.1:8080", "10.244.9.2:8080"}, nil},
		{"no ready endpoint: terminating ones serve", nil, []string{"10.244.9.1:8080"}},
		{"none at all: reject", nil, nil},
		{"back again", []string{"10.244.1.3:8080"}, nil},
	}
	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			s := web
			s.eps, s.terminate = step.eps, step.term
			if err := w.Sync(partial(buildState(s, dns), spn("default", "web", model.TCP))); err != nil {
				t.Fatal(err)
			}
			got := dump(t, f.m)
			for _, e := range append(slices.Clone(step.eps), step.term...) {
				if !strings.Contains(got, e+"/TCP") {
					t.Errorf("endpoint %s not programmed:\n%s", e, got)
				}
			}
			wantCount := fmt.Sprintf("service 10.96.0.20:80/TCP count=%d ", len(step.eps)+len(step.term))
			if !strings.Contains(got, wantCount) {
				t.Errorf("want %q in:\n%s", wantCount, got)
			}
			// Backends nobody uses are gone; the DNS Service is untouched.
			if n := len(f.backends.Entries); n != len(step.eps)+len(step.term)+2 {
				t.Errorf("%d backends programmed, want %d:\n%s", n, len(step.eps)+len(step.term)+2, got)
			}
		})
	}
}

func TestWriterWritesOnlyWhatChanged(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	before := f.writes()
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	if n := f.writes() - before; n != 0 {
		t.Errorf("a full sync of an unchanged state wrote %d entries, want 0", n)
	}
	s := web
	s.eps = append(slices.Clone(web.eps), "10.244.4.3:8080")
	before = f.writes()
	if err := w.Sync(partial(buildState(s, dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	// One new backend, its membership, its slot, and the master with the
	// new count.
	if n := f.writes() - before; n != 4 {
		t.Errorf("adding one endpoint wrote %d entries, want 4", n)
	}
}

func TestWriterRestoresIDsFromTheMaps(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	st := buildState(web, dns)
	if err := w.Sync(full(st)); err != nil {
		t.Fatal(err)
	}
	before := dump(t, f.m)

	// A restarted agent finds the same maps.
	w2 := newWriter(t, f.m)
	writes := f.writes()
	if err := w2.Sync(full(st)); err != nil {
		t.Fatal(err)
	}
	if n := f.writes() - writes; n != 0 {
		t.Errorf("first sync after restart wrote %d entries, want 0", n)
	}
	if after := dump(t, f.m); after != before {
		t.Errorf("ids changed across restart:\n%s\nwant:\n%s", after, before)
	}
	// New ids do not collide with restored ones.
	s := web
	s.eps = append(slices.Clone(web.eps), "10.244.4.3:8080")
	if err := w2.Sync(partial(buildState(s, dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	if got := dump(t, f.m); !strings.Contains(got, "backend 6 10.244.4.3:8080/TCP") {
		t.Errorf("new backend did not get the next free id:\n%s", got)
	}
}

// TestWriterRestoresIDsAboveItsLimit: an agent restarted with smaller map
// limits finds backends whose ids exceed them (the maps of the earlier
// size): it keeps them as they are while their Services want them, and
// deletes them with their Services.
func TestWriterRestoresIDsAboveItsLimit(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	before := dump(t, f.m)
	small, err := NewWriter(f.m, Limits{Backends: 2, RevNat: 1000})
	if err != nil {
		t.Fatal(err)
	}
	writes := f.writes()
	if err := small.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	if n := f.writes() - writes; n != 0 || dump(t, f.m) != before {
		t.Errorf("the restored state was rewritten (%d writes):\n%s\nwant:\n%s", n, dump(t, f.m), before)
	}
	if err := small.Sync(partial(buildState(dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	got := dump(t, f.m)
	if strings.Contains(got, "8080") || len(f.backends.Entries) != 2 {
		t.Errorf("web's backends (ids 1 to 3, two of them above the limit) not all deleted:\n%s", got)
	}
}

func TestWriterRestartRemovesServicesDeletedWhileDown(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	w2 := newWriter(t, f.m)
	if err := w2.Sync(full(buildState(dns))); err != nil {
		t.Fatal(err)
	}
	got := dump(t, f.m)
	if strings.Contains(got, "10.96.0.20") || strings.Contains(got, ":8080") {
		t.Errorf("deleted Service still programmed:\n%s", got)
	}
}

func TestWriterDeletesServices(t *testing.T) {
	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(partial(buildState(dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(partial(buildState(), spn("kube-system", "dns", model.UDP))); err != nil {
		t.Fatal(err)
	}
	if n := len(f.services.Entries) + len(f.backends.Entries) + len(f.revnat.Entries); n != 0 {
		t.Errorf("%d entries left after deleting every Service:\n%s", n, dump(t, f.m))
	}
}

// TestWriterMovesAFrontendBetweenServices: a Service with ClientIP affinity
// is deleted and a new one takes its ClusterIP in the same sync (a
// frontend moving to another ServicePort). The frontend is never missing,
// and affinity never names a backend that is no member of the ServicePort
// the master entry names at that moment.
func TestWriterMovesAFrontendBetweenServices(t *testing.T) {
	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	sticky := web
	sticky.affinity = 3 * time.Hour
	if err := w.Sync(full(buildState(sticky, dns))); err != nil {
		t.Fatal(err)
	}
	master := func() (ServiceValue, bool) {
		for k, v := range f.services.Entries {
			if k.Slot == 0 && k.Dport == 80<<8 {
				return v, true
			}
		}
		return ServiceValue{}, false
	}
	check := f.services.OnChange
	f.services.OnChange = func() {
		check()
		if _, ok := master(); !ok {
			t.Fatal("the moving frontend is missing between two writes")
		}
	}
	next := svcSpec{ns: "default", name: "next", clusterIP: web.clusterIP, port: 80, proto: model.TCP,
		eps: []string{"10.244.7.1:8080", "10.244.7.2:8080"}}
	if err := w.Sync(full(buildState(next, dns))); err != nil {
		t.Fatal(err)
	}
	v, _ := master()
	if v.Count != 2 || v.AffinityTimeout != 0 || v.SvcId != w.svcs.byOwner[spn("default", "next", model.TCP)] {
		t.Errorf("the frontend's master entry is %+v, want next's two endpoints without affinity", v)
	}
}

func TestWriterFullMapKeepsWhatWorked(t *testing.T) {
	// Room for the two Services' five backends and one more.
	f := newFakes(0, 6, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	before := dump(t, f.m)
	s := web
	s.eps = append(slices.Clone(web.eps), "10.244.4.3:8080", "10.244.5.3:8080")
	err := w.Sync(partial(buildState(s, dns), spn("default", "web", model.TCP)))
	if !errors.Is(err, ErrMapFull) {
		t.Fatalf("got %v, want ErrMapFull", err)
	}
	got := dump(t, f.m)
	for _, line := range strings.Split(before, "\n") {
		if strings.HasPrefix(line, "service") && !strings.Contains(got, line) {
			t.Errorf("a full map broke what worked: %q is gone:\n%s", line, got)
		}
	}
	// The retry writes entry by entry, so a Service that does not fit
	// fails alone: a change to another Service still goes through.
	d := dns
	d.eps = dns.eps[:1]
	err = w.Sync(full(buildState(s, d)))
	if !errors.Is(err, ErrMapFull) {
		t.Fatalf("retry: got %v, want ErrMapFull for the Service that still does not fit", err)
	}
	if got := dump(t, f.m); !strings.Contains(got, "service 10.96.0.10:53/UDP count=1 ") {
		t.Errorf("a Service that fits was held back by one that does not:\n%s", got)
	}
	// Once there is room again, the retry (a full sync) converges.
	f.backends.Max = 0
	if err := w.Sync(full(buildState(s, d))); err != nil {
		t.Fatal(err)
	}
	if got := dump(t, f.m); !strings.Contains(got, "service 10.96.0.20:80/TCP count=5 ") {
		t.Errorf("did not converge after the map had room:\n%s", got)
	}
}

func TestWriterVerdicts(t *testing.T) {
	local := web
	local.itpLocal = true
	affinity := dns
	affinity.affinity = 3 * time.Hour
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	if err := w.Sync(full(buildState(local, affinity))); err != nil {
		t.Fatal(err)
	}
	got := dump(t, f.m)
	for _, want := range []string{
		// Endpoints exist, but none on this node.
		"service 10.96.0.20:80/TCP count=0 revnat=1 svc=1 flags=cluster-ip,drop",
		"service 10.96.0.10:53/UDP count=2 revnat=2 svc=2 flags=cluster-ip affinity=10800s",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}
}

func TestArrangeSlotsKeepsPositions(t *testing.T) {
	for _, tc := range []struct {
		old, ids, want []uint32
	}{
		{nil, []uint32{1, 2}, []uint32{1, 2}},
		{[]uint32{1, 2, 3}, []uint32{1, 3}, []uint32{1, 3}},
		{[]uint32{1, 2, 3}, []uint32{3, 2}, []uint32{3, 2}},
		{[]uint32{1, 2, 3}, []uint32{4, 2, 3, 5}, []uint32{4, 2, 3, 5}},
		{[]uint32{1, 2}, nil, []uint32{}},
	} {
		if got := arrangeSlots(tc.old, tc.ids); !slices.Equal(got, tc.want) {
			t.Errorf("arrangeSlots(%v, %v) = %v, want %v", tc.old, tc.ids, got, tc.want)
		}
	}
}

func TestWriterMembershipFollowsSelection(t *testing.T) {
	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	s := web
	s.affinity = time.Hour
	if err := w.Sync(full(buildState(s, dns))); err != nil {
		t.Fatal(err)
	}
	if n := len(f.match.Entries); n != 5 {
		t.Errorf("%d memberships, want one per backend of each Service:\n%s", n, dump(t, f.m))
	}
	// A removed backend can no longer be returned to, by affinity or by a
	// UDP socket that used it.
	s.eps = web.eps[1:]
	if err := w.Sync(partial(buildState(s, dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	got := dump(t, f.m)
	if strings.Contains(got, "member svc=1 backend=1 ") || len(f.match.Entries) != 4 {
		t.Errorf("removed backend is still a member:\n%s", got)
	}
	// Affinity switched off: the ServicePort keeps its id and members.
	s.affinity = 0
	if err := w.Sync(partial(buildState(s, dns), spn("default", "web", model.TCP))); err != nil {
		t.Fatal(err)
	}
	if got := dump(t, f.m); !strings.Contains(got, "service 10.96.0.20:80/TCP count=2 revnat=1 svc=1 flags=cluster-ip\n") || len(f.match.Entries) != 4 {
		t.Errorf("dump:\n%s", got)
	}
	// A restarted agent finds the memberships and keeps them.
	w2 := newWriter(t, f.m)
	before := f.writes()
	if err := w2.Sync(full(buildState(s, dns))); err != nil {
		t.Fatal(err)
	}
	if n := f.writes() - before; n != 0 {
		t.Errorf("restart wrote %d entries, want 0", n)
	}
	// Deleting the Services removes every membership.
	if err := w2.Sync(full(buildState())); err != nil {
		t.Fatal(err)
	}
	if len(f.match.Entries) != 0 {
		t.Errorf("memberships left after deleting every Service:\n%s", dump(t, f.m))
	}
}

func TestWriterExternalFrontends(t *testing.T) {
	st := buildState(web)
	st.Node.Addrs = []netip.Addr{netip.MustParseAddr("192.168.77.11")}
	st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
	svc := st.Services[spn("default", "web", model.TCP)]
	sp := *svc.Port
	sp.NodePort = 30080
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.19.0.7")}
	sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.19.0.8")}
	reprogram := func(p model.ServicePort) {
		t.Helper()
		eps := svc.Endpoints
		st.Services[sp.Name] = &model.Service{Port: &p, Endpoints: eps, Selection: model.Categorize(&p, eps, &st.Node, model.DefaultOptions)}
	}
	reprogram(sp)

	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	if err := w.Sync(full(st)); err != nil {
		t.Fatal(err)
	}
	got := dump(t, f.m)
	for _, want := range []string{
		"service 10.96.0.20:80/TCP count=3 revnat=1 svc=1 flags=cluster-ip",
		"service 192.168.77.11:30080/TCP count=3 revnat=",
		"flags=node-port\n",
		"service 198.19.0.7:80/TCP count=3 ",
		"service 198.19.0.8:80/TCP count=3 ",
	} {
		if !strings.Contains(got+"\n", want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "(internal)") {
		t.Errorf("policy Cluster needs no internal entries:\n%s", got)
	}

	// externalTrafficPolicy=Local with every endpoint elsewhere: outside
	// clients are dropped, clients on the node short-circuit to all.
	sp.ExternalPolicy = model.PolicyLocal
	reprogram(sp)
	if err := w.Sync(partial(st, sp.Name)); err != nil {
		t.Fatal(err)
	}
	got = dump(t, f.m)
	t.Logf("externalTrafficPolicy=Local:\n%s", got)
	for _, want := range []string{
		"service 192.168.77.11:30080/TCP count=0 revnat=2 svc=1 flags=node-port,two-scopes,drop",
		"service 192.168.77.11:30080/TCP (internal) count=3 revnat=2 svc=1 flags=node-port",
		"service 198.19.0.7:80/TCP (internal) count=3 ",
		"service 198.19.0.8:80/TCP (internal) count=3 ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}

	// Source ranges on the LoadBalancer IP: clients on the node still
	// short-circuit, and both entries carry the ranges, which the socket
	// programs check at egress and the TC program at ingress.
	sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	reprogram(sp)
	if err := w.Sync(partial(st, sp.Name)); err != nil {
		t.Fatal(err)
	}
	got = dump(t, f.m)
	for _, want := range []string{
		"service 198.19.0.8:80/TCP (internal) count=3 revnat=4 svc=1 flags=load-balancer,source-ranges\n",
		"service 198.19.0.8:80/TCP count=0 revnat=4 svc=1 flags=load-balancer,two-scopes,drop,source-ranges,external-local\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}

	// Back to Cluster: the internal entries go, after the masters stop
	// announcing them (checked after every write).
	sp.ExternalPolicy = model.PolicyCluster
	reprogram(sp)
	if err := w.Sync(partial(st, sp.Name)); err != nil {
		t.Fatal(err)
	}
	if got = dump(t, f.m); strings.Contains(got, "(internal)") {
		t.Errorf("internal entries left:\n%s", got)
	}
}

func TestWriterReportsBackendsRemovedFromEveryFrontend(t *testing.T) {
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	shared := dns
	shared.name, shared.clusterIP = "dns-alias", "10.96.0.11"
	if err := w.Sync(full(buildState(dns, shared))); err != nil {
		t.Fatal(err)
	}
	// 10.244.2.2 leaves one Service but still serves the other.
	d := dns
	d.eps = dns.eps[:1]
	if err := w.Sync(partial(buildState(d, shared), spn("kube-system", "dns", model.UDP))); err != nil {
		t.Fatal(err)
	}
	if r := w.Removed(); len(r) != 0 {
		t.Errorf("removed %v while another Service still uses it", r)
	}
	shared.eps = dns.eps[:1]
	if err := w.Sync(partial(buildState(d, shared), spn("kube-system", "dns-alias", model.UDP))); err != nil {
		t.Fatal(err)
	}
	want := Backend{Addr: netip.MustParseAddr("10.244.2.2"), Port: 5353, Proto: model.UDP}
	if r := w.Removed(); len(r) != 1 || r[0] != want {
		t.Errorf("removed %v, want [%v]", r, want)
	}
}

func TestWriterSourceRanges(t *testing.T) {
	st := buildState(web)
	st.Node.Addrs = []netip.Addr{netip.MustParseAddr("192.168.77.11")}
	st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
	svc := st.Services[spn("default", "web", model.TCP)]
	sp := *svc.Port
	reprogram := func(p model.ServicePort) {
		t.Helper()
		eps := svc.Endpoints
		st.Services[sp.Name] = &model.Service{Port: &p, Endpoints: eps, Selection: model.Categorize(&p, eps, &st.Node, model.DefaultOptions)}
	}
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	rangesOf := func() []string {
		t.Helper()
		var out []string
		for _, l := range strings.Split(dump(t, f.m), "\n") {
			if strings.HasPrefix(l, "source-range ") || strings.Contains(l, "198.19.0.8:80/TCP count") {
				out = append(out, l)
			}
		}
		return out
	}
	for _, step := range []struct {
		name   string
		lbIPs  []string
		ranges []string
		want   []string
	}{
		{name: "ranges without a LoadBalancer IP restrict nothing", ranges: []string{"203.0.113.0/24"}, want: nil},
		{name: "a LoadBalancer IP with ranges", lbIPs: []string{"198.19.0.8"}, ranges: []string{"203.0.113.0/24", "198.51.100.7/32", "2001:db8::/32"}, want: []string{
			"service 198.19.0.8:80/TCP count=3 revnat=2 svc=1 flags=load-balancer,source-ranges",
			"source-range svc=1 198.51.100.7/32",
			"source-range svc=1 203.0.113.0/24",
		}},
		{name: "a range removed, one added", lbIPs: []string{"198.19.0.8"}, ranges: []string{"203.0.113.0/24", "192.0.2.0/25"}, want: []string{
			"service 198.19.0.8:80/TCP count=3 revnat=2 svc=1 flags=load-balancer,source-ranges",
			"source-range svc=1 192.0.2.0/25",
			"source-range svc=1 203.0.113.0/24",
		}},
		{name: "only IPv6 ranges: open to all, as kube-proxy's IPv4 rules", lbIPs: []string{"198.19.0.8"}, ranges: []string{"2001:db8::/32"}, want: []string{
			"service 198.19.0.8:80/TCP count=3 revnat=2 svc=1 flags=load-balancer",
		}},
		{name: "ranges again", lbIPs: []string{"198.19.0.8"}, ranges: []string{"203.0.113.0/24"}, want: []string{
			"service 198.19.0.8:80/TCP count=3 revnat=2 svc=1 flags=load-balancer,source-ranges",
			"source-range svc=1 203.0.113.0/24",
		}},
		// kube-proxy's allowFromNode: a node holding the LoadBalancer IP
		// reaches it from that address; and the node's sockets are
		// admitted as the node (see NodeSourceRange).
		{name: "a range holding the node admits the LoadBalancer IPs as a source", lbIPs: []string{"198.19.0.8", "198.19.0.9"},
			ranges: []string{"203.0.113.0/24", "192.168.77.0/24"}, want: []string{
				"service 198.19.0.8:80/TCP count=3 revnat=2 svc=1 flags=load-balancer,source-ranges",
				"source-range svc=1 192.168.77.0/24",
				"source-range svc=1 198.19.0.8/32",
				"source-range svc=1 198.19.0.9/32",
				"source-range svc=1 203.0.113.0/24",
				"source-range svc=1 node",
			}},
		{name: "the node outside the ranges again", lbIPs: []string{"198.19.0.8"}, ranges: []string{"203.0.113.0/24"}, want: []string{
			"service 198.19.0.8:80/TCP count=3 revnat=2 svc=1 flags=load-balancer,source-ranges",
			"source-range svc=1 203.0.113.0/24",
		}},
	} {
		t.Run(step.name, func(t *testing.T) {
			sp.LoadBalancerIPs = nil
			for _, a := range step.lbIPs {
				sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(a))
			}
			sp.LoadBalancerSourceRanges = nil
			for _, r := range step.ranges {
				sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
			reprogram(sp)
			if err := w.Sync(partial(st, sp.Name)); err != nil {
				t.Fatal(err)
			}
			if got := rangesOf(); !slices.Equal(got, step.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(step.want, "\n"))
			}
		})
	}
	t.Run("the Service deleted: its ranges go", func(t *testing.T) {
		delete(st.Services, sp.Name)
		if err := w.Sync(partial(st, sp.Name)); err != nil {
			t.Fatal(err)
		}
		if got := rangesOf(); len(got) != 0 {
			t.Errorf("left: %v", got)
		}
	})
	t.Run("a restarted writer removes ranges nobody wants", func(t *testing.T) {
		if err := f.m.SourceRanges.Put(SourceRangeKey{Prefixlen: 56, SvcId: 99, Address: be32(netip.MustParseAddr("10.0.0.0"))}, 1); err != nil {
			t.Fatal(err)
		}
		w := newWriter(t, f.m)
		if err := w.Sync(full(st)); err != nil {
			t.Fatal(err)
		}
		if got := rangesOf(); len(got) != 0 {
			t.Errorf("left: %v", got)
		}
	})
}

// TestWriterKeepsTerminatingEndpointsUntilRemoved: an endpoint that turns
// terminating while others are ready is chosen by no new flow but stays a
// backend, under its id, so that its established flows keep working; only
// its removal from the EndpointSlice takes it out and reports it.
func TestWriterKeepsTerminatingEndpointsUntilRemoved(t *testing.T) {
	f := newFakes(0, 0, 0)
	f.watchConsistency(t)
	w := newWriter(t, f.m)
	gone := Backend{Addr: netip.MustParseAddr("10.244.1.3"), Port: 8080, Proto: model.TCP}
	s := web
	if err := w.Sync(full(buildState(s, dns))); err != nil {
		t.Fatal(err)
	}
	id, ok := w.BackendID(gone)
	if !ok {
		t.Fatalf("backend %s not programmed", gone)
	}
	name := spn("default", "web", model.TCP)

	s.eps, s.terminate = web.eps[1:], web.eps[:1]
	if err := w.Sync(partial(buildState(s, dns), name)); err != nil {
		t.Fatal(err)
	}
	got := dump(t, f.m)
	if want := fmt.Sprintf("backend %d %s terminating\n", id, gone); !strings.Contains(got, want) {
		t.Errorf("terminating endpoint left the backends map, want %q:\n%s", want, got)
	}
	if bad := fmt.Sprintf("backend=%d ", id); strings.Contains(got, bad) {
		t.Errorf("terminating endpoint can still be chosen (%q):\n%s", bad, got)
	}
	if r := w.Removed(); len(r) != 0 {
		t.Errorf("removed %v while it is only terminating", r)
	}

	// A restarted agent keeps it too, writing nothing.
	w = newWriter(t, f.m)
	before := f.writes()
	if err := w.Sync(full(buildState(s, dns))); err != nil {
		t.Fatal(err)
	}
	if n := f.writes() - before; n != 0 {
		t.Errorf("restart wrote %d entries, want 0:\n%s", n, dump(t, f.m))
	}
	if got, ok := w.BackendID(gone); !ok || got != id {
		t.Errorf("after a restart the terminating endpoint has id %d (%v), want %d", got, ok, id)
	}

	s.terminate = nil
	if err := w.Sync(partial(buildState(s, dns), name)); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.BackendID(gone); ok {
		t.Errorf("removed endpoint still a backend:\n%s", dump(t, f.m))
	}
	if r := w.Removed(); len(r) != 1 || r[0] != gone {
		t.Errorf("removed %v, want [%v]", r, gone)
	}

	// Deleting the Service releases everything it held.
	if err := w.Sync(full(buildState(dns))); err != nil {
		t.Fatal(err)
	}
	if got := dump(t, f.m); strings.Contains(got, ":8080/TCP") {
		t.Errorf("backends of the deleted Service left:\n%s", got)
	}
}
