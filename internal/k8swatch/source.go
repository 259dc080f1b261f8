package k8swatch

import (
	"context"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
)

// The resources Watch reads.
const (
	ResourceServices       = "services"
	ResourceEndpointSlices = "endpointslices"
	ResourceNodes          = "nodes"
)

// Source is the API server as Watch reads it.
type Source interface {
	// ListWatch lists and watches resource cluster-wide, every request's
	// options passed through tweak first. transform is the informer's
	// transform: a source may apply it to listed items as they are
	// decoded (transforms are idempotent).
	ListWatch(resource string, tweak func(*metav1.ListOptions), transform cache.TransformFunc) cache.ListerWatcher
}

// APISource is the API server through c. Services and EndpointSlices are
// listed with listStream; watches decode one event at a time already.
func APISource(c *kubeapi.Client) Source { return apiSource{c} }

type apiSource struct{ c *kubeapi.Client }

func (s apiSource) ListWatch(resource string, tweak func(*metav1.ListOptions), transform cache.TransformFunc) cache.ListerWatcher {
	switch resource {
	case ResourceServices:
		return streamedListWatch[v1.Service](s.c.Core, resource, tweak, transform, watchOf(s.c.Core, resource))
	case ResourceEndpointSlices:
		return streamedListWatch[discoveryv1.EndpointSlice](s.c.Discovery, resource, tweak, transform, watchOf(s.c.Discovery, resource))
	case ResourceNodes:
		return plainListWatch[v1.NodeList](s.c.Core, resource, tweak)
	case ResourcePods:
		return plainListWatch[v1.PodList](s.c.Core, resource, tweak)
	case ResourceNamespaces:
		return plainListWatch[v1.NamespaceList](s.c.Core, resource, tweak)
	default:
		panic("k8swatch: no source of " + resource) // Watch and WatchOptOut ask for those above only
	}
}

// plainListWatch lists resource of rc into an L in one request, and
// watches it, with the options through tweak (nil for none).
func plainListWatch[L any, PL interface {
	*L
	runtime.Object
}](rc rest.Interface, resource string, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	return tweaked(tweak, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		list := PL(new(L))
		if err := kubeapi.List(ctx, rc, resource, opts, list); err != nil {
			return nil, err
		}
		return list, nil
	}, watchOf(rc, resource))
}

// tweaked is a list-watcher of list and watchFn whose options pass through
// tweak first. The reflector calls the context variants alone.
func tweaked(tweak func(*metav1.ListOptions), list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			tweak(&opts)
			return list(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			tweak(&opts)
			return watchFn(ctx, opts)
		},
	}
}

// watchOf watches resource of rc with the reflector's (tweaked) options.
func watchOf(rc rest.Interface, resource string) func(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		return kubeapi.Watch(ctx, rc, resource, opts)
	}
}
