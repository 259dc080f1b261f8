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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// Pods opted out of the socket hooks. Under --socket-lb-scope=all the BPF
// mode translates every socket's connect() to a Service into a backend
// address, which a service mesh's sidecar in the pod then sees in place of
// the Service's. A pod, or every pod of a namespace, annotated
//
//	ebpf-proxy.io/socket-lb: disabled
//
// has its Service traffic translated per packet at its device instead, as
// every pod's is under --socket-lb-scope=node. A pod's own annotation wins
// over its namespace's ("enabled" keeps a pod of an opted-out namespace on
// the socket hooks).
const (
	// SocketLBAnnotation is the annotation of a Pod or Namespace.
	SocketLBAnnotation = "ebpf-proxy.io/socket-lb"
	// SocketLBDisabled opts out.
	SocketLBDisabled = "disabled"
	// SocketLBEnabled keeps the socket hooks (a pod in an opted-out
	// namespace).
	SocketLBEnabled = "enabled"
)

// Resources the opt-out watch reads.
const (
	ResourcePods       = "pods"
	ResourceNamespaces = "namespaces"
)

// Kinds the opt-out reads, as InvalidFunc names them.
const (
	KindPod       = "Pod"
	KindNamespace = "Namespace"
)

// optOutPod is what the opt-out reads of a pod of the node.
type optOutPod struct {
	namespace string
	// setting is its annotation's value, "" without one.
	setting string
	addrs   []netip.Addr
}

// podForOptOut is what the opt-out reads of pod, a pod of nodeName; ok
// false for a pod that cannot opt out: of another node, in the node's
// network namespace (hostNetwork: its sockets are the node's), finished,
// or without an address yet.
func podForOptOut(pod *v1.Pod, nodeName string) (optOutPod, bool) {
	if pod.Spec.NodeName != nodeName || pod.Spec.HostNetwork ||
		pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return optOutPod{}, false
	}
	p := optOutPod{namespace: pod.Namespace, setting: pod.Annotations[SocketLBAnnotation]}
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			p.addrs = append(p.addrs, a.Unmap())
		}
	}
	return p, len(p.addrs) > 0
}

// checkSetting tells report (when set) that an object's SocketLBAnnotation
// has a value it does not know ("" is its absence).
func checkSetting(report InvalidFunc, kind, namespace, name, value string) {
	if value == "" || value == SocketLBDisabled || value == SocketLBEnabled || report == nil {
		return
	}
	report(kind, namespace, name, fmt.Sprintf("unknown value: %s=%q: want %q or %q; the setting is ignored",
		SocketLBAnnotation, value, SocketLBDisabled, SocketLBEnabled))
}

// optedOutAddrs are the addresses of the pods opted out, by their own
// annotation or, without one, their namespace's (namespaces maps a
// namespace to its annotation's value); sorted, once each.
func optedOutAddrs(pods map[objectID]optOutPod, namespaces map[string]string) []netip.Addr {
	var out []netip.Addr
	for _, p := range pods {
		setting := p.setting
		if setting != SocketLBDisabled && setting != SocketLBEnabled {
			setting = namespaces[p.namespace]
		}
		if setting == SocketLBDisabled {
			out = append(out, p.addrs...)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

// OptOutOptions configure WatchOptOut.
type OptOutOptions struct {
	// ResyncPeriod is the informers' resync period; zero means
	// DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// Invalid receives every annotation value it does not know.
	Invalid InvalidFunc
	// Forbidden, if set, is told that the identity may not list a
	// resource the opt-out reads (ResourcePods, ResourceNamespaces), once,
	// at start; WatchOptOut then returns without watching.
	Forbidden func(resource string, err error)
}

// WatchOptOut tells set the addresses of the pods of the node named
// nodeName opted out of the socket hooks (SocketLBAnnotation), from the
// API server, until ctx is done: first once the pods and namespaces are
// listed, then at every change of the set. It watches the node's pods
// alone (by field selector, as the kubelet does) and every namespace, both
// stripped of all but what the opt-out reads. An identity that may not
// list them is told to opts.Forbidden, and nothing is watched. It returns
// nil when ctx is done, after the informers have stopped, and an error
// only for a setup mistake.
func WatchOptOut(ctx context.Context, src Source, nodeName string, set func([]netip.Addr), opts OptOutOptions) error {
	if nodeName == "" {
		return errors.New("k8swatch: node name is empty")
	}
	resync := opts.ResyncPeriod
	if resync <= 0 {
		resync = DefaultResyncPeriod
	}
	w := &optOutWatch{nodeName: nodeName, set: set, invalid: opts.Invalid,
		pods: map[objectID]optOutPod{}, namespaces: map[string]string{}}
	podTweak := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}
	informer := func(resource string, obj runtime.Object, tweak func(*metav1.ListOptions)) (cache.SharedIndexInformer, error) {
		inf := cache.NewSharedIndexInformerWithOptions(src.ListWatch(resource, tweak, stripForOptOut), obj,
			cache.SharedIndexInformerOptions{ResyncPeriod: resync})
		if err := inf.SetTransform(stripForOptOut); err != nil {
			return nil, fmt.Errorf("k8swatch: the %s informer's transform: %w", resource, err)
		}
		return inf, nil
	}
	// An identity without the rights (kube-proxy's own, system:node-
	// proxier, lacks them) is said once, not retried by the informers'
	// every backoff.
	for _, r := range []struct {
		resource string
		tweak    func(*metav1.ListOptions)
	}{{ResourcePods, podTweak}, {ResourceNamespaces, nil}} {
		lw, ok := src.ListWatch(r.resource, r.tweak, nil).(cache.ListerWithContext)
		if !ok {
			continue
		}
		if _, err := lw.ListWithContext(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsForbidden(err) {
			if opts.Forbidden != nil {
				opts.Forbidden(r.resource, err)
			}
			return nil
		}
	}
	podInf, err := informer(ResourcePods, &v1.Pod{}, podTweak)
	if err != nil {
		return err
	}
	nsInf, err := informer(ResourceNamespaces, &v1.Namespace{}, nil)
	if err != nil {
		return err
	}
	var regs []cache.ResourceEventHandlerRegistration
	for _, inf := range []cache.SharedIndexInformer{podInf, nsInf} {
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.update(obj, false) },
			UpdateFunc: func(_, obj any) { w.update(obj, false) },
			DeleteFunc: func(obj any) { w.update(obj, true) },
		})
		if err != nil {
			return fmt.Errorf("k8swatch: registering the opt-out handler: %w", err)
		}
		regs = append(regs, reg)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, inf := range []cache.SharedIndexInformer{podInf, nsInf} {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	wg.Go(func() {
		for _, reg := range regs {
			select {
			case <-reg.HasSyncedChecker().Done():
			case <-ctx.Done():
				return
			}
		}
		w.mu.Lock()
		w.synced = true
		w.push()
		w.mu.Unlock()
	})
	<-ctx.Done()
	return nil
}

// optOutWatch is WatchOptOut's state.
type optOutWatch struct {
	nodeName string
	set      func([]netip.Addr)
	invalid  InvalidFunc

	mu         sync.Mutex
	pods       map[objectID]optOutPod
	namespaces map[string]string
	synced     bool
	last       []netip.Addr
	pushed     bool
}

func (w *optOutWatch) update(obj any, deleted bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = t.Obj, true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch o := obj.(type) {
	case *v1.Pod:
		id := objectID{o.Namespace, o.Name}
		p, ok := podForOptOut(o, w.nodeName)
		if deleted || !ok {
			delete(w.pods, id)
			break
		}
		checkSetting(w.invalid, KindPod, o.Namespace, o.Name, p.setting)
		w.pods[id] = p
	case *v1.Namespace:
		s := o.Annotations[SocketLBAnnotation]
		if deleted || s == "" {
			delete(w.namespaces, o.Name)
			break
		}
		checkSetting(w.invalid, KindNamespace, "", o.Name, s)
		w.namespaces[o.Name] = s
	default:
		return
	}
	w.push()
}

// push tells set the opted-out addresses when they changed, once synced.
// Called with mu held.
func (w *optOutWatch) push() {
	if !w.synced {
		return
	}
	addrs := optedOutAddrs(w.pods, w.namespaces)
	if w.pushed && reflect.DeepEqual(addrs, w.last) {
		return
	}
	w.last, w.pushed = addrs, true
	w.set(addrs)
}

// stripForOptOut is the opt-out informers' transform: of a Pod, its name,
// namespace, node, hostNetwork, phase, addresses and SocketLBAnnotation;
// of a Namespace, its name and SocketLBAnnotation. Idempotent; other
// objects pass through.
func stripForOptOut(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Pod:
		stripMeta(&o.ObjectMeta, nil, []string{SocketLBAnnotation})
		o.Spec = v1.PodSpec{NodeName: o.Spec.NodeName, HostNetwork: o.Spec.HostNetwork}
		o.Status = v1.PodStatus{Phase: o.Status.Phase, PodIPs: o.Status.PodIPs}
	case *v1.Namespace:
		stripMeta(&o.ObjectMeta, nil, []string{SocketLBAnnotation})
		o.Spec, o.Status = v1.NamespaceSpec{}, v1.NamespaceStatus{}
	}
	return obj, nil
}
