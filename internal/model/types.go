// Package model is ebpf-proxy's desired state: the ServicePorts a node must
// proxy, their endpoints, and which endpoints each kind of traffic may reach.
//
// It is pure: it imports nothing kernel- or client-go-specific, so that every
// dataplane (BPF, iptables, IPVS) renders the same decisions. Endpoint
// selection (kube-proxy's CategorizeEndpoints) happens here, once.
package model

import (
	"fmt"
	"net/netip"
	"time"
)

// Protocol is an IP protocol number, as in the IP header.
type Protocol uint8

// Protocols a Service port can have.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

// String returns the protocol's Kubernetes name.
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// ParseProtocol parses a Kubernetes protocol name; the empty string is TCP,
// as the API server defaults it.
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "TCP", "":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q", s)
}

// ServiceName identifies a Service.
type ServiceName struct {
	Namespace, Name string
}

// String returns "namespace/name".
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// ServicePortName identifies one port of a Service, as kube-proxy's
// ServicePortName does: the port's name (often empty) and protocol.
type ServicePortName struct {
	ServiceName
	Port     string
	Protocol Protocol
}

// String returns "namespace/name:port/PROTO", the form used in logs.
func (n ServicePortName) String() string {
	return fmt.Sprintf("%s/%s:%s/%s", n.Namespace, n.Name, n.Port, n.Protocol)
}

// TrafficPolicy is a Service's internal or external traffic policy.
type TrafficPolicy uint8

// Traffic policies.
const (
	PolicyCluster TrafficPolicy = iota
	PolicyLocal
)

// String returns the policy's Kubernetes name.
func (p TrafficPolicy) String() string {
	if p == PolicyLocal {
		return "Local"
	}
	return "Cluster"
}

// LBAlgorithm is how a frontend reached from outside the node picks a
// backend for a new flow. Clients on the node (the socket hooks) always pick
// at random: their flows never move between nodes.
type LBAlgorithm uint8

// Load-balancing algorithms.
const (
	// LBRandom picks uniformly among the endpoints, as kube-proxy does.
	LBRandom LBAlgorithm = iota
	// LBMaglev hashes the flow's addresses and ports into a Maglev table,
	// so that every node picks the same backend for a flow and a change of
	// the endpoints moves few flows.
	LBMaglev
)

// String returns the algorithm's name as flags and annotations spell it.
func (a LBAlgorithm) String() string {
	if a == LBMaglev {
		return "maglev"
	}
	return "random"
}

// ParseLBAlgorithm parses "random" or "maglev".
func ParseLBAlgorithm(s string) (LBAlgorithm, error) {
	switch s {
	case "random":
		return LBRandom, nil
	case "maglev":
		return LBMaglev, nil
	}
	return LBRandom, fmt.Errorf("unknown load-balancing algorithm %q (want random or maglev)", s)
}

// Session affinity timeouts, as in the core API.
const (
	DefaultAffinityTimeout = 10800 * time.Second
	MaxAffinityTimeout     = 86400 * time.Second
)

// Traffic distribution values that kube-proxy acts on.
const (
	TrafficDistributionPreferClose    = "PreferClose"
	TrafficDistributionPreferSameZone = "PreferSameZone"
	TrafficDistributionPreferSameNode = "PreferSameNode"
)

// ServicePort is one port of a Service with every frontend it is reached on.
// Only addresses of the proxy's IP family are kept.
type ServicePort struct {
	Name ServicePortName

	ClusterIP netip.Addr
	Port      uint16
	// NodePort is 0 when the Service has none.
	NodePort uint16
	// ExternalIPs are spec.externalIPs.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are status.loadBalancer.ingress IPs in VIP mode.
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges restrict traffic to LoadBalancerIPs only.
	LoadBalancerSourceRanges []netip.Prefix
	// HealthCheckNodePort is set for type=LoadBalancer with
	// externalTrafficPolicy=Local.
	HealthCheckNodePort uint16

	// AffinityTimeout is non-zero when sessionAffinity is ClientIP.
	AffinityTimeout time.Duration

	// LBAlgorithm chooses how traffic from outside the node picks a
	// backend: at random, or by Maglev consistent hashing of the flow.
	LBAlgorithm LBAlgorithm

	InternalPolicy TrafficPolicy
	ExternalPolicy TrafficPolicy
	// TrafficDistribution is spec.trafficDistribution, "" when unset. The
	// EndpointSlice controller turns it into hints; kube-proxy and we only
	// follow the hints.
	TrafficDistribution string
}

// ExternallyAccessible reports whether the port has a frontend outside the
// cluster network: a NodePort, an ExternalIP or a LoadBalancer IP.
func (sp *ServicePort) ExternallyAccessible() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// UsesClusterEndpoints reports whether any traffic to the port may go to
// endpoints on other nodes. External policy Local still needs them for
// traffic short-circuited from pods and from the node itself.
func (sp *ServicePort) UsesClusterEndpoints() bool {
	return sp.InternalPolicy != PolicyLocal || sp.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether some traffic to the port is restricted
// to endpoints on this node.
func (sp *ServicePort) UsesLocalEndpoints() bool {
	return sp.InternalPolicy == PolicyLocal ||
		(sp.ExternalPolicy == PolicyLocal && sp.ExternallyAccessible())
}

// Endpoint is one backend of a ServicePort, from an EndpointSlice.
type Endpoint struct {
	Addr netip.Addr
	Port uint16

	// Ready, Serving and Terminating are the EndpointSlice conditions with
	// kube-proxy's defaults: an unset ready or serving is true, an unset
	// terminating is false. publishNotReadyAddresses is not consulted here:
	// the EndpointSlice controller already marks such endpoints ready.
	Ready, Serving, Terminating bool

	// NodeName is the endpoint's nodeName. Its zone is not kept: like
	// kube-proxy, topology routing reads only the hints and the node's zone.
	NodeName string
	// Hints are the endpoint's topology hints, nil when it has none (a
	// pointer: most endpoints have none, and there are 100,000s of them).
	Hints *Hints
}

// Hints are an endpoint's topology hints.
type Hints struct {
	// Zones and Nodes are hints.forZones and hints.forNodes.
	Zones, Nodes []string
}

// ZoneHints returns hints.forZones.
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints returns hints.forNodes.
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// AddrPort returns the endpoint's address and port.
func (e *Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// String returns "ip:port".
func (e *Endpoint) String() string { return e.AddrPort().String() }

// Node is what the proxy knows of the node it runs on.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label.
	Zone string
	// Addrs are the node's addresses (status.addresses InternalIP and
	// ExternalIP, of the proxy's family), the primary one first.
	Addrs []netip.Addr
	// NodePorts are the addresses that accept NodePorts, resolved from
	// --nodeport-addresses for this State (the tracker does it).
	NodePorts NodePortAddresses
}
