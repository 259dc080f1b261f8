package builders

import (
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// ModelServicePort returns the model's ServicePort of Service ns/name for
// protocol proto (its port unnamed) at clusterIP:port, for tests that start
// below the translator; then opts change it in order.
func ModelServicePort(ns, name string, proto model.Protocol, clusterIP netip.Addr, port uint16, opts ...func(*model.ServicePort)) *model.ServicePort {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Protocol: proto},
		ClusterIP: clusterIP,
		Port:      port,
	}
	for _, o := range opts {
		if o != nil {
			o(sp)
		}
	}
	return sp
}

// ModelEndpoint returns the model's endpoint of a ready pod at ap on node;
// then opts change it in order.
func ModelEndpoint(ap netip.AddrPort, node string, opts ...func(*model.Endpoint)) model.Endpoint {
	e := model.Endpoint{Addr: ap.Addr(), Port: ap.Port(), Ready: true, Serving: true, NodeName: node}
	for _, o := range opts {
		if o != nil {
			o(&e)
		}
	}
	return e
}

// ModelTerminating marks an endpoint as a terminating pod that still
// serves.
func ModelTerminating(e *model.Endpoint) { e.Ready, e.Serving, e.Terminating = false, true, true }

// ModelService returns the State's entry for sp with eps, the endpoints
// selected for node as the tracker selects them.
func ModelService(sp *model.ServicePort, eps []model.Endpoint, node *model.Node) *model.Service {
	return &model.Service{Port: sp, Endpoints: eps, Selection: model.Categorize(sp, eps, node, model.DefaultOptions)}
}
