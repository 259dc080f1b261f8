// Package fallbacktest holds what the tests of the fallback dataplanes
// share: an example cluster of Services and EndpointSlices built from real
// k8s.io/api objects and translated by the agent's own translator and change
// tracker, and a behaviour table that runs real traffic through a dataplane
// in a sandbox (see Run).
//
// The example cluster follows the project's test address plan and the
// sandbox's topology, so that the golden rule files and the behaviour table
// describe the same Services: two nodes, node-a (192.168.77.11, pods
// 10.244.1.0/24) and node-b (192.168.77.12, pods 10.244.2.0/24), pods a1 and
// a2 on node-a and b1 on node-b, each serving TCP on 8080 and UDP on 5353.
package fallbacktest

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// Nodes and pods of the example cluster.
const (
	NodeA = "node-a"
	NodeB = "node-b"
)

// Addresses of the example cluster.
var (
	NodeAIP = netip.MustParseAddr("192.168.77.11")
	NodeBIP = netip.MustParseAddr("192.168.77.12")
	PodA1   = netip.MustParseAddr("10.244.1.10")
	PodA2   = netip.MustParseAddr("10.244.1.11")
	PodB1   = netip.MustParseAddr("10.244.2.10")
	// ClusterCIDR holds every pod.
	ClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
)

// Ports the pods serve.
const (
	TCPTarget = 8080
	UDPTarget = 5353
)

// Node returns the model's view of a node of the example cluster.
func Node(name string) model.Node {
	ip := NodeAIP
	if name == NodeB {
		ip = NodeBIP
	}
	return model.Node{Name: name, Addrs: []netip.Addr{ip}}
}

// Endpoint is one endpoint of an example EndpointSlice.
type Endpoint struct {
	IP   netip.Addr
	Node string
	// Terminating marks a pod that is shutting down but still serving.
	Terminating bool
}

// EndpointsOn returns ready endpoints for the given pods.
func EndpointsOn(pods ...netip.Addr) []Endpoint {
	var out []Endpoint
	for _, p := range pods {
		node := NodeA
		if p.As4()[2] == 2 {
			node = NodeB
		}
		out = append(out, Endpoint{IP: p, Node: node})
	}
	return out
}

// ServiceOption changes a Service built by MakeService.
type ServiceOption func(*v1.Service)

// MakeService builds a ClusterIP Service in namespace "default" with one
// TCP port "http" 80 -> 8080.
func MakeService(name, clusterIP string, opts ...ServiceOption) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(TCPTarget)}},
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

// NodePort makes the Service type NodePort with the given node port on its
// first port.
func NodePort(port int32) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = port
	}
}

// LoadBalancer makes the Service type LoadBalancer with a node port and an
// ingress IP in VIP mode.
func LoadBalancer(nodePort int32, ingress string) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = nodePort
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ingress}}
	}
}

// ExternalLocal sets externalTrafficPolicy Local and, for a LoadBalancer,
// the health check node port.
func ExternalLocal(healthCheckNodePort int32) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = healthCheckNodePort
	}
}

// InternalLocal sets internalTrafficPolicy Local.
func InternalLocal() ServiceOption {
	return func(s *v1.Service) {
		p := v1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &p
	}
}

// ExternalIPs sets spec.externalIPs.
func ExternalIPs(ips ...string) ServiceOption {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

// SourceRanges sets spec.loadBalancerSourceRanges.
func SourceRanges(cidrs ...string) ServiceOption {
	return func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = cidrs }
}

// Affinity sets sessionAffinity ClientIP with the timeout in seconds.
func Affinity(seconds int32) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &seconds}}
	}
}

// UDPPort adds a UDP port "dns" 53 -> 5353.
func UDPPort() ServiceOption {
	return func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP, TargetPort: intstr.FromInt32(UDPTarget)})
	}
}

// MakeSlice builds the EndpointSlice of svc holding eps, with a port for
// each port of svc.
func MakeSlice(svc *v1.Service, eps []Endpoint) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: svc.Name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range svc.Spec.Ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(p.Name), Port: ptr(p.TargetPort.IntVal), Protocol: ptr(p.Protocol)})
	}
	for _, e := range eps {
		c := discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}
		if e.Terminating {
			c = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.IP.String()}, Conditions: c, NodeName: ptr(e.Node)})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// Example is the example cluster: every kind of frontend, both traffic
// policies with and without local endpoints, affinity, source ranges, a
// Service without endpoints, UDP, and a Service whose only endpoint reaches
// itself through it (hairpin). Services and their slices are returned in
// pairs; a nil slice means no endpoints.
func Example() []Pair {
	return []Pair{
		pair(MakeService("web", "10.96.0.10", NodePort(30010), ExternalIPs("198.19.0.10")), EndpointsOn(PodA1, PodA2, PodB1)),
		pair(MakeService("web-local", "10.96.0.11", LoadBalancer(30011, "198.19.0.11"), ExternalLocal(30111)), EndpointsOn(PodA1, PodB1)),
		pair(MakeService("remote-local", "10.96.0.12", LoadBalancer(30012, "198.19.0.12"), ExternalLocal(30112)), EndpointsOn(PodB1)),
		pair(MakeService("ranged", "10.96.0.13", LoadBalancer(30013, "198.19.0.13"), SourceRanges("198.18.0.0/25")), EndpointsOn(PodA2)),
		pair(MakeService("sticky", "10.96.0.14", Affinity(300)), EndpointsOn(PodA1, PodA2, PodB1)),
		pair(MakeService("internal-local", "10.96.0.15", InternalLocal()), EndpointsOn(PodB1)),
		pair(MakeService("empty", "10.96.0.16", NodePort(30016), ExternalIPs("198.19.0.16")), nil),
		pair(MakeService("dns", "10.96.0.17", UDPPort()), EndpointsOn(PodA1, PodB1)),
		pair(MakeService("hairpin", "10.96.0.18"), EndpointsOn(PodA1)),
	}
}

// Pair is a Service and its EndpointSlice (nil when it has no endpoints).
type Pair struct {
	Service *v1.Service
	Slice   *discoveryv1.EndpointSlice
}

func pair(svc *v1.Service, eps []Endpoint) Pair {
	p := Pair{Service: svc}
	if eps != nil {
		p.Slice = MakeSlice(svc, eps)
	}
	return p
}

// Source feeds Kubernetes objects through the agent's translator and change
// tracker, as the informers do, for one node.
type Source struct {
	tb testing.TB
	tr *tracker.Tracker
	tl k8swatch.Translator
}

// NewSource returns a Source for node with both initial lists delivered.
func NewSource(tb testing.TB, node model.Node) *Source {
	s := &Source{tb: tb, tr: tracker.New(node.Name, model.DefaultOptions, model.NodePortSpec{})}
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
