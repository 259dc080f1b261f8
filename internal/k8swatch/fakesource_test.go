package k8swatch

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// fakeSource is a fake clientset as a Source, for unit tests of Watch's
// handling (the API server itself is in test/e2e). The fake cannot stream
// lists or serve watch lists; its lists are decoded whole.
type fakeSource struct{ c *fake.Clientset }

func (s fakeSource) ListWatch(resource string, tweak func(*metav1.ListOptions), _ cache.TransformFunc) cache.ListerWatcher {
	var list func(context.Context, metav1.ListOptions) (runtime.Object, error)
	var watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)
	switch resource {
	case ResourceServices:
		svc := s.c.CoreV1().Services(metav1.NamespaceAll)
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return svc.List(ctx, o) }
		watchFn = svc.Watch
	case ResourceEndpointSlices:
		es := s.c.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return es.List(ctx, o) }
		watchFn = es.Watch
	case ResourceNodes:
		n := s.c.CoreV1().Nodes()
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return n.List(ctx, o) }
		watchFn = n.Watch
	case ResourcePods:
		p := s.c.CoreV1().Pods(metav1.NamespaceAll)
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return p.List(ctx, o) }
		watchFn = p.Watch
	case ResourceNamespaces:
		n := s.c.CoreV1().Namespaces()
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return n.List(ctx, o) }
		watchFn = n.Watch
	default:
		panic("fakeSource: no " + resource)
	}
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	return cache.ToListWatcherWithWatchListSemantics(tweaked(tweak, list, watchFn), s.c)
}
