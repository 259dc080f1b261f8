// Package api is the agent's read-only local API: an HTTP server on a unix
// socket (--api-socket, mode 0600) that says what the agent serves now,
// Service by Service, from the desired state its dataplanes last applied.
// `ebpf-proxy dump` reads it to put names on the entries of the pinned maps.
//
// One endpoint: GET /v1/services returns Services (JSON).
package api

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// ServicesPath is the one endpoint.
const ServicesPath = "/v1/services"

// Services is the answer of GET /v1/services: every ServicePort the agent
// serves, of every IP family, sorted by namespace, name, port name,
// protocol and family.
type Services struct {
	// Node is the node's name.
	Node     string        `json:"node"`
	Services []ServicePort `json:"services"`
}

// ServicePort is one port of a Service in one IP family, as the agent's
// dataplane for that family last applied it.
type ServicePort struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Port is the port's name, often empty.
	Port string `json:"port"`
	// Protocol is TCP, UDP or SCTP.
	Protocol string `json:"protocol"`
	// IPFamily is IPv4 or IPv6.
	IPFamily string `json:"ipFamily"`
	// InternalTrafficPolicy and ExternalTrafficPolicy are Cluster or Local.
	InternalTrafficPolicy string `json:"internalTrafficPolicy"`
	ExternalTrafficPolicy string `json:"externalTrafficPolicy"`
	// AffinityTimeoutSeconds is non-zero under session affinity ClientIP.
	AffinityTimeoutSeconds int        `json:"affinityTimeoutSeconds,omitempty"`
	Frontends              []Frontend `json:"frontends"`
	// Backends are every endpoint of the port (all its EndpointSlices),
	// selected for traffic or not, sorted by address and port.
	Backends []Backend `json:"backends"`
}

// Frontend kinds.
const (
	KindClusterIP     = "ClusterIP"
	KindNodePort      = "NodePort"
	KindExternalIP    = "ExternalIP"
	KindLoadBalancer  = "LoadBalancer"
	KindLocalNodePort = "NodePort (localhost)"
)

// Frontend is an address and port the ServicePort is reached on. The
// address, port and protocol are the key of the BPF services map: dump
// joins its entries to names on them.
type Frontend struct {
	Address netip.Addr `json:"address"`
	Port    uint16     `json:"port"`
	// Kind is ClusterIP, NodePort, ExternalIP, LoadBalancer, or "NodePort
	// (localhost)" for 127.0.0.1 NodePorts of the node's own sockets.
	Kind string `json:"kind"`
	// TrafficPolicy is the policy that governs it: the internal one for
	// the ClusterIP, the external one for the others.
	TrafficPolicy string `json:"trafficPolicy"`
}

// Backend states.
const (
	// StateReady: the endpoint is ready.
	StateReady = "ready"
	// StateServing: not ready but serving and terminating; used only when
	// no endpoint is ready.
	StateServing = "serving"
	// StateTerminating: terminating and not serving.
	StateTerminating = "terminating"
	// StateNotReady: neither ready nor terminating.
	StateNotReady = "not-ready"
)

// Backend is an endpoint of the ServicePort.
type Backend struct {
	Address netip.Addr `json:"address"`
	Port    uint16     `json:"port"`
	// State is ready, serving, terminating or not-ready.
	State string `json:"state"`
	// Local is set when the endpoint is on this node.
	Local bool `json:"local"`
	// Node is the endpoint's nodeName, empty when unset.
	Node string `json:"node,omitempty"`
}

// StateOf is the state of an endpoint, from its conditions.
func StateOf(ep *model.Endpoint) string {
	switch {
	case ep.Ready:
		return StateReady
	case ep.Serving && ep.Terminating:
		return StateServing
	case ep.Terminating:
		return StateTerminating
	}
	return StateNotReady
}

// State is what the agent's dataplanes applied, family by family, read
// by the server. Its families are fed by the sync loops (Family) and read
// by any goroutine (Services).
type State struct {
	mu       sync.RWMutex
	families map[string]*family
	order    []string
}

type family struct {
	name     string
	node     model.Node
	services map[model.ServicePortName]*model.Service
}

// NewState returns an empty State.
func NewState() *State { return &State{families: map[string]*family{}} }

// Family returns the recorder of the IP family name (IPv4 or IPv6): give
// it every update the family's dataplane applied (proxier.Config.Applied).
func (s *State) Family(name string) *Recorder {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.families[name]
	if f == nil {
		f = &family{name: name, services: map[model.ServicePortName]*model.Service{}}
		s.families[name] = f
		s.order = append(s.order, name)
	}
	return &Recorder{s: s, f: f}
}

// Recorder records the updates one family's dataplane applied.
type Recorder struct {
	s *State
	f *family
}

// Sync records up after the dataplane applied it: every ServicePort on a
// full update, the changed ones otherwise. It keeps pointers to the
// model.Services, which the tracker never changes once published, and
// copies the rest.
func (r *Recorder) Sync(up model.Update) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.f.node = up.State.Node
	r.f.node.Addrs = slices.Clone(up.State.Node.Addrs)
	r.f.node.NodePorts.Addrs = slices.Clone(up.State.Node.NodePorts.Addrs)
	r.f.node.NodePorts.Prefixes = slices.Clone(up.State.Node.NodePorts.Prefixes)
	if up.Full {
		clear(r.f.services)
		for spn, svc := range up.State.Services {
			r.f.services[spn] = svc
		}
		return
	}
	for spn := range up.Changed {
		if svc := up.State.Services[spn]; svc != nil {
			r.f.services[spn] = svc
		} else {
			delete(r.f.services, spn)
		}
	}
}

// Services is what the families applied last, as served on
// /v1/services.
func (s *State) Services() Services {
	type snap struct {
		name     string
		node     model.Node
		services []*model.Service
	}
	s.mu.RLock()
	snaps := make([]snap, 0, len(s.order))
	for _, name := range s.order {
		f := s.families[name]
		sn := snap{name: name, node: f.node}
		for _, svc := range f.services {
			sn.services = append(sn.services, svc)
		}
		snaps = append(snaps, sn)
	}
	s.mu.RUnlock()

	out := Services{Services: []ServicePort{}}
	for _, sn := range snaps {
		if out.Node == "" {
			out.Node = sn.node.Name
		}
		for _, svc := range sn.services {
			out.Services = append(out.Services, describe(svc, &sn.node, sn.name))
		}
	}
	slices.SortFunc(out.Services, func(a, b ServicePort) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port),
			cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.IPFamily, b.IPFamily))
	})
	return out
}

// describe is one ServicePort with the frontends the BPF dataplane gives
// it (maps.frontendsOf's addresses) and all its endpoints.
func describe(svc *model.Service, node *model.Node, fam string) ServicePort {
	sp := svc.Port
	out := ServicePort{
		Namespace: sp.Name.Namespace, Name: sp.Name.Name, Port: sp.Name.Port, Protocol: sp.Name.Protocol.String(),
		IPFamily:              fam,
		InternalTrafficPolicy: sp.InternalPolicy.String(), ExternalTrafficPolicy: sp.ExternalPolicy.String(),
		AffinityTimeoutSeconds: int(sp.AffinityTimeout.Seconds()),
		Frontends:              []Frontend{}, Backends: []Backend{},
	}
	add := func(addr netip.Addr, port uint16, kind string, policy model.TrafficPolicy) {
		if !addr.IsValid() || port == 0 {
			return
		}
		out.Frontends = append(out.Frontends, Frontend{Address: addr, Port: port, Kind: kind, TrafficPolicy: policy.String()})
	}
	add(sp.ClusterIP, sp.Port, KindClusterIP, sp.InternalPolicy)
	if sp.NodePort != 0 {
		for _, addr := range node.NodePorts.External() {
			add(addr, sp.NodePort, KindNodePort, sp.ExternalPolicy)
		}
		if node.NodePorts.Localhost {
			add(netip.AddrFrom4([4]byte{127, 0, 0, 1}), sp.NodePort, KindLocalNodePort, model.PolicyCluster)
		}
	}
	for _, addr := range sp.ExternalIPs {
		add(addr, sp.Port, KindExternalIP, sp.ExternalPolicy)
	}
	for _, addr := range sp.LoadBalancerIPs {
		add(addr, sp.Port, KindLoadBalancer, sp.ExternalPolicy)
	}
	for i := range svc.Endpoints {
		ep := &svc.Endpoints[i]
		out.Backends = append(out.Backends, Backend{Address: ep.Addr, Port: ep.Port, State: StateOf(ep),
			Local: node.Name != "" && ep.NodeName == node.Name, Node: ep.NodeName})
	}
	return out
}
