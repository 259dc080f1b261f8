package example

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// IPv6 addresses of the example cluster, from the project's test address
// plan: the same nodes and pods as the IPv4 ones, with the same last
// digits, so that a dataplane's IPv6 output reads like its IPv4 output.
var (
	NodeAIP6 = netip.MustParseAddr("fd00:192:168:77::11")
	NodeBIP6 = netip.MustParseAddr("fd00:192:168:77::12")
	PodA1v6  = netip.MustParseAddr("fd00:10:244:1::10")
	PodA2v6  = netip.MustParseAddr("fd00:10:244:1::11")
	PodB1v6  = netip.MustParseAddr("fd00:10:244:2::10")
	// ClusterCIDR6 holds every IPv6 pod.
	ClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
)

// podSubnet is the number of the node's pod subnet that holds pod p: the
// third byte of an IPv4 pod, the fourth group of an IPv6 one.
func podSubnet(p netip.Addr) byte {
	if p.Is4() {
		return p.As4()[2]
	}
	return p.As16()[7]
}

// Node6 returns the model's view of a node of the example cluster as the
// IPv6 proxy sees it.
func Node6(name string) model.Node {
	ip := NodeAIP6
	if name == NodeB {
		ip = NodeBIP6
	}
	return model.Node{Name: name, Addrs: []netip.Addr{ip}}
}

// NewSource6 is NewSource for the IPv6 proxy: its translator keeps the IPv6
// addresses of Services and the IPv6 EndpointSlices.
func NewSource6(tb testing.TB, node model.Node) *Source {
	// --nodeport-addresses unset, for IPv6: every IPv6 address of the node.
	spec, err := model.ParseNodePortSpec(nil, true, false)
	if err != nil {
		tb.Fatal(err)
	}
	s := newSource(tb, node, spec)
	s.tl.Family = v1.IPv6Protocol
	return s
}

// Service6 builds an IPv6 single-stack ClusterIP Service at clusterIP in
// namespace "default" with one TCP port "http" 80 -> 8080, changed by opts.
func Service6(name, clusterIP string, opts ...builders.ServiceOption) *v1.Service {
	ipv6 := func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} }
	return Service(name, clusterIP, append([]builders.ServiceOption{ipv6}, opts...)...)
}

// SliceFor is builders.SliceFor with the address type of the Service's
// (first) IP family, so that an IPv6 Service gets an IPv6 slice.
func SliceFor(svc *v1.Service, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	es := builders.SliceFor(svc, eps...)
	if fams := svc.Spec.IPFamilies; len(fams) > 0 && fams[0] == v1.IPv6Protocol {
		es.AddressType = discoveryv1.AddressTypeIPv6
	}
	return es
}

// Example6 is Example for IPv6: the same Services, in the same order, with
// ClusterIPs in fd00:10:96::/112, External and LoadBalancer IPs in
// fd00:198:19::/64, the source range of "ranged" in the external clients'
// fd00:198:18::/64 (fd00:198:18::/120, which holds ::10 and not ::200, as
// 198.18.0.0/25 holds .10 and not .200) and the pods of Node6's pod subnets.
func Example6() []Pair {
	return []Pair{
		pair(Service6("web", "fd00:10:96::10", builders.NodePort(30010), builders.ExternalIPs("fd00:198:19::10")), EndpointsOn(PodA1v6, PodA2v6, PodB1v6)),
		pair(Service6("web-local", "fd00:10:96::11", builders.LoadBalancer(30011, "fd00:198:19::11"), builders.ExternalLocal(30111)), EndpointsOn(PodA1v6, PodB1v6)),
		pair(Service6("remote-local", "fd00:10:96::12", builders.LoadBalancer(30012, "fd00:198:19::12"), builders.ExternalLocal(30112)), EndpointsOn(PodB1v6)),
		pair(Service6("ranged", "fd00:10:96::13", builders.LoadBalancer(30013, "fd00:198:19::13"), builders.SourceRanges("fd00:198:18::/120")), EndpointsOn(PodA2v6)),
		pair(Service6("sticky", "fd00:10:96::14", builders.Affinity(300)), EndpointsOn(PodA1v6, PodA2v6, PodB1v6)),
		pair(Service6("internal-local", "fd00:10:96::15", builders.InternalLocal()), EndpointsOn(PodB1v6)),
		pair(Service6("empty", "fd00:10:96::16", builders.NodePort(30016), builders.ExternalIPs("fd00:198:19::16")), nil),
		pair(Service6("dns", "fd00:10:96::17", UDPPort()), EndpointsOn(PodA1v6, PodB1v6)),
		pair(Service6("hairpin", "fd00:10:96::18"), EndpointsOn(PodA1v6)),
	}
}
