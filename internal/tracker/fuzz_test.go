package tracker_test

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// ops decodes a sequence of source changes from a fuzz input.
type ops struct{ b []byte }

func (o *ops) next() byte {
	if len(o.b) == 0 {
		return 0
	}
	c := o.b[0]
	o.b = o.b[1:]
	return c
}

func (o *ops) pick(pool ...string) string { return pool[int(o.next())%len(pool)] }

var (
	fuzzServices = []model.ServiceName{{Namespace: "ns", Name: "a"}, {Namespace: "ns", Name: "b"}, {Namespace: "other", Name: "a"}}
	fuzzProtos   = []model.Protocol{model.TCP, model.UDP}
)

// servicePorts are the ports of Service i as the translator makes them:
// one ClusterIP, no port name and protocol twice.
func (o *ops) servicePorts(i int) []*model.ServicePort {
	name := fuzzServices[i]
	var out []*model.ServicePort
	c := o.next()
	for n := c % 4; n > 0; n-- {
		c = o.next()
		sp := &model.ServicePort{
			Name:      model.ServicePortName{ServiceName: name, Port: o.pick("", "http", "dns"), Protocol: fuzzProtos[c&1]},
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}),
			Port:      80 + uint16(c>>1&3),
		}
		if c&8 != 0 {
			sp.InternalPolicy = model.PolicyLocal
		}
		if c&16 != 0 {
			sp.NodePort = 30000 + uint16(i)
			if c&32 != 0 {
				sp.ExternalPolicy = model.PolicyLocal
			}
		}
		if c&64 != 0 {
			sp.TrafficDistribution = o.pick(model.TrafficDistributionPreferClose, model.TrafficDistributionPreferSameNode)
		}
		if !slices.ContainsFunc(out, func(o *model.ServicePort) bool { return o.Name == sp.Name }) {
			out = append(out, sp)
		}
	}
	return out
}

// slice is an EndpointSlice as the translator makes it: endpoints in
// address order, carrying the port of a one-port slice.
func (o *ops) slice(svc model.ServiceName, name string) *model.EndpointSlice {
	s := &model.EndpointSlice{Service: svc, Name: name}
	for n := o.next() % 3; n > 0; n-- {
		c := o.next()
		s.Ports = append(s.Ports, model.EndpointPort{Name: o.pick("", "http", "dns", "other"), Port: 8080 + uint16(c&3), Protocol: fuzzProtos[c>>2&1]})
	}
	for n := o.next() % 5; n > 0; n-- {
		c := o.next()
		ep := model.Endpoint{
			Addr:        netip.AddrFrom4([4]byte{10, 244, 0, c & 7}),
			Ready:       c&8 == 0,
			Serving:     c&16 == 0,
			Terminating: c&32 != 0,
			NodeName:    o.pick("node-a", "node-b", ""),
		}
		if c&64 != 0 {
			ep.Hints = &model.Hints{Zones: []string{o.pick("zone-a", "zone-b")}}
			if c&128 != 0 {
				ep.Hints.Nodes = []string{o.pick("node-a", "node-b")}
			}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	slices.SortStableFunc(s.Endpoints, func(a, b model.Endpoint) int { return a.Addr.Compare(b.Addr) })
	if len(s.Ports) == 1 {
		for i := range s.Endpoints {
			s.Endpoints[i].Port = s.Ports[0].Port
		}
	}
	return s
}

type sliceID struct {
	svc  model.ServiceName
	name string
}

// FuzzTrackerSequence applies a sequence of Service, EndpointSlice and
// Node changes one by one (with an Apply after most) and checks that every
// ServicePort whose Service changed is in the update's change set, that
// each update carries the trigger times triggerModel says, and that the
// final State is the one a fresh tracker builds from the final objects in
// one full sync.
func FuzzTrackerSequence(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 1, 0, 2, 0, 0, 0, 1, 1, 2, 0x10, 1, 0, 0x21, 0, 0, 2, 0, 0, 1, 0, 0, 3, 0, 1, 1})
	f.Add([]byte{0, 1, 2, 0x11, 1, 0x02, 2, 0x80, 2, 1, 2, 0x41, 1, 2, 3, 0x12, 1, 0, 0x2c, 1, 1, 0x43, 0, 0, 4, 1, 0, 2, 1, 1, 0x92, 1, 1, 2, 1, 0, 4, 0, 3, 1, 0, 1, 1})
	f.Add([]byte{2, 0, 0, 1, 0, 1, 3, 2, 1, 0, 3, 1, 1, 0x20, 0, 1, 0x88, 2, 0, 0, 0x81, 0, 0, 1, 0, 0x16, 0x80, 4, 1, 3, 0, 0, 1, 0x85, 0, 1, 0, 2, 0, 0})
	// Two endpoints hinted for two zones, then the node's zone changes.
	f.Add([]byte{0, 1, 0, 0, 2, 0, 1, 0, 0, 2, 0x40, 1, 0, 0, 0x41, 1, 1, 1, 4, 0, 4, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		o := &ops{data}
		tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
		services := map[model.ServiceName][]*model.ServicePort{}
		sls := map[sliceID]*model.EndpointSlice{}
		var node *model.Node
		prev := map[model.ServicePortName]*model.Service{}
		triggers := newTriggerModel()
		for step := 0; len(o.b) > 0 && step < 64; step++ {
			c := o.next()
			svc := fuzzServices[int(c>>3)%len(fuzzServices)]
			switch c % 5 {
			case 0:
				ports := o.servicePorts(slices.Index(fuzzServices, svc))
				tr.UpdateService(svc, ports)
				services[svc] = ports
			case 1:
				tr.DeleteService(svc)
				delete(services, svc)
			case 2:
				s := o.slice(svc, o.pick("s1", "s2"))
				s.TriggerTime = fuzzEpoch.Add(time.Duration(step) * time.Second)
				tr.UpdateEndpointSlice(s)
				sls[sliceID{s.Service, s.Name}] = s
				triggers.update(sliceID{s.Service, s.Name}, s.TriggerTime)
			case 3:
				id := sliceID{svc, o.pick("s1", "s2")}
				tr.DeleteEndpointSlice(id.svc, id.name)
				delete(sls, id)
				triggers.delete(id)
			case 4:
				node = &model.Node{Name: "node-a", Zone: o.pick("zone-a", "zone-b", "")}
				tr.UpdateNode(*node)
			}
			if c&0x80 != 0 {
				continue // batched with the next change
			}
			up := tr.Apply()
			checkChanged(t, prev, up)
			triggers.check(t, services, up)
			prev = maps(up.State.Services)
		}
		last := tr.Apply()
		triggers.check(t, services, last)
		got := last.State

		fresh := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
		for name, ports := range services {
			fresh.UpdateService(name, ports)
		}
		for _, s := range sls {
			fresh.UpdateEndpointSlice(s)
		}
		if node != nil {
			fresh.UpdateNode(*node)
		}
		up := fresh.Apply()
		want := up.State
		for spn := range want.Services {
			if _, ok := up.Changed[spn]; !ok {
				t.Errorf("first sync of a fresh tracker: %v not in the change set", spn)
			}
		}
		if d := diffStates(got, want); d != "" {
			t.Errorf("state after the changes one by one differs from the final objects at once: %s", d)
		}
	})
}

var fuzzEpoch = time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)

// triggerModel is what the tracker must do with the slices' trigger times:
// every change of a slice is observed once, by the first update whose
// State holds its Service; a change made while the Service has no ports
// waits for it, the earliest per slice; the changes of a slice deleted
// before they were observed are not.
type triggerModel struct {
	pending map[sliceID][]time.Time // changes since the last Apply
	deleted map[sliceID]bool        // deleted last, since the last Apply
	waiting map[sliceID]time.Time
}

func newTriggerModel() *triggerModel {
	return &triggerModel{pending: map[sliceID][]time.Time{}, deleted: map[sliceID]bool{}, waiting: map[sliceID]time.Time{}}
}

func (m *triggerModel) update(id sliceID, at time.Time) {
	delete(m.deleted, id)
	m.pending[id] = append(m.pending[id], at)
}

func (m *triggerModel) delete(id sliceID) {
	delete(m.pending, id)
	m.deleted[id] = true
}

// check compares up's trigger times with the model's after an Apply, given
// the Services then.
func (m *triggerModel) check(t *testing.T, services map[model.ServiceName][]*model.ServicePort, up model.Update) {
	t.Helper()
	var want []time.Time
	for id, at := range m.waiting {
		if len(services[id.svc]) > 0 {
			want = append(want, at)
			delete(m.waiting, id)
		}
	}
	for id := range m.deleted {
		delete(m.waiting, id)
	}
	for id, times := range m.pending {
		if len(services[id.svc]) > 0 {
			want = append(want, times...)
			continue
		}
		for _, at := range times {
			if w, ok := m.waiting[id]; !ok || at.Before(w) {
				m.waiting[id] = at
			}
		}
	}
	clear(m.pending)
	clear(m.deleted)
	got := slices.Clone(up.TriggerTimes)
	slices.SortFunc(got, time.Time.Compare)
	slices.SortFunc(want, time.Time.Compare)
	if !slices.Equal(got, want) {
		t.Errorf("trigger times %v, want %v", got, want)
	}
}

func maps(m map[model.ServicePortName]*model.Service) map[model.ServicePortName]*model.Service {
	out := make(map[model.ServicePortName]*model.Service, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// checkChanged fails unless every ServicePort added, removed or replaced
// since prev is in the update's change set: a dataplane rewrites only
// those.
func checkChanged(t *testing.T, prev map[model.ServicePortName]*model.Service, up model.Update) {
	t.Helper()
	for spn, s := range up.State.Services {
		if _, ok := up.Changed[spn]; !ok && prev[spn] != s {
			t.Errorf("%v changed but is not in the change set", spn)
		}
	}
	for spn := range prev {
		if _, ok := up.Changed[spn]; !ok && up.State.Services[spn] == nil {
			t.Errorf("%v removed but is not in the change set", spn)
		}
	}
}

func diffStates(got, want *model.State) string {
	if !reflect.DeepEqual(got.Node, want.Node) {
		return fmt.Sprintf("node %+v, want %+v", got.Node, want.Node)
	}
	for spn := range got.Services {
		if want.Services[spn] == nil {
			return fmt.Sprintf("%v is there, want it gone", spn)
		}
	}
	for spn, w := range want.Services {
		g := got.Services[spn]
		switch {
		case g == nil:
			return fmt.Sprintf("%v missing", spn)
		case !reflect.DeepEqual(g.Port, w.Port):
			return fmt.Sprintf("%v: port %+v, want %+v", spn, g.Port, w.Port)
		case !sameEndpoints(g.Endpoints, w.Endpoints):
			return fmt.Sprintf("%v: endpoints %v, want %v", spn, g.Endpoints, w.Endpoints)
		case !sameEndpoints(g.Selection.Cluster, w.Selection.Cluster) || !sameEndpoints(g.Selection.Local, w.Selection.Local) ||
			g.Selection.HasAny != w.Selection.HasAny || g.Selection.LocalReady != w.Selection.LocalReady:
			return fmt.Sprintf("%v: selection %+v, want %+v", spn, g.Selection, w.Selection)
		}
	}
	return ""
}

// sameEndpoints compares endpoint lists, nil and empty alike.
func sameEndpoints(a, b []model.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}
