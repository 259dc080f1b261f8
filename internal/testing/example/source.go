package example

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// Source feeds Kubernetes objects through the agent's translator and change
// tracker, as the informers do, for one node.
type Source struct {
	tb testing.TB
	tr *tracker.Tracker
	tl k8swatch.Translator
}

// NewSource returns a Source for node with both initial lists delivered.
func NewSource(tb testing.TB, node model.Node) *Source {
	return newSource(tb, node, model.NodePortSpec{})
}

// NewSourceWithNodePorts is NewSource with --nodeport-addresses (and
// --iptables-localhost-nodeports) parsed as spec.
func NewSourceWithNodePorts(tb testing.TB, node model.Node, spec model.NodePortSpec) *Source {
	return newSource(tb, node, spec)
}

// newSource is NewSource with --nodeport-addresses parsed as spec.
func newSource(tb testing.TB, node model.Node, spec model.NodePortSpec) *Source {
	s := &Source{tb: tb, tr: tracker.New(node.Name, model.DefaultOptions, spec)}
	s.tl.Invalid = func(kind, ns, name, reason string) { tb.Errorf("invalid %s %s/%s: %s", kind, ns, name, reason) }
	s.tr.UpdateNode(node)
	s.tr.SetServicesSynced()
	s.tr.SetEndpointSlicesSynced()
	return s
}

// Add records Services and their slices.
func (s *Source) Add(pairs ...Pair) *Source {
	for _, p := range pairs {
		s.SetService(p.Service)
		if p.Slice != nil {
			s.SetSlice(p.Slice)
		}
	}
	return s
}

// SetService records a Service.
func (s *Source) SetService(svc *v1.Service) {
	s.tr.UpdateService(k8swatch.ServiceName(svc), s.tl.ServicePorts(svc))
}

// DeleteService records that a Service is gone.
func (s *Source) DeleteService(svc *v1.Service) {
	s.tr.DeleteService(k8swatch.ServiceName(svc))
}

// SetSlice records an EndpointSlice.
func (s *Source) SetSlice(es *discoveryv1.EndpointSlice) {
	s.tr.UpdateEndpointSlice(s.tl.EndpointSlice(es))
}

// DeleteSlice records that an EndpointSlice is gone.
func (s *Source) DeleteSlice(es *discoveryv1.EndpointSlice) {
	svc, _ := k8swatch.EndpointSliceService(es)
	s.tr.DeleteEndpointSlice(svc, es.Name)
}

// SetLocalAddrs records the node's interface addresses, among which
// --nodeport-addresses (every address here) selects the NodePorts'.
func (s *Source) SetLocalAddrs(addrs []netip.Addr) { s.tr.SetLocalAddrs(addrs) }

// Update folds everything recorded since the last call into the State and
// returns the update a sync would get.
func (s *Source) Update() model.Update { return s.tr.Apply() }
