package tracker_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

func ptr[T any](v T) *T { return &v }

// endpoint is a ready endpoint on node-b, or a serving one of a terminating
// pod.
func endpoint(ip string, terminating bool) discoveryv1.Endpoint {
	if terminating {
		return builders.Endpoint(ip, "node-b", builders.Terminating)
	}
	return builders.Endpoint(ip, "node-b")
}

type harness struct {
	t  *testing.T
	tr *tracker.Tracker
	tl k8swatch.Translator
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, tr: tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})}
	h.tl.Invalid = func(kind, ns, name, reason string) { t.Fatalf("invalid %s %s/%s: %s", kind, ns, name, reason) }
	return h
}

func (h *harness) service(svc *v1.Service) {
	h.tr.UpdateService(k8swatch.ServiceName(svc), h.tl.ServicePorts(svc))
}
func (h *harness) slice(es *discoveryv1.EndpointSlice) {
	h.tr.UpdateEndpointSlice(h.tl.EndpointSlice(es))
}

// endpoints renders the State as "port-name/PROTO: ip:port[ T],..." lines.
func endpoints(st *model.State) string {
	var lines []string
	for spn, s := range st.Services {
		var eps []string
		for _, e := range s.Endpoints {
			x := e.String()
			if e.Terminating {
				x += " T"
			}
			eps = append(eps, x)
		}
		lines = append(lines, spn.Name+":"+spn.Port+"/"+spn.Protocol.String()+": "+strings.Join(eps, ","))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func changed(up model.Update) string {
	var out []string
	for spn := range up.Changed {
		out = append(out, spn.String())
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func TestSlicesAreMergedPerServicePort(t *testing.T) {
	h := newHarness(t)
	h.service(builders.Service("ns", "web", builders.Ports(
		builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("web")),
		builders.Port("dns", 53, v1.ProtocolTCP, intstr.FromInt32(5353)),
		builders.Port("dns-udp", 53, v1.ProtocolUDP, intstr.FromInt32(5353)))))
	h.slice(builders.EndpointSlice("ns", "web-a", "web",
		[]discoveryv1.Endpoint{endpoint("10.0.0.1", false), endpoint("10.0.0.2", false)},
		builders.SlicePorts(builders.SlicePort("http", 8080, v1.ProtocolTCP), builders.SlicePort("dns", 5353, v1.ProtocolTCP), builders.SlicePort("dns-udp", 5353, v1.ProtocolUDP))))
	// A second slice: one more endpoint, one duplicate that is terminating
	// there (the ready copy wins), and the named port resolved differently
	// (pods of another version listen elsewhere).
	h.slice(builders.EndpointSlice("ns", "web-b", "web", []discoveryv1.Endpoint{endpoint("10.0.0.3", false)},
		builders.SlicePorts(builders.SlicePort("http", 9090, v1.ProtocolTCP))))
	h.slice(builders.EndpointSlice("ns", "web-c", "web", []discoveryv1.Endpoint{endpoint("10.0.0.1", true), endpoint("10.0.0.4", false)},
		builders.SlicePorts(builders.SlicePort("dns", 5353, v1.ProtocolTCP))))
	up := h.tr.Apply()
	want := strings.Join([]string{
		"web:dns-udp/UDP: 10.0.0.1:5353,10.0.0.2:5353",
		"web:dns/TCP: 10.0.0.1:5353,10.0.0.2:5353,10.0.0.4:5353",
		"web:http/TCP: 10.0.0.1:8080,10.0.0.2:8080,10.0.0.3:9090",
	}, "\n")
	if got := endpoints(up.State); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestDuplicateEndpointPrefersTheNonTerminatingCopy(t *testing.T) {
	for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
		h := newHarness(t)
		h.service(builders.Service("ns", "web", builders.Ports(builders.Port("", 80, v1.ProtocolTCP, intstr.FromInt32(8080)))))
		h.slice(builders.EndpointSlice("ns", "web-"+order[0], "web", []discoveryv1.Endpoint{endpoint("10.0.0.1", true)}, builders.SlicePorts(builders.SlicePort("", 8080, v1.ProtocolTCP))))
		h.slice(builders.EndpointSlice("ns", "web-"+order[1], "web", []discoveryv1.Endpoint{endpoint("10.0.0.1", false)}, builders.SlicePorts(builders.SlicePort("", 8080, v1.ProtocolTCP))))
		if got := endpoints(h.tr.Apply().State); got != "web:/TCP: 10.0.0.1:8080" {
			t.Errorf("slices %v: got %q, want the ready copy", order, got)
		}
	}
}

func TestChangesAreTrackedPerService(t *testing.T) {
	h := newHarness(t)
	h.service(builders.Service("ns", "a", builders.Ports(builders.Port("", 80, v1.ProtocolTCP, intstr.FromInt32(80)))))
	h.service(builders.Service("ns", "b", builders.Ports(builders.Port("x", 80, v1.ProtocolTCP, intstr.FromInt32(80)), builders.Port("y", 81, v1.ProtocolTCP, intstr.FromInt32(81)))))
	if got := changed(h.tr.Apply()); got != "ns/a:/TCP ns/b:x/TCP ns/b:y/TCP" {
		t.Errorf("initial changes: %s", got)
	}
	if got := changed(h.tr.Apply()); got != "" {
		t.Errorf("nothing happened, yet changed: %s", got)
	}
	// An endpoint change of b touches only b's ports.
	h.slice(builders.EndpointSlice("ns", "b-1", "b", []discoveryv1.Endpoint{endpoint("10.0.0.1", false)}, builders.SlicePorts(builders.SlicePort("x", 80, v1.ProtocolTCP))))
	if got := changed(h.tr.Apply()); got != "ns/b:x/TCP ns/b:y/TCP" {
		t.Errorf("after a slice of b: %s", got)
	}
	// Removing a port deletes it from the State and names it as changed.
	h.service(builders.Service("ns", "b", builders.Ports(builders.Port("x", 80, v1.ProtocolTCP, intstr.FromInt32(80)))))
	up := h.tr.Apply()
	if got := changed(up); got != "ns/b:x/TCP ns/b:y/TCP" {
		t.Errorf("after removing port y: %s", got)
	}
	if got := endpoints(up.State); got != "a:/TCP: \nb:x/TCP: 10.0.0.1:80" {
		t.Errorf("state after removing port y:\n%s", got)
	}
	// Deleting a Service removes its ports; its slices stay until deleted.
	h.tr.DeleteService(model.ServiceName{Namespace: "ns", Name: "b"})
	up = h.tr.Apply()
	if got := endpoints(up.State); got != "a:/TCP: " {
		t.Errorf("state after deleting b:\n%s", got)
	}
	// A slice arriving before its Service is kept and used when it comes.
	h.slice(builders.EndpointSlice("ns", "c-1", "c", []discoveryv1.Endpoint{endpoint("10.0.0.9", false)}, builders.SlicePorts(builders.SlicePort("", 80, v1.ProtocolTCP))))
	h.tr.Apply()
	h.service(builders.Service("ns", "c", builders.Ports(builders.Port("", 80, v1.ProtocolTCP, intstr.FromInt32(80)))))
	if got := endpoints(h.tr.Apply().State); !strings.Contains(got, "c:/TCP: 10.0.0.9:80") {
		t.Errorf("slice that came first was lost:\n%s", got)
	}
}

func TestNodeZoneChangeReselectsEverything(t *testing.T) {
	h := newHarness(t)
	h.service(builders.Service("ns", "a", builders.Ports(builders.Port("", 80, v1.ProtocolTCP, intstr.FromInt32(80)))))
	h.service(builders.Service("ns", "b", builders.Ports(builders.Port("", 80, v1.ProtocolTCP, intstr.FromInt32(80)))))
	h.tr.Apply()
	h.tr.UpdateNode(model.Node{Name: "node-a", Zone: "z1"})
	up := h.tr.Apply()
	if !up.Full || changed(up) != "ns/a:/TCP ns/b:/TCP" {
		t.Errorf("zone change: full=%v changed=%q, want a full update of every port", up.Full, changed(up))
	}
	h.tr.UpdateNode(model.Node{Name: "node-a", Zone: "z1"})
	if up := h.tr.Apply(); up.Full || len(up.Changed) != 0 {
		t.Errorf("an unchanged node triggered a sync: %+v", up)
	}
}

func TestSyncedNeedsBothKinds(t *testing.T) {
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	tr.SetServicesSynced()
	if tr.Synced() {
		t.Error("synced with only Services listed")
	}
	tr.SetEndpointSlicesSynced()
	if !tr.Synced() {
		t.Error("not synced after both lists")
	}
}

func TestDuplicateEndpointPrefersTheLocalCopyAmongEquals(t *testing.T) {
	h := newHarness(t)
	h.service(builders.Service("ns", "web", builders.Ports(builders.Port("", 80, v1.ProtocolTCP, intstr.FromInt32(8080)))))
	remote := endpoint("10.0.0.1", false)
	local := endpoint("10.0.0.1", false)
	local.NodeName = ptr("node-a")
	h.slice(builders.EndpointSlice("ns", "web-a", "web", []discoveryv1.Endpoint{remote}, builders.SlicePorts(builders.SlicePort("", 8080, v1.ProtocolTCP))))
	h.slice(builders.EndpointSlice("ns", "web-b", "web", []discoveryv1.Endpoint{local}, builders.SlicePorts(builders.SlicePort("", 8080, v1.ProtocolTCP))))
	st := h.tr.Apply().State
	for _, s := range st.Services {
		if len(s.Endpoints) != 1 || s.Endpoints[0].NodeName != "node-a" {
			t.Errorf("got %+v, want the one copy on this node", s.Endpoints)
		}
	}
}

func TestUnusableSliceIsIgnored(t *testing.T) {
	h := newHarness(t)
	h.tr.UpdateEndpointSlice(nil)
	if up := h.tr.Apply(); len(up.Changed) != 0 {
		t.Errorf("a nil slice changed %v", up.Changed)
	}
}

// t0 is the trigger-time tests' first trigger time.
var t0 = time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)

// triggerFixture returns a tracker, a ServicePort it does not know yet,
// and a maker of slices of its Service, with a name, a trigger time and
// endpoints on node-b.
func triggerFixture() (*tracker.Tracker, *model.ServicePort, func(name string, at time.Time, ips ...string) *model.EndpointSlice) {
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	sp := builders.ModelServicePort("ns", "a", model.TCP, netip.MustParseAddr("10.96.0.1"), 80)
	return tr, sp, func(name string, at time.Time, ips ...string) *model.EndpointSlice {
		es := &model.EndpointSlice{Service: sp.Name.ServiceName, Name: name, TriggerTime: at, Ports: []model.EndpointPort{{Port: 8080, Protocol: model.TCP}}}
		for _, ip := range ips {
			es.Endpoints = append(es.Endpoints, builders.ModelEndpoint(netip.AddrPortFrom(netip.MustParseAddr(ip), 0), "node-b"))
		}
		return es
	}
}

// TestTriggerTimeOfASliceBeforeItsServiceWaitsForTheService checks that an
// EndpointSlice's trigger time goes with the update that programs its
// Service: the Service and its slices come through different watches, so a
// new Service's slice may come first, when nothing of it can be programmed.
func TestTriggerTimeOfASliceBeforeItsServiceWaitsForTheService(t *testing.T) {
	tr, sp, slice := triggerFixture()
	name := sp.Name.ServiceName

	tr.UpdateEndpointSlice(slice("a-1", t0.Add(time.Second), "10.0.0.1"))
	tr.UpdateEndpointSlice(slice("a-gone", t0, "10.0.0.3"))
	if up := tr.Apply(); len(up.TriggerTimes) != 0 || len(up.Changed) != 0 {
		t.Fatalf("slices without their Service: trigger times %v, changed %v; want none until the Service comes", up.TriggerTimes, up.Changed)
	}
	// A later change of the same slice keeps the earlier time: the first
	// change has not been programmed either. A slice deleted before the
	// Service came takes its time with it.
	tr.UpdateEndpointSlice(slice("a-1", t0.Add(2*time.Second), "10.0.0.1", "10.0.0.2"))
	tr.DeleteEndpointSlice(name, "a-gone")
	if up := tr.Apply(); len(up.TriggerTimes) != 0 {
		t.Fatalf("trigger times %v before the Service came", up.TriggerTimes)
	}

	tr.UpdateService(name, []*model.ServicePort{sp})
	up := tr.Apply()
	if want := []time.Time{t0.Add(time.Second)}; !slices.Equal(up.TriggerTimes, want) {
		t.Errorf("the update programming the Service carries trigger times %v, want %v (a-1's first change)", up.TriggerTimes, want)
	}
	if _, ok := up.Changed[sp.Name]; !ok {
		t.Errorf("the Service's port is not in the update: %v", up.Changed)
	}
	if up := tr.Apply(); len(up.TriggerTimes) != 0 {
		t.Errorf("trigger times %v given twice", up.TriggerTimes)
	}
	// Once the Service is known, each slice change carries its own time.
	tr.UpdateEndpointSlice(slice("a-1", t0.Add(3*time.Second), "10.0.0.2"))
	if up := tr.Apply(); !slices.Equal(up.TriggerTimes, []time.Time{t0.Add(3 * time.Second)}) {
		t.Errorf("a change of a known Service's slice carries %v, want its own trigger time", up.TriggerTimes)
	}
}

// TestEveryChangeOfABatchIsObserved checks that a slice changed twice
// between two syncs (a busy Service, or --min-sync-period batching) gives
// both changes' trigger times, as upstream observes each: the first is the
// one that waited longest. Changes of a slice deleted before the sync are
// not observed: nothing of them is programmed.
func TestEveryChangeOfABatchIsObserved(t *testing.T) {
	tr, sp, slice := triggerFixture()
	name := sp.Name.ServiceName
	tr.UpdateService(name, []*model.ServicePort{sp})
	tr.Apply()

	tr.UpdateEndpointSlice(slice("a-1", t0, "10.0.0.1"))
	tr.UpdateEndpointSlice(slice("a-1", t0.Add(time.Second), "10.0.0.2"))
	tr.UpdateEndpointSlice(slice("a-gone", t0, "10.0.0.3"))
	tr.UpdateEndpointSlice(slice("a-gone", t0.Add(time.Second), "10.0.0.4"))
	tr.DeleteEndpointSlice(name, "a-gone")
	up := tr.Apply()
	if want := []time.Time{t0, t0.Add(time.Second)}; !slices.Equal(up.TriggerTimes, want) {
		t.Errorf("two changes of a-1 in one batch give trigger times %v, want %v", up.TriggerTimes, want)
	}
	if up := tr.Apply(); len(up.TriggerTimes) != 0 {
		t.Errorf("trigger times %v given twice", up.TriggerTimes)
	}
}
