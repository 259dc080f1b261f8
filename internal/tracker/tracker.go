// Package tracker is the change tracker between the sources (informers, the
// manifests directory) and the sync loop. Sources record changes from any
// goroutine; the sync loop folds them into the desired State, recomputing
// endpoint selection only for the Services that changed, so that one change
// costs the same at 10 Services and at 10,000.
package tracker

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

type sliceKey struct {
	svc  model.ServiceName
	name string
}

// Tracker accumulates source changes and applies them to a model.State.
// The Update*/Delete*/Set* methods are safe from any goroutine; Apply must
// only be called by the one goroutine that owns the State (the sync loop).
type Tracker struct {
	opts      model.Options
	nodePorts model.NodePortSpec
	notify    chan struct{}

	mu              sync.Mutex
	pendingServices map[model.ServiceName][]*model.ServicePort // nil value: deleted
	pendingSlices   map[sliceKey]*model.EndpointSlice          // nil value: deleted
	// pendingTriggers are the trigger times of pending slice changes that
	// a later change of the same slice replaced before an Apply: each
	// change is observed, as upstream does, not only the last of a batch.
	// Nil while there are none.
	pendingTriggers map[sliceKey][]time.Time
	pendingNode     *model.Node
	pendingLocal    []netip.Addr // nil: unchanged
	servicesSynced  bool
	slicesSynced    bool
	serviceChanges  int
	endpointChanges int

	// Owned by the Apply goroutine.
	services map[model.ServiceName][]*model.ServicePort
	slices   map[model.ServiceName]sliceSet
	// state holds, for each Service of services, exactly its ports: a
	// change touches only its own Service.
	state *model.State
	// local are the node's interface addresses, which --nodeport-addresses
	// selects among.
	local []netip.Addr
	// waiting holds the trigger time of each slice that changed while its
	// Service had no ports: nothing of the change is programmed until the
	// Service comes (the two arrive through different watches, so the
	// slice may come first). The earliest time per slice is kept, and
	// given to the update that programs the Service; a slice deleted
	// meanwhile takes its time with it. Allocated when first needed.
	waiting map[model.ServiceName]map[string]time.Time
}

// New returns a tracker for the node named nodeName. nodePorts is
// --nodeport-addresses: every State's Node.NodePorts is resolved from it,
// the Node and the local addresses (SetLocalAddrs).
func New(nodeName string, opts model.Options, nodePorts model.NodePortSpec) *Tracker {
	node := model.Node{Name: nodeName}
	node.NodePorts = nodePorts.Resolve(&node, nil)
	return &Tracker{
		opts:            opts,
		nodePorts:       nodePorts,
		notify:          make(chan struct{}, 1),
		pendingServices: map[model.ServiceName][]*model.ServicePort{},
		pendingSlices:   map[sliceKey]*model.EndpointSlice{},
		services:        map[model.ServiceName][]*model.ServicePort{},
		slices:          map[model.ServiceName]sliceSet{},
		state: &model.State{
			Node:     node,
			Services: map[model.ServicePortName]*model.Service{},
		},
	}
}

// Notify returns a channel that receives a value whenever a change is
// recorded. It is buffered by one, so a burst of changes wakes the sync loop
// once.
func (t *Tracker) Notify() <-chan struct{} { return t.notify }

func (t *Tracker) wake() {
	select {
	case t.notify <- struct{}{}:
	default:
	}
}

// UpdateService records the current ports of a Service. No ports (a
// headless or ExternalName Service, or one with no port of the proxy's
// family) is the same as deleting it.
func (t *Tracker) UpdateService(name model.ServiceName, ports []*model.ServicePort) {
	if ports == nil {
		ports = []*model.ServicePort{}
	}
	t.mu.Lock()
	t.pendingServices[name] = ports
	t.serviceChanges++
	t.mu.Unlock()
	t.wake()
}

// DeleteService records that a Service is gone.
func (t *Tracker) DeleteService(name model.ServiceName) {
	t.mu.Lock()
	t.pendingServices[name] = nil
	t.serviceChanges++
	t.mu.Unlock()
	t.wake()
}

// UpdateEndpointSlice records the current content of an EndpointSlice. A
// nil slice (one the translator could not use) is ignored.
func (t *Tracker) UpdateEndpointSlice(s *model.EndpointSlice) {
	if s == nil {
		return
	}
	key := sliceKey{s.Service, s.Name}
	t.mu.Lock()
	if prev := t.pendingSlices[key]; prev != nil && !prev.TriggerTime.IsZero() && !prev.TriggerTime.Equal(s.TriggerTime) {
		if t.pendingTriggers == nil {
			t.pendingTriggers = map[sliceKey][]time.Time{}
		}
		t.pendingTriggers[key] = append(t.pendingTriggers[key], prev.TriggerTime)
	}
	t.pendingSlices[key] = s
	t.endpointChanges++
	t.mu.Unlock()
	t.wake()
}

// DeleteEndpointSlice records that an EndpointSlice is gone.
func (t *Tracker) DeleteEndpointSlice(svc model.ServiceName, name string) {
	t.mu.Lock()
	t.pendingSlices[sliceKey{svc, name}] = nil
	// Changes of a slice deleted before they were programmed are not.
	delete(t.pendingTriggers, sliceKey{svc, name})
	t.endpointChanges++
	t.mu.Unlock()
	t.wake()
}

// UpdateNode records what is known of the proxy's own node. A change of
// zone re-selects the endpoints of every Service.
func (t *Tracker) UpdateNode(n model.Node) {
	t.mu.Lock()
	t.pendingNode = &n
	t.mu.Unlock()
	t.wake()
}

// SetLocalAddrs records the addresses of the node's interfaces (loopback
// included). The sync loop reads them before every Apply, so that an address
// added to the node gets its NodePorts at the next sync.
func (t *Tracker) SetLocalAddrs(addrs []netip.Addr) {
	if addrs == nil {
		addrs = []netip.Addr{}
	}
	t.mu.Lock()
	t.pendingLocal = addrs
	t.mu.Unlock()
}

// SetServicesSynced marks the initial list of Services as delivered.
func (t *Tracker) SetServicesSynced() {
	t.mu.Lock()
	t.servicesSynced = true
	t.mu.Unlock()
	t.wake()
}

// SetEndpointSlicesSynced marks the initial list of EndpointSlices as
// delivered.
func (t *Tracker) SetEndpointSlicesSynced() {
	t.mu.Lock()
	t.slicesSynced = true
	t.mu.Unlock()
	t.wake()
}

// Synced reports whether both Services and EndpointSlices have delivered
// their initial lists. Nothing may be programmed before: a partial view
// would remove Services that simply have not been seen yet.
func (t *Tracker) Synced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.servicesSynced && t.slicesSynced
}

// Pending returns the number of Service and EndpointSlice changes waiting
// for the next Apply.
func (t *Tracker) Pending() (services, endpoints int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pendingServices), len(t.pendingSlices)
}

// Apply folds every pending change into the State and returns the update
// for the dataplanes. The returned State is the tracker's own: callers may
// read it until the next Apply but must not change it.
func (t *Tracker) Apply() model.Update {
	t.mu.Lock()
	pendingServices, pendingSlices, pendingNode, pendingLocal := t.pendingServices, t.pendingSlices, t.pendingNode, t.pendingLocal
	superseded := t.pendingTriggers
	t.pendingServices = map[model.ServiceName][]*model.ServicePort{}
	t.pendingSlices = map[sliceKey]*model.EndpointSlice{}
	t.pendingTriggers = nil
	t.pendingNode = nil
	t.pendingLocal = nil
	up := model.Update{
		State:           t.state,
		Changed:         model.ChangeSet{},
		ServiceChanges:  t.serviceChanges,
		EndpointChanges: t.endpointChanges,
	}
	t.serviceChanges, t.endpointChanges = 0, 0
	t.mu.Unlock()

	dirty := map[model.ServiceName]struct{}{}
	for name, ports := range pendingServices {
		// The State holds the ports the Service had: they go first, since
		// a port that was renamed or removed must disappear from it.
		for _, sp := range t.services[name] {
			delete(t.state.Services, sp.Name)
			up.Changed[sp.Name] = struct{}{}
		}
		if len(ports) == 0 {
			delete(t.services, name)
		} else {
			t.services[name] = ports
			for _, at := range t.waiting[name] {
				up.TriggerTimes = append(up.TriggerTimes, at)
			}
			delete(t.waiting, name)
		}
		dirty[name] = struct{}{}
	}
	for key, s := range pendingSlices {
		if s == nil {
			if bySvc := t.slices[key.svc].remove(key.name); len(bySvc) > 0 {
				t.slices[key.svc] = bySvc
			} else {
				delete(t.slices, key.svc)
			}
			t.unwait(key)
		} else {
			t.slices[key.svc] = t.slices[key.svc].put(s)
			times := superseded[key]
			if !s.TriggerTime.IsZero() {
				times = append(times, s.TriggerTime)
			}
			if len(t.services[key.svc]) > 0 {
				up.TriggerTimes = append(up.TriggerTimes, times...)
			} else {
				for _, at := range times {
					t.wait(key, at)
				}
			}
		}
		dirty[key.svc] = struct{}{}
	}
	nodeChanged := pendingNode != nil && !sameNode(&t.state.Node, pendingNode)
	if nodeChanged {
		np := t.state.Node.NodePorts
		t.state.Node = *pendingNode
		t.state.Node.NodePorts = np
	}
	if pendingLocal != nil {
		t.local = pendingLocal
	}
	if np := t.nodePorts.Resolve(&t.state.Node, t.local); !np.Equal(&t.state.Node.NodePorts) {
		t.state.Node.NodePorts = np
		nodeChanged = true
	}
	if nodeChanged {
		up.Full = true
		for name := range t.services {
			dirty[name] = struct{}{}
		}
	}

	for name := range dirty {
		for _, sp := range t.services[name] {
			eps := mergeEndpoints(sp, t.slices[name], t.state.Node.Name)
			t.state.Services[sp.Name] = &model.Service{
				Port:      sp,
				Endpoints: eps,
				Selection: model.Categorize(sp, eps, &t.state.Node, t.opts),
			}
			up.Changed[sp.Name] = struct{}{}
		}
	}
	return up
}

// wait keeps the trigger time at of the slice key, whose Service has no
// ports yet, unless an earlier one is kept.
func (t *Tracker) wait(key sliceKey, at time.Time) {
	if t.waiting == nil {
		t.waiting = map[model.ServiceName]map[string]time.Time{}
	}
	bySlice := t.waiting[key.svc]
	if bySlice == nil {
		bySlice = map[string]time.Time{}
		t.waiting[key.svc] = bySlice
	}
	if old, ok := bySlice[key.name]; !ok || at.Before(old) {
		bySlice[key.name] = at
	}
}

// unwait forgets the trigger time kept for the deleted slice key.
func (t *Tracker) unwait(key sliceKey) {
	bySlice := t.waiting[key.svc]
	if bySlice == nil {
		return
	}
	delete(bySlice, key.name)
	if len(bySlice) == 0 {
		delete(t.waiting, key.svc)
	}
}

func sameNode(a, b *model.Node) bool {
	return a.Name == b.Name && a.Zone == b.Zone && slices.Equal(a.Addrs, b.Addrs)
}

// mergeEndpoints collects the endpoints of sp from every EndpointSlice of
// its Service. An endpoint listed twice (a pod moving between slices, or an
// IP reused before the old pod is gone) keeps its non-terminating copy, as
// upstream does since 1.36, and among equals the copy on this node, as
// upstream did before; upstream visits slices in map order, we in name
// order, so that the outcome is deterministic.
func mergeEndpoints(sp *model.ServicePort, bySlice sliceSet, node string) []model.Endpoint {
	if len(bySlice) == 0 {
		return nil
	}
	if eps, ok := asIs(sp, bySlice); ok {
		return eps
	}
	return mergeAll(sp, bySlice, node)
}

// mergeAll is mergeEndpoints building a new list.
func mergeAll(sp *model.ServicePort, bySlice sliceSet, node string) []model.Endpoint {
	seen := map[netip.AddrPort]int{}
	var out []model.Endpoint
	for _, s := range bySlice {
		for _, p := range s.Ports {
			if p.Name != sp.Name.Port || p.Protocol != sp.Name.Protocol || p.Port == 0 {
				continue
			}
			for _, ep := range s.Endpoints {
				ep.Port = p.Port
				key := ep.AddrPort()
				if i, ok := seen[key]; ok {
					if better(&ep, &out[i], node) {
						out[i] = ep
					}
					continue
				}
				seen[key] = len(out)
				out = append(out, ep)
			}
		}
	}
	slices.SortFunc(out, func(a, b model.Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	return out
}

// asIs returns the endpoints of the only slice of a Service when they are
// already what mergeEndpoints would build for sp: one port, sp's, and no
// address twice. The list is shared, capped so that appending copies;
// endpoint lists are never changed once built.
func asIs(sp *model.ServicePort, bySlice sliceSet) ([]model.Endpoint, bool) {
	if len(bySlice) != 1 {
		return nil, false
	}
	s := bySlice[0]
	if len(s.Ports) != 1 {
		return nil, false
	}
	p := s.Ports[0]
	if p.Name != sp.Name.Port || p.Protocol != sp.Name.Protocol || p.Port == 0 {
		return nil, false
	}
	for i := range s.Endpoints {
		if s.Endpoints[i].Port != p.Port || i > 0 && s.Endpoints[i-1].Addr.Compare(s.Endpoints[i].Addr) >= 0 {
			return nil, false
		}
	}
	return s.Endpoints[:len(s.Endpoints):len(s.Endpoints)], true
}

// sliceSet is a Service's EndpointSlices in name order. Most Services have
// one, which a map by name would hold in ten times the memory (about 4 MiB
// at 10,000 Services).
type sliceSet []*model.EndpointSlice

func (ss sliceSet) find(name string) (int, bool) {
	return slices.BinarySearchFunc(ss, name, func(s *model.EndpointSlice, n string) int { return strings.Compare(s.Name, n) })
}

// put returns ss with s in place of the slice of its name, or added.
func (ss sliceSet) put(s *model.EndpointSlice) sliceSet {
	i, ok := ss.find(s.Name)
	if ok {
		ss[i] = s
		return ss
	}
	return slices.Insert(ss, i, s)
}

// remove returns ss without the slice named name.
func (ss sliceSet) remove(name string) sliceSet {
	if i, ok := ss.find(name); ok {
		return slices.Delete(ss, i, i+1)
	}
	return ss
}

// better reports whether duplicate a should replace b.
func better(a, b *model.Endpoint, node string) bool {
	if a.Terminating != b.Terminating {
		return !a.Terminating
	}
	return node != "" && a.NodeName == node && b.NodeName != node
}
