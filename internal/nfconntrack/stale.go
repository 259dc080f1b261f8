package nfconntrack

import (
	"maps"
	"net/netip"
	"slices"
	"strconv"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// In the iptables and IPVS modes a UDP flow is translated once, by its
// first packet, and the kernel's connection tracking entry keeps that
// translation for as long as the client keeps sending. A resolver that
// keeps one connected socket therefore stays with the endpoint it was first
// given, and a flow that left the node untranslated (sent before its
// Service had an endpoint, or before the Service was programmed at all)
// is never translated. After each sync the fallbacks delete the UDP
// entries that a change of the model made stale, as kube-proxy's conntrack
// reconciler does; the next datagram of the flow is then translated again
// by the rules as they now are.

// Frontend is where a UDP flow was sent: a Service address (ClusterIP,
// ExternalIP or LoadBalancer IP) and the Service port, or, for a NodePort,
// the zero Addr and the NodePort, which every address of the node serves.
type Frontend struct {
	Addr netip.Addr
	Port uint16
}

// IsNodePort reports whether f stands for a NodePort on any node address.
func (f Frontend) IsNodePort() bool { return !f.Addr.IsValid() }

// String returns "addr:port", or "*:port" for a NodePort.
func (f Frontend) String() string {
	if f.IsNodePort() {
		return "*:" + strconv.Itoa(int(f.Port))
	}
	return netip.AddrPortFrom(f.Addr, f.Port).String()
}

// Rule says which flows to one frontend are stale. A flow is judged by
// where its replies come from (the reply direction's source address and
// port): the endpoint its first packet was translated to, or the frontend
// itself when it was not translated.
type Rule struct {
	// Serving are the frontend's serving endpoints after the sync,
	// sorted. When there is any, a flow whose replies come from none of
	// them is stale: its endpoint no longer serves, or it was never
	// translated because the frontend had no endpoint.
	Serving []netip.AddrPort
	// Removed are the endpoints the frontend reached before the sync and
	// no longer does, sorted. Flows to them are stale even when the
	// frontend has no serving endpoint left: without their entries the
	// next datagrams meet the frontend's REJECT or DROP rule rather than
	// going, unanswered, to an endpoint that is gone.
	Removed []netip.AddrPort
}

// Stale holds what one sync made stale, per frontend. Frontends whose
// flows are all still good are absent.
type Stale map[Frontend]Rule

// Diff returns the UDP flows that the change from prev to next makes
// stale, looking at the ServicePorts in names only (a partial sync's
// changed ServicePorts, or every one on a full sync); a ServicePort absent
// from prev (or a nil prev, before the first sync) had no endpoints, and one
// absent from next is gone.
//
// As kube-proxy, it looks at every endpoint that is serving (ready, or
// terminating but still serving), whatever the traffic policies and
// topology choose: a change of those routes new flows elsewhere but must
// not break flows that still reach a serving endpoint. A frontend is stale
// when an endpoint it reached stopped serving it (endpoint removed or no
// longer serving, frontend removed, Service deleted) or when it gained its
// first serving endpoint. Only UDP ServicePorts count: TCP and SCTP flows
// end when their endpoint goes, and their untranslated attempts are
// retried on new connections.
func Diff(prev, next map[model.ServicePortName]*model.Service, names []model.ServicePortName) Stale {
	before := map[Frontend]map[netip.AddrPort]bool{}
	after := map[Frontend]map[netip.AddrPort]bool{}
	for _, n := range names {
		o, c := prev[n], next[n]
		if o == c {
			continue // the same immutable Service: nothing changed
		}
		collect(before, o)
		collect(after, c)
	}
	out := Stale{}
	for f, was := range before {
		now := after[f]
		var removed []netip.AddrPort
		for ep := range was {
			if !now[ep] {
				removed = append(removed, ep)
			}
		}
		if len(removed) > 0 {
			slices.SortFunc(removed, netip.AddrPort.Compare)
			out[f] = Rule{Serving: sorted(now), Removed: removed}
		}
	}
	for f, now := range after {
		if len(now) > 0 && len(before[f]) == 0 {
			out[f] = Rule{Serving: sorted(now)}
		}
	}
	return out
}

// collect adds the serving endpoints of svc's frontends to m, if svc is a
// UDP ServicePort. A frontend of several ServicePorts (a conflict in the
// Services) gets the endpoints of all of them.
func collect(m map[Frontend]map[netip.AddrPort]bool, svc *model.Service) {
	if svc == nil || svc.Port.Name.Protocol != model.UDP {
		return
	}
	sp := svc.Port
	var fronts []Frontend
	if sp.ClusterIP.IsValid() {
		fronts = append(fronts, Frontend{sp.ClusterIP.Unmap(), sp.Port})
	}
	for _, ips := range [][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, a := range ips {
			fronts = append(fronts, Frontend{a.Unmap(), sp.Port})
		}
	}
	if sp.NodePort != 0 {
		fronts = append(fronts, Frontend{Port: sp.NodePort})
	}
	for _, f := range fronts {
		set := m[f]
		if set == nil {
			set = map[netip.AddrPort]bool{}
			m[f] = set
		}
		for i := range svc.Endpoints {
			if ep := &svc.Endpoints[i]; ep.Serving {
				set[netip.AddrPortFrom(ep.Addr.Unmap(), ep.Port)] = true
			}
		}
	}
}

func sorted(set map[netip.AddrPort]bool) []netip.AddrPort {
	if len(set) == 0 {
		return nil
	}
	return slices.SortedFunc(maps.Keys(set), netip.AddrPort.Compare)
}
