package maps

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Frontend is one address a Service is reached on, as keyed in the services
// map (without the slot).
type Frontend struct {
	Addr  netip.Addr
	Port  uint16
	Proto model.Protocol
	Scope uint8
}

func (f Frontend) String() string {
	s := fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.Addr, f.Port), f.Proto)
	if f.Scope == ScopeInternal {
		s += " (internal)"
	}
	return s
}

func (f Frontend) key(slot uint16) serviceKey { return serviceKey{f, slot} }

func (f Frontend) compare(o Frontend) int {
	if c := f.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(f.Port, o.Port); c != 0 {
		return c
	}
	if c := cmp.Compare(f.Proto, o.Proto); c != 0 {
		return c
	}
	// Internal first: a frontend's internal entry is written before the
	// external master that announces it (FlagTwoScopes).
	return cmp.Compare(o.Scope, f.Scope)
}

// Backend identifies a backend: the same pod address and port serving two
// Services is one backend.
type Backend struct {
	Addr  netip.Addr
	Port  uint16
	Proto model.Protocol
}

func (b Backend) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(b.Addr, b.Port), b.Proto)
}

// desiredFrontend is what one frontend must hold after a sync.
type desiredFrontend struct {
	fe       Frontend
	owner    model.ServicePortName
	flags    uint16
	affinity uint32
	backends []Backend
	bflags   []uint8
}

// frontendsOf renders the frontends of family fam of one ServicePort on
// node (its
// NodePorts field says where NodePorts are served; its name says which
// endpoints are local). Endpoint selection is the model's: this only maps
// verdicts onto entries.
//
// The ClusterIP has one entry with the internal verdict. A NodePort (on each
// node address; on a loopback one, for the node's sockets only), ExternalIP or LoadBalancer IP has an external-scope entry
// with the external verdict and, when clients on the node get another one
// (kube-proxy short-circuits pods and the node itself to the cluster
// endpoints), an internal-scope entry with it; the socket programs look up
// the internal one. A LoadBalancer IP with source ranges carries them in
// both: the socket programs tag the socket, and an egress program checks
// its packets' source address, known only then.
func frontendsOf(svc *model.Service, node *model.Node, fam family) []desiredFrontend {
	sp := svc.Port
	var out []desiredFrontend
	add := func(addr netip.Addr, port uint16, kind uint16, scope uint8, action model.Action, eps []model.Endpoint) {
		if !fam.holds(addr) || port == 0 {
			return
		}
		out = append(out, render(sp, node.Name, Frontend{Addr: addr, Port: port, Proto: sp.Name.Protocol, Scope: scope}, kind, action, eps, fam))
	}
	a, eps := svc.Internal()
	add(sp.ClusterIP, sp.Port, FlagClusterIP, ScopeExternal, a, eps)

	// Only the ServicePorts with a Maglev table have TC and XDP hash the
	// flow and look the table up.
	var maglev uint16
	if maglevBackends(svc) != nil {
		maglev = FlagMaglev
	}
	external := func(addr netip.Addr, port uint16, kind uint16) {
		kind |= maglev
		ea, eeps := svc.External()
		ia, ieps := svc.ShortCircuit()
		// The TC program keeps the client's address under policy Local
		// and masquerades under Cluster, as kube-proxy does.
		ext := kind
		if sp.ExternalPolicy == model.PolicyLocal {
			ext |= FlagExternalLocal
		}
		if ea == ia && slices.EqualFunc(eeps, ieps, sameEndpoint) {
			add(addr, port, ext, ScopeExternal, ea, eeps)
			return
		}
		add(addr, port, ext|FlagTwoScopes, ScopeExternal, ea, eeps)
		add(addr, port, kind, ScopeInternal, ia, ieps)
	}
	for _, addr := range node.NodePorts.External() {
		external(addr, sp.NodePort, FlagNodePort)
	}
	if node.NodePorts.Localhost && sp.NodePort != 0 {
		// kube-proxy's localhost NodePorts, for the node's own sockets
		// only (the socket programs check), with the verdict traffic
		// from the node gets. The entry is not an external frontend, so
		// that the TC and XDP programs translate nothing sent to
		// 127.0.0.1 from outside (CVE-2020-8558).
		ia, ieps := svc.ShortCircuit()
		add(netip.AddrFrom4([4]byte{127, 0, 0, 1}), sp.NodePort, FlagLocalhostNodePort, ScopeExternal, ia, ieps)
	}
	for _, addr := range sp.ExternalIPs {
		external(addr, sp.Port, FlagExternalIP)
	}
	lbKind := FlagLoadBalancer
	if len(sourceRanges(sp, fam)) > 0 {
		lbKind |= FlagSourceRanges
	}
	for _, addr := range sp.LoadBalancerIPs {
		external(addr, sp.Port, lbKind)
	}
	return out
}

func sameEndpoint(a, b model.Endpoint) bool { return a.AddrPort() == b.AddrPort() }

// render is one entry: the frontend, its kind and scope flags, and the
// verdict with its backends. Endpoints on nodeName are marked local: the TC
// program sends external traffic to the others with source NAT.
func render(sp *model.ServicePort, nodeName string, fe Frontend, flags uint16, action model.Action, eps []model.Endpoint, fam family) desiredFrontend {
	d := desiredFrontend{fe: fe, owner: sp.Name, flags: flags, affinity: uint32(sp.AffinityTimeout.Seconds())}
	switch action {
	case model.Reject:
		d.flags |= FlagReject
	case model.Drop:
		d.flags |= FlagDrop
	default:
		for _, ep := range eps {
			if !fam.holds(ep.Addr) {
				continue
			}
			d.backends = append(d.backends, Backend{Addr: ep.Addr, Port: ep.Port, Proto: sp.Name.Protocol})
			var f uint8
			if ep.Terminating {
				f |= BackendFlagTerminating
			}
			if nodeName != "" && ep.NodeName == nodeName {
				f |= BackendFlagLocal
			}
			d.bflags = append(d.bflags, f)
		}
	}
	return d
}

func sortFrontends(ds []desiredFrontend) {
	slices.SortFunc(ds, func(a, b desiredFrontend) int { return a.fe.compare(b.fe) })
}
