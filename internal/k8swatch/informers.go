package k8swatch

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// DefaultResyncPeriod is kube-proxy's default --config-sync-period.
const DefaultResyncPeriod = 15 * time.Minute

// WatchOptions configure Watch.
type WatchOptions struct {
	// LBAlgorithm is the algorithm of Services that do not choose one
	// (--lb-algorithm).
	LBAlgorithm model.LBAlgorithm
	// ResyncPeriod is the informers' resync period (kube-proxy's
	// --config-sync-period); zero means DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// Invalid receives every object or part of one that cannot be proxied.
	Invalid InvalidFunc
	// NodeStatus, when set, is told whether the own Node is known, being
	// deleted, and which taints it carries, for /healthz's node
	// eligibility (kube-proxy fails /healthz for a Node being deleted or
	// tainted ToBeDeletedByClusterAutoscaler).
	NodeStatus func(known, deleting bool, taintKeys []string)
	// NodeIP, when valid, is the node's primary address whatever its Node
	// object lists (kube-proxy's --bind-address).
	NodeIP netip.Addr
	// NodeChanged, when set, is told why the agent should start again:
	// the own Node's IPs (NodeHostIPs) are no longer those it first had,
	// or the Node was deleted. kube-proxy 1.37 exits then, so that it
	// starts again from the Node's new state; the agent does the same.
	NodeChanged func(reason string)
}

// ServiceSelector is the label selector of the Services kube-proxy
// handles: those without LabelServiceProxyName (another proxy's).
// SliceSelector is that of the EndpointSlices: those without LabelHeadless.
// Each applies to its kind alone, as in kube-proxy 1.37: a Service
// labelled headless that has a ClusterIP is proxied (without endpoints),
// and a slice carrying another proxy's name still serves a Service of
// ours. (Up to 1.36 both labels applied to both kinds.)
func ServiceSelector() labels.Selector { return absent(LabelServiceProxyName) }

// SliceSelector: see ServiceSelector.
func SliceSelector() labels.Selector { return absent(LabelHeadless) }

// absent selects the objects that lack label.
func absent(label string) labels.Selector {
	r, err := labels.NewRequirement(label, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // constant input
	}
	return labels.NewSelector().Add(*r)
}

// Watch feeds the trackers of targets, one per IP family, from the API
// server until ctx is done: the Services and EndpointSlices meant for
// kube-proxy (ServiceSelector and SliceSelector, and Services with a cluster IP other than
// "None") and the Node named nodeName, each translated for each family
// (one watch serves them all). Services and EndpointSlices are marked
// synced in every tracker once their initial lists have been delivered.
//
// Watch does not need the API server at start: the informers retry until it
// answers, and they resume (relisting if needed) after it restarts. It
// returns nil when ctx is done, after the informers have stopped, and an
// error only for a setup mistake.
func Watch(ctx context.Context, src Source, nodeName string, targets []Target, opts WatchOptions) error {
	if nodeName == "" {
		return errors.New("k8swatch: node name is empty")
	}
	lanes, err := newLanes(targets, Translator{LBAlgorithm: opts.LBAlgorithm, NodeIP: opts.NodeIP})
	if err != nil {
		return err
	}
	resync := opts.ResyncPeriod
	if resync <= 0 {
		resync = DefaultResyncPeriod
	}
	h := &handlers{
		lanes:       lanes,
		invalid:     opts.Invalid,
		nodeStatus:  opts.NodeStatus,
		nodeChanged: opts.NodeChanged,
		nodeName:    nodeName,
	}
	// Headless Services are also left out at the API server by field, as
	// kube-proxy does: they can be many, and the proxy never uses them.
	svcTweak := func(o *metav1.ListOptions) {
		o.LabelSelector = ServiceSelector().String()
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()
	}
	sliceTweak := func(o *metav1.ListOptions) { o.LabelSelector = SliceSelector().String() }
	nodeTweak := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}
	informer := func(resource string, obj runtime.Object, tweak func(*metav1.ListOptions), transform cache.TransformFunc) (cache.SharedIndexInformer, error) {
		inf := cache.NewSharedIndexInformerWithOptions(src.ListWatch(resource, tweak, transform), obj,
			cache.SharedIndexInformerOptions{ResyncPeriod: resync})
		if err := inf.SetTransform(transform); err != nil {
			return nil, fmt.Errorf("k8swatch: the %s informer's transform: %w", resource, err)
		}
		return inf, nil
	}
	svcInf, err := informer(ResourceServices, &v1.Service{}, svcTweak, h.serviceTransform)
	if err != nil {
		return err
	}
	sliceInf, err := informer(ResourceEndpointSlices, &discoveryv1.EndpointSlice{}, sliceTweak, h.sliceTransform)
	if err != nil {
		return err
	}
	nodeInf, err := informer(ResourceNodes, &v1.Node{}, nodeTweak, strip)
	if err != nil {
		return err
	}

	svcReg, err := svcInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h.addService,
		UpdateFunc: h.updateService,
		DeleteFunc: h.deleteService,
	})
	if err != nil {
		return fmt.Errorf("k8swatch: registering the Service handler: %w", err)
	}
	sliceReg, err := sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h.addSlice,
		UpdateFunc: h.updateSlice,
		DeleteFunc: h.deleteSlice,
	})
	if err != nil {
		return fmt.Errorf("k8swatch: registering the EndpointSlice handler: %w", err)
	}
	if _, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h.addNode,
		UpdateFunc: h.updateNode,
		DeleteFunc: h.deleteNode,
	}); err != nil {
		return fmt.Errorf("k8swatch: registering the Node handler: %w", err)
	}

	// Watch returns only once the informers have stopped.
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, inf := range []cache.SharedIndexInformer{svcInf, sliceInf, nodeInf} {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	// The registration's checker, unlike the informer's HasSynced, is done
	// only once every object of the initial list has reached the handler,
	// so the tracker never sees "synced" before the objects themselves.
	for _, l := range lanes {
		go markSynced(ctx, svcReg, l.tr.SetServicesSynced)
		go markSynced(ctx, sliceReg, l.tr.SetEndpointSlicesSynced)
	}

	<-ctx.Done()
	return nil
}

func markSynced(ctx context.Context, reg cache.ResourceEventHandlerRegistration, set func()) {
	select {
	case <-reg.HasSyncedChecker().Done():
		set()
	case <-ctx.Done():
	}
}

// handlers turn informer events into tracker changes. Updates that change
// nothing the proxy uses (resyncs, relists, status and annotation churn)
// are dropped, as kube-proxy's change trackers do: Services and
// EndpointSlices arrive translated (serviceTransform, sliceTransform), and
// their problems are reported when a new version reaches the handler, once
// per object version. Every object is translated for each
// family's lane and a change goes to the tracker of the lane it changes.
type handlers struct {
	lanes       []lane
	invalid     InvalidFunc
	nodeStatus  func(known, deleting bool, taintKeys []string)
	nodeChanged func(reason string)
	nodeName    string

	// nodeIPs are the own Node's IPs when first seen (seen true); only the
	// Node informer's handlers, called one at a time, use them.
	nodeIPs []netip.Addr
	seen    bool
}

// unchanged reports whether an update is a resync or relist of the same
// object version, which needs no translation at all.
func unchanged(oldObj, newObj metav1.Object) bool {
	rv := newObj.GetResourceVersion()
	return rv != "" && rv == oldObj.GetResourceVersion()
}

// tombstone unwraps the object of a delete event whose final state the
// informer missed (a relist after a broken watch).
func tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// servicePorts translates svc for every lane, reporting to invalid.
func (h *handlers) servicePorts(invalid InvalidFunc, svc *v1.Service) [][]*model.ServicePort {
	// The API server filters by label already; this guards against a
	// server or fake that does not, and an update that adds the label.
	if !ServiceProxied(svc.Labels) {
		return make([][]*model.ServicePort, len(h.lanes))
	}
	return translate(h.lanes, invalid, func(tl *Translator) []*model.ServicePort { return tl.ServicePorts(svc) })
}

func (h *handlers) addService(obj any) {
	c, ok := h.cachedSvc(obj)
	if !ok {
		return
	}
	h.report(c.problems)
	for i, ports := range c.ports {
		if ports != nil {
			h.lanes[i].tr.UpdateService(c.name(), ports)
		}
	}
}

func (h *handlers) updateService(oldObj, newObj any) {
	oldC, ok1 := h.cachedSvc(oldObj)
	newC, ok2 := h.cachedSvc(newObj)
	if !ok1 || !ok2 || unchanged(oldC, newC) {
		return
	}
	h.report(newC.problems)
	for i, newPorts := range newC.ports {
		switch {
		case reflect.DeepEqual(oldC.ports[i], newPorts):
		case newPorts == nil:
			h.lanes[i].tr.DeleteService(newC.name())
		default:
			h.lanes[i].tr.UpdateService(newC.name(), newPorts)
		}
	}
}

// deleteService does not look at the deleted object's labels or spec: the
// API server reports a Service that stops matching the selector as deleted,
// and what the object says then is not what the tracker was given.
func (h *handlers) deleteService(obj any) {
	if c, ok := h.cachedSvc(obj); ok {
		for _, l := range h.lanes {
			l.tr.DeleteService(c.name())
		}
	}
}

func (h *handlers) addSlice(obj any) {
	c, ok := h.cached(obj)
	if !ok {
		return
	}
	h.report(c.problems)
	for i, s := range c.slices {
		if s != nil {
			h.lanes[i].tr.UpdateEndpointSlice(s)
		}
	}
}

func (h *handlers) updateSlice(oldObj, newObj any) {
	oldC, ok1 := h.cached(oldObj)
	newC, ok2 := h.cached(newObj)
	if !ok1 || !ok2 || unchanged(oldC, newC) {
		return
	}
	h.report(newC.problems)
	for i := range h.lanes {
		applySlice(h.lanes[i].tr, oldC.slices[i], newC.slices[i])
	}
}

// deleteSlice, like deleteService, only needs the slice's name and Service.
func (h *handlers) deleteSlice(obj any) {
	if c, ok := h.cached(obj); ok && c.serviceOK {
		for _, l := range h.lanes {
			l.tr.DeleteEndpointSlice(c.service, c.Name)
		}
	}
}

// applySlice records the change from old to new (either may be nil) of one
// EndpointSlice. The tracker files a slice under its Service, so a slice
// whose service-name label changed is removed from the old Service first.
func applySlice(tr *tracker.Tracker, old, cur *model.EndpointSlice) {
	if sameSlice(old, cur) {
		return
	}
	if old != nil && (cur == nil || old.Service != cur.Service) {
		tr.DeleteEndpointSlice(old.Service, old.Name)
	}
	if cur != nil {
		tr.UpdateEndpointSlice(cur)
	}
}

// sameSlice compares two translated slices, ignoring the trigger time: a
// new trigger time with nothing else changed programs nothing.
func sameSlice(a, b *model.EndpointSlice) bool {
	if a == nil || b == nil {
		return a == b
	}
	ac, bc := *a, *b
	ac.TriggerTime, bc.TriggerTime = time.Time{}, time.Time{}
	return reflect.DeepEqual(ac, bc)
}

func (h *handlers) addNode(obj any) {
	n, ok := obj.(*v1.Node)
	if !ok || n.Name != h.nodeName {
		return
	}
	ips := NodeHostIPs(n)
	switch {
	case !h.seen:
		h.nodeIPs, h.seen = ips, true
	case !slices.Equal(ips, h.nodeIPs) && h.nodeChanged != nil:
		h.nodeChanged(fmt.Sprintf("the Node's IPs changed from %v to %v", h.nodeIPs, ips))
	}
	for _, l := range h.lanes {
		l.tr.UpdateNode(l.tl.Node(n))
	}
	if h.nodeStatus != nil {
		var taints []string
		for _, t := range n.Spec.Taints {
			taints = append(taints, t.Key)
		}
		h.nodeStatus(true, n.DeletionTimestamp != nil, taints)
	}
}

func (h *handlers) updateNode(oldObj, newObj any) {
	oldN, ok1 := oldObj.(*v1.Node)
	newN, ok2 := newObj.(*v1.Node)
	if !ok1 || !ok2 || unchanged(oldN, newN) {
		return
	}
	h.addNode(newN)
}

// deleteNode forgets the zone and addresses of a deleted own Node, as
// kube-proxy forgets its labels: topology hints stop applying. It tells
// NodeChanged, whose agent then starts again.
func (h *handlers) deleteNode(obj any) {
	n, ok := tombstone(obj).(*v1.Node)
	if !ok || n.Name != h.nodeName {
		return
	}
	if h.nodeChanged != nil {
		h.nodeChanged("the Node was deleted")
	}
	for _, l := range h.lanes {
		l.tr.UpdateNode(model.Node{Name: h.nodeName})
	}
	if h.nodeStatus != nil {
		h.nodeStatus(false, false, nil)
	}
}
