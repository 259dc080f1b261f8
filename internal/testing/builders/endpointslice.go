package builders

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// SliceOption changes an EndpointSlice built by EndpointSlice.
type SliceOption = func(*discoveryv1.EndpointSlice)

// EndpointOption changes an endpoint built by Endpoint.
type EndpointOption = func(*discoveryv1.Endpoint)

// EndpointSlice returns the IPv4 EndpointSlice ns/name of Service svc with
// one port "http" 8080/TCP and a copy of the endpoints eps (an empty list,
// never null, as the API server wants it); then opts change it in order.
// Nil options are skipped.
func EndpointSlice(ns, name, svc string, eps []discoveryv1.Endpoint, opts ...SliceOption) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{SlicePort("http", 8080, v1.ProtocolTCP)},
		Endpoints:   append([]discoveryv1.Endpoint{}, eps...),
	}
	for _, o := range opts {
		if o != nil {
			o(es)
		}
	}
	return es
}

// SliceFor returns the EndpointSlice "<name>-1" of svc holding eps, with a
// port of the same name for each port of svc, at its target port.
func SliceFor(svc *v1.Service, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	var ports []discoveryv1.EndpointPort
	for _, p := range svc.Spec.Ports {
		ports = append(ports, SlicePort(p.Name, p.TargetPort.IntVal, p.Protocol))
	}
	return EndpointSlice(svc.Namespace, svc.Name+"-1", svc.Name, eps, SlicePorts(ports...))
}

// SlicePort returns an EndpointSlice port.
func SlicePort(name string, port int32, proto v1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}
}

// SliceAnnotations sets the slice's annotations.
func SliceAnnotations(a map[string]string) SliceOption {
	return func(es *discoveryv1.EndpointSlice) { es.Annotations = a }
}

// SlicePorts replaces the slice's ports with a copy of ports.
func SlicePorts(ports ...discoveryv1.EndpointPort) SliceOption {
	return func(es *discoveryv1.EndpointSlice) { es.Ports = append([]discoveryv1.EndpointPort(nil), ports...) }
}

// Endpoint returns a ready endpoint at ip on node ("" for none); then opts
// change it in order. Nil options are skipped.
func Endpoint(ip, node string, opts ...EndpointOption) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: conditions(true, true, false),
	}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	for _, o := range opts {
		if o != nil {
			o(&ep)
		}
	}
	return ep
}

func conditions(ready, serving, terminating bool) discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)}
}

// Terminating marks an endpoint as a terminating pod that still serves.
func Terminating(ep *discoveryv1.Endpoint) { ep.Conditions = conditions(false, true, true) }

// TerminatingNotServing marks an endpoint as a terminating pod that no
// longer serves.
func TerminatingNotServing(ep *discoveryv1.Endpoint) { ep.Conditions = conditions(false, false, true) }

// NotReady marks an endpoint as a pod that is neither ready nor serving.
func NotReady(ep *discoveryv1.Endpoint) { ep.Conditions = conditions(false, false, false) }

// Zone sets the endpoint's zone.
func Zone(zone string) EndpointOption {
	return func(ep *discoveryv1.Endpoint) { ep.Zone = ptr.To(zone) }
}

// ZoneHints adds zone hints.
func ZoneHints(zones ...string) EndpointOption {
	return func(ep *discoveryv1.Endpoint) {
		if ep.Hints == nil {
			ep.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

// NodeHints adds node hints.
func NodeHints(nodes ...string) EndpointOption {
	return func(ep *discoveryv1.Endpoint) {
		if ep.Hints == nil {
			ep.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			ep.Hints.ForNodes = append(ep.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}
