// Package dump is `ebpf-proxy dump`: what the pinned BPF maps hold,
// frontend by frontend, joined with the Service names the agent's local
// API (internal/api) gives, and printed as a table, a wide table or JSON.
package dump

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// Report is what `ebpf-proxy dump -o json` prints, a stable schema:
//
//	{
//	  "named": true,                 // Service names came from the agent's API
//	  "node": "node-a",              // the agent's node, when named
//	  "services": [{                 // sorted: named ones by namespace, name, port, protocol; then the others by family and id
//	    "namespace": "default", "name": "web", "port": "http",  // empty when not named
//	    "protocol": "TCP",
//	    "frontends": [{              // every entry of the services map for the ServicePort, by address
//	      "address": "10.96.0.80", "port": 80, "ipFamily": "IPv4",
//	      "kind": "ClusterIP",       // ClusterIP, NodePort, NodePort (localhost), ExternalIP, LoadBalancer
//	      "scope": "external",       // "internal": the entry the node's own sockets use beside an external one
//	      "trafficPolicy": "Cluster", // from the agent, empty when not named
//	      "verdict": "forward",      // forward, reject (no endpoint) or drop (policy Local, none here)
//	      "affinityTimeoutSeconds": 0,
//	      "serviceID": 2, "revNatID": 2, // the maps' ids, numbered per family
//	      "flags": "cluster-ip",     // the master entry's flags as `-o entries` spells them
//	      "count": 2,                // backends in the entry
//	      "backends": [{"address": "10.244.1.3", "port": 8080, "id": 1,
//	                    "state": "ready", // ready, serving, terminating, not-ready (the agent's view); without names: terminating or ready from the map's flag
//	                    "local": true, "missing": false}] // missing: the slot names an id the backends map lacks
//	    }]
//	  }]
//	}
type Report struct {
	Named    bool      `json:"named"`
	Node     string    `json:"node,omitempty"`
	Services []Service `json:"services"`
}

// Service is one ServicePort with its frontends in the maps.
type Service struct {
	Namespace string     `json:"namespace,omitempty"`
	Name      string     `json:"name,omitempty"`
	Port      string     `json:"port,omitempty"`
	Protocol  string     `json:"protocol"`
	Frontends []Frontend `json:"frontends"`
}

// Named reports whether the agent named the ServicePort.
func (s *Service) Named() bool { return s.Name != "" }

// Frontend is one entry of the services map with its backends.
type Frontend struct {
	Address                netip.Addr `json:"address"`
	Port                   uint16     `json:"port"`
	IPFamily               string     `json:"ipFamily"`
	Kind                   string     `json:"kind"`
	Scope                  string     `json:"scope"`
	TrafficPolicy          string     `json:"trafficPolicy,omitempty"`
	Verdict                string     `json:"verdict"`
	AffinityTimeoutSeconds int        `json:"affinityTimeoutSeconds,omitempty"`
	ServiceID              uint32     `json:"serviceID"`
	RevNatID               uint32     `json:"revNatID"`
	Flags                  string     `json:"flags"`
	Count                  int        `json:"count"`
	Backends               []Backend  `json:"backends"`
}

// Backend is a backend a frontend's slot names.
type Backend struct {
	Address netip.Addr `json:"address"`
	Port    uint16     `json:"port"`
	ID      uint32     `json:"id"`
	State   string     `json:"state"`
	Local   bool       `json:"local"`
	Missing bool       `json:"missing,omitempty"`
}

// Family is what the maps of one IP family hold.
type Family struct {
	Name      string // IPv4 or IPv6
	Frontends []maps.FrontendEntry
}

// Scopes.
const (
	ScopeExternal = "external"
	ScopeInternal = "internal"
)

// Verdicts.
const (
	VerdictForward = "forward"
	VerdictReject  = "reject"
	VerdictDrop    = "drop"
)

type feKey struct {
	addr  netip.Addr
	port  uint16
	proto string
}

type groupKey struct {
	ns, name, port, proto string
	family                string
	svcID                 uint32
}

// Join groups the maps' frontends by ServicePort: by the names the agent
// gave (names, nil when no agent answered), matched on the frontend's
// address, port and protocol; a frontend the agent did not name is grouped
// by its family and service id.
func Join(fams []Family, names *api.Services) Report {
	r := Report{Named: names != nil, Services: []Service{}}
	index := map[feKey]*api.ServicePort{}
	if names != nil {
		r.Node = names.Node
		for i := range names.Services {
			sp := &names.Services[i]
			for _, fe := range sp.Frontends {
				index[feKey{fe.Address, fe.Port, sp.Protocol}] = sp
			}
		}
	}
	groups := map[groupKey]*Service{}
	var keys []groupKey
	for _, fam := range fams {
		for _, e := range fam.Frontends {
			proto := e.Frontend.Proto.String()
			sp := index[feKey{e.Frontend.Addr, e.Frontend.Port, proto}]
			k := groupKey{proto: proto, family: fam.Name, svcID: e.SvcID}
			if sp != nil {
				k = groupKey{ns: sp.Namespace, name: sp.Name, port: sp.Port, proto: proto}
			}
			g := groups[k]
			if g == nil {
				g = &Service{Protocol: proto}
				if sp != nil {
					g.Namespace, g.Name, g.Port = sp.Namespace, sp.Name, sp.Port
				}
				groups[k] = g
				keys = append(keys, k)
			}
			g.Frontends = append(g.Frontends, frontend(fam.Name, e, sp))
		}
	}
	slices.SortFunc(keys, func(a, b groupKey) int {
		an, bn := a.name != "", b.name != ""
		if an != bn {
			if an {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.name, b.name), cmp.Compare(a.port, b.port),
			cmp.Compare(a.proto, b.proto), cmp.Compare(a.family, b.family), cmp.Compare(a.svcID, b.svcID))
	})
	for _, k := range keys {
		r.Services = append(r.Services, *groups[k])
	}
	return r
}

// frontend is one map entry, with the agent's view of it where sp is set.
func frontend(family string, e maps.FrontendEntry, sp *api.ServicePort) Frontend {
	f := Frontend{
		Address: e.Frontend.Addr, Port: e.Frontend.Port, IPFamily: family,
		Kind: KindOf(e.Flags), Scope: ScopeExternal, Verdict: VerdictForward,
		AffinityTimeoutSeconds: int(e.AffinityTimeout),
		ServiceID:              e.SvcID, RevNatID: e.RevNatID, Flags: maps.FlagNames(e.Flags),
		Count: e.Count, Backends: []Backend{},
	}
	if e.Frontend.Scope == maps.ScopeInternal {
		f.Scope = ScopeInternal
	}
	switch {
	case e.Flags&maps.FlagReject != 0:
		f.Verdict = VerdictReject
	case e.Flags&maps.FlagDrop != 0:
		f.Verdict = VerdictDrop
	}
	states := map[netip.AddrPort]string{}
	if sp != nil {
		for _, fe := range sp.Frontends {
			if fe.Address == f.Address && fe.Port == f.Port {
				f.TrafficPolicy = fe.TrafficPolicy
				if f.Scope == ScopeInternal {
					// Traffic from the node and its pods is short-circuited
					// to the cluster endpoints whatever the policy.
					f.TrafficPolicy = "Cluster"
				}
			}
		}
		for _, b := range sp.Backends {
			states[netip.AddrPortFrom(b.Address, b.Port)] = b.State
		}
	}
	for _, b := range e.Backends {
		be := Backend{Address: b.Addr, Port: b.Port, ID: b.ID, Local: b.Local(), Missing: b.Missing}
		switch st, ok := states[netip.AddrPortFrom(b.Addr, b.Port)]; {
		case b.Missing:
			be.State = "missing"
		case ok:
			be.State = st
		case b.Terminating():
			be.State = api.StateTerminating
		default:
			be.State = api.StateReady
		}
		f.Backends = append(f.Backends, be)
	}
	return f
}

// KindOf names a frontend's kind (api.KindClusterIP, ...) from the flags
// of its master entry in the services map, "-" for none of them.
func KindOf(flags uint16) string {
	switch {
	case flags&maps.FlagClusterIP != 0:
		return api.KindClusterIP
	case flags&maps.FlagLocalhostNodePort != 0:
		return api.KindLocalNodePort
	case flags&maps.FlagNodePort != 0:
		return api.KindNodePort
	case flags&maps.FlagExternalIP != 0:
		return api.KindExternalIP
	case flags&maps.FlagLoadBalancer != 0:
		return api.KindLoadBalancer
	}
	return "-"
}
