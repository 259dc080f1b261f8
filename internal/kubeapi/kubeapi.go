// Package kubeapi is the agent's client of the Kubernetes API server: a
// REST client for each API group the proxy uses (core/v1 for Services and
// Nodes, discovery.k8s.io/v1 for EndpointSlices, events.k8s.io/v1 for its
// events) and the scheme of their types.
//
// The agent does not link client-go's clientset, informer factory or
// scheme: they register and carry the code of every built-in API group
// (over fifty), which made the binary twice its size and, mapped, about a
// quarter of the agent's resident memory. Everything the proxy reads and
// writes fits in three groups.
package kubeapi

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Scheme holds the API types the proxy reads and writes, and the meta
// types of list and watch options.
var Scheme = runtime.NewScheme()

// Codecs are Scheme's serializers (protobuf, JSON, YAML).
var Codecs = serializer.NewCodecFactory(Scheme)

// ParameterCodec encodes list, get and watch options as query parameters.
var ParameterCodec = runtime.NewParameterCodec(Scheme)

func init() {
	utilruntime.Must(v1.AddToScheme(Scheme))
	utilruntime.Must(discoveryv1.AddToScheme(Scheme))
	utilruntime.Must(eventsv1.AddToScheme(Scheme))
	// The unversioned meta types (ListOptions, Status, WatchEvent).
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
}

// Client is a REST client for each API group the proxy uses.
type Client struct {
	// Core is core/v1 (/api/v1): Services, Nodes.
	Core rest.Interface
	// Discovery is discovery.k8s.io/v1: EndpointSlices.
	Discovery rest.Interface
	// Events is events.k8s.io/v1.
	Events rest.Interface
}

// NewClient returns the clients of cfg. They share one HTTP client and,
// when cfg sets a QPS and no rate limiter, one rate limiter, as a
// clientset's groups do.
func NewClient(cfg *rest.Config) (*Client, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		if cfg.Burst <= 0 {
			return nil, fmt.Errorf("kubeapi: a burst above 0 is needed with a QPS of %v", cfg.QPS)
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeapi: %w", err)
	}
	group := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = Codecs.WithoutConversion()
		rc, err := rest.RESTClientForConfigAndClient(c, hc)
		if err != nil {
			return nil, fmt.Errorf("kubeapi: client of %s: %w", gv, err)
		}
		return rc, nil
	}
	var c Client
	if c.Core, err = group(v1.SchemeGroupVersion, "/api"); err != nil {
		return nil, err
	}
	if c.Discovery, err = group(discoveryv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if c.Events, err = group(eventsv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	return &c, nil
}

// Watch watches resource of rc cluster-wide with opts, as a generated
// client does: a watch request whose server-side timeout is the options'.
func Watch(ctx context.Context, rc rest.Interface, resource string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return get(rc, resource, &opts).Watch(ctx)
}

// List lists resource of rc cluster-wide with opts into into, decoded whole.
func List(ctx context.Context, rc rest.Interface, resource string, opts metav1.ListOptions, into runtime.Object) error {
	return get(rc, resource, &opts).Do(ctx).Into(into)
}

// get is the cluster-wide GET of resource with opts as query parameters
// and the options' timeout as the request's.
func get(rc rest.Interface, resource string, opts *metav1.ListOptions) *rest.Request {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return rc.Get().Resource(resource).VersionedParams(opts, ParameterCodec).Timeout(timeout)
}

// GetNode reads the Node named name.
func (c *Client) GetNode(ctx context.Context, name string) (*v1.Node, error) {
	n := &v1.Node{}
	if err := c.Core.Get().Resource("nodes").Name(name).Do(ctx).Into(n); err != nil {
		return nil, err
	}
	return n, nil
}
