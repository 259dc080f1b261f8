// Package example is the example cluster the dataplanes' tests share:
// Services and EndpointSlices of every kind, built from real k8s.io/api
// objects and translated by the agent's own translator and change tracker
// (Source), and large model states for benchmarks (Scale). It belongs to no
// dataplane: the fallbacks' golden files and behaviour table and the BPF
// maps' benchmarks describe the same Services.
//
// The example cluster follows the project's test address plan and the
// sandbox's topology: two nodes, node-a (192.168.77.11, pods
// 10.244.1.0/24) and node-b (192.168.77.12, pods 10.244.2.0/24), pods a1
// and a2 on node-a and b1 on node-b, each serving TCP on 8080 and UDP on
// 5353.
//
// It is test infrastructure: production packages never import it.
package example

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
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

// EndpointsOn returns ready endpoints for the given pods, of either family
// (all of one), each on its node.
func EndpointsOn(pods ...netip.Addr) []discoveryv1.Endpoint {
	var out []discoveryv1.Endpoint
	for _, p := range pods {
		node := NodeA
		if podSubnet(p) == 2 {
			node = NodeB
		}
		out = append(out, builders.Endpoint(p.String(), node))
	}
	return out
}

// Service builds a ClusterIP Service at clusterIP in namespace "default"
// with one TCP port "http" 80 -> 8080, changed by opts.
func Service(name, clusterIP string, opts ...builders.ServiceOption) *v1.Service {
	return builders.Service("default", name, append([]builders.ServiceOption{builders.ClusterIP(clusterIP)}, opts...)...)
}

// UDPPort adds a UDP port "dns" 53 -> 5353.
func UDPPort() builders.ServiceOption {
	return builders.AddPort(builders.Port("dns", 53, v1.ProtocolUDP, intstr.FromInt32(UDPTarget)))
}

// Example is the example cluster: every kind of frontend, both traffic
// policies with and without local endpoints, affinity, source ranges, a
// Service without endpoints, UDP, and a Service whose only endpoint reaches
// itself through it (hairpin). Services and their slices are returned in
// pairs; a nil slice means no endpoints.
func Example() []Pair {
	return []Pair{
		pair(Service("web", "10.96.0.10", builders.NodePort(30010), builders.ExternalIPs("198.19.0.10")), EndpointsOn(PodA1, PodA2, PodB1)),
		pair(Service("web-local", "10.96.0.11", builders.LoadBalancer(30011, "198.19.0.11"), builders.ExternalLocal(30111)), EndpointsOn(PodA1, PodB1)),
		pair(Service("remote-local", "10.96.0.12", builders.LoadBalancer(30012, "198.19.0.12"), builders.ExternalLocal(30112)), EndpointsOn(PodB1)),
		pair(Service("ranged", "10.96.0.13", builders.LoadBalancer(30013, "198.19.0.13"), builders.SourceRanges("198.18.0.0/25")), EndpointsOn(PodA2)),
		pair(Service("sticky", "10.96.0.14", builders.Affinity(300)), EndpointsOn(PodA1, PodA2, PodB1)),
		pair(Service("internal-local", "10.96.0.15", builders.InternalLocal()), EndpointsOn(PodB1)),
		pair(Service("empty", "10.96.0.16", builders.NodePort(30016), builders.ExternalIPs("198.19.0.16")), nil),
		pair(Service("dns", "10.96.0.17", UDPPort()), EndpointsOn(PodA1, PodB1)),
		pair(Service("hairpin", "10.96.0.18"), EndpointsOn(PodA1)),
	}
}

// Pair is a Service and its EndpointSlice (nil when it has no endpoints).
type Pair struct {
	Service *v1.Service
	Slice   *discoveryv1.EndpointSlice
}

func pair(svc *v1.Service, eps []discoveryv1.Endpoint) Pair {
	p := Pair{Service: svc}
	if eps != nil {
		p.Slice = SliceFor(svc, eps...)
	}
	return p
}
