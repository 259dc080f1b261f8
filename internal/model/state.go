package model

import "time"

// Action is what a frontend does with a new connection or flow.
type Action uint8

// Actions, mirroring kube-proxy's verdicts.
const (
	// Forward load-balances to the given endpoints.
	Forward Action = iota
	// Reject refuses the connection at once: the ServicePort has no usable
	// endpoint anywhere (upstream's REJECT, ICMP port unreachable).
	Reject
	// Drop discards it: traffic policy Local and no endpoint on this node.
	Drop
)

// String returns the verdict's name as kube-proxy's tests spell it.
func (a Action) String() string {
	switch a {
	case Reject:
		return "REJECT"
	case Drop:
		return "DROP"
	}
	return "FORWARD"
}

// Service is one ServicePort together with its endpoints and the selection
// made for this node. It is immutable once published in a State: the change
// tracker replaces it rather than changing it.
type Service struct {
	Port *ServicePort
	// Endpoints are all endpoints of the port, merged from every
	// EndpointSlice, deduplicated and sorted by address and port.
	Endpoints []Endpoint
	Selection Selection
}

// Internal is the verdict for traffic to the ClusterIP.
func (s *Service) Internal() (Action, []Endpoint) {
	return s.dispatch(s.Port.InternalPolicy)
}

// External is the verdict for traffic from outside the cluster to a
// NodePort, ExternalIP or LoadBalancer IP. Traffic from pods and from the
// node itself is short-circuited to the cluster endpoints instead
// (ShortCircuit).
func (s *Service) External() (Action, []Endpoint) {
	return s.dispatch(s.Port.ExternalPolicy)
}

// ShortCircuit is the verdict for traffic from a pod or from the node
// itself to an external frontend: kube-proxy sends it to the cluster
// endpoints whatever the external policy, so it never drops for want of a
// local endpoint.
func (s *Service) ShortCircuit() (Action, []Endpoint) {
	return s.dispatch(PolicyCluster)
}

func (s *Service) dispatch(p TrafficPolicy) (Action, []Endpoint) {
	if !s.Selection.HasAny {
		return Reject, nil
	}
	eps := s.Selection.Cluster
	if p == PolicyLocal {
		eps = s.Selection.Local
	}
	if len(eps) == 0 {
		return Drop, nil
	}
	return Forward, eps
}

// State is the whole desired state of one node's proxy.
type State struct {
	Node     Node
	Services map[ServicePortName]*Service
}

// ChangeSet names the ServicePorts whose Service or endpoints changed
// since the previous sync; a ServicePort in it may be absent from the new
// State, meaning it was deleted.
type ChangeSet map[ServicePortName]struct{}

// Update is what one sync hands a dataplane.
type Update struct {
	State *State
	// Changed are the ServicePorts to rewrite. When Full is set the
	// dataplane must reconcile every ServicePort instead.
	Changed ChangeSet
	Full    bool
	// TriggerTimes are the EndpointSlice last-change-trigger-time values
	// covered by this update, for the network programming latency metric.
	TriggerTimes []time.Time
	// ServiceChanges and EndpointChanges count the object changes folded
	// into this update.
	ServiceChanges, EndpointChanges int
}
