// Package trace is `ebpf-proxy trace`: what the BPF datapath will do with a
// connection from a given client to a given destination, and why, decided
// by reading the pinned maps key by key in the order the programs read them
// (bpf/sock.c for clients on the node, bpf/lib/nodeport.h for clients
// outside that arrive on a device), and named by the agent's local API.
//
// Trace models the first packet of a new connection (a TCP SYN, or a UDP
// datagram); with a source port it also looks up the flow's existing
// connection tracking entry, which such a packet would follow.
package trace

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Client kinds.
const (
	// ClientPod is a pod on this node: its sockets meet the socket hooks.
	ClientPod = "pod"
	// ClientNode is the node's own network namespace: socket hooks too.
	ClientNode = "node"
	// ClientExternal is a client outside the node whose packets arrive
	// on a device: the TC (and XDP) programs.
	ClientExternal = "external"
)

// Paths: which programs decide.
const (
	PathSocket = "socket"
	PathTC     = "tc"
)

// Verdicts.
const (
	VerdictForward   = "forward"
	VerdictReject    = "reject"
	VerdictDrop      = "drop"
	VerdictUntouched = "untouched"
)

// Rules: what decided the verdict.
const (
	// RuleNoFrontend: no entry of the services map for the destination.
	RuleNoFrontend = "no-frontend"
	// RuleNotExternal: a frontend, but none the TC programs serve (a
	// ClusterIP reached from outside the node).
	RuleNotExternal = "not-an-external-frontend"
	// RuleLoopback: a loopback address from a pod, whose loopback is its
	// own (localhost NodePorts are the node's only).
	RuleLoopback = "loopback-of-a-pod"
	// RuleTrafficPolicyLocal: policy Local and no endpoint on this node.
	RuleTrafficPolicyLocal = "traffic-policy-local"
	// RuleNoEndpoints: no usable endpoint anywhere.
	RuleNoEndpoints = "no-endpoints"
	// RuleSourceRange: the client is outside loadBalancerSourceRanges.
	RuleSourceRange = "source-range"
	// RuleExistingFlow: the flow's connection tracking entry holds.
	RuleExistingFlow = "existing-flow"
	// RuleEndpoints: forwarded to the frontend's endpoints.
	RuleEndpoints = "endpoints"
	// RuleInconsistentMaps: a slot or backend the programs need is
	// missing (the writer's order should make this impossible).
	RuleInconsistentMaps = "inconsistent-maps"
	// RuleNoSNATAddress: a remote backend, but no source NAT address for
	// the device toward it or the one the packet came in on.
	RuleNoSNATAddress = "no-source-nat-address"
)

// Selection methods.
const (
	MethodExistingFlow = "existing-flow"
	MethodAffinity     = "affinity"
	MethodMaglev       = "maglev"
	MethodRandom       = "random"
)

// Client is who sends.
type Client struct {
	// Kind is ClientPod, ClientNode or ClientExternal.
	Kind string
	// Addr is the client's address: a pod's IP, or the external source;
	// invalid when unknown (a network namespace given alone).
	Addr netip.Addr
	// Port is the source port, 0 when unknown.
	Port uint16
	// NetnsCookie is the cookie of the client's network namespace (pods
	// and the node), 0 when unknown.
	NetnsCookie uint64
	// Device and Ifindex are the device an external client's packets
	// arrive on.
	Device  string
	Ifindex int
}

// Input is what to trace.
type Input struct {
	Client Client
	Dest   netip.AddrPort
	Proto  model.Protocol
}

// Env is what trace reads.
type Env struct {
	// Maps reads the maps of the destination's family.
	Maps *maps.Lookups
	// Now is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
	Now time.Duration
	// Names is the agent's answer, nil when no agent answered.
	Names *api.Services
	// Route returns the ifindex and name of the device the node sends
	// packets to dst out of (what bpf_fib_lookup answers); nil or an
	// error: unknown.
	Route func(dst netip.Addr) (int, string, error)
	// Flows lists the client-side conntrack entries of the client's
	// flows to the destination (used when the source port is unknown);
	// nil: not looked up.
	Flows func(client netip.Addr, dest netip.AddrPort, proto model.Protocol) ([]maps.CTEntry, error)
}

// Result is what `ebpf-proxy trace -o json` prints, a stable schema:
//
//	{
//	  "named": true, "node": "node-a",  // Service names came from the agent's API
//	  "client": {"kind": "pod", "address": "10.244.0.5", "port": 0, "netnsCookie": 4097, "device": ""},
//	  "destination": "10.96.0.80:80", "protocol": "TCP", "ipFamily": "IPv4",
//	  "path": "socket",                 // socket: the cgroup socket hooks (pods, the node); tc: TC/XDP on the device
//	  "frontend": {                     // the services map's entry that matched; absent when none did
//	    "address": "10.96.0.80", "port": 80,
//	    "kind": "ClusterIP",            // ClusterIP, NodePort, NodePort (localhost), ExternalIP, LoadBalancer
//	    "scope": "external",            // internal: the entry for the node's own clients beside an external one
//	    "trafficPolicy": "Cluster",     // the agent's, empty without names (Local when the map says so)
//	    "service": {"namespace": "default", "name": "web", "port": "http", "serviceID": 2},
//	    "flags": "cluster-ip", "count": 2, "affinityTimeoutSeconds": 0
//	  },
//	  "verdict": "forward",             // forward, reject, drop, untouched
//	  "rule": "endpoints",              // no-frontend, not-an-external-frontend, loopback-of-a-pod, traffic-policy-local,
//	                                    // no-endpoints, source-range, existing-flow, endpoints, inconsistent-maps, no-source-nat-address
//	  "outcome": "...",                 // what the client sees, in words
//	  "candidates": [{"address": "10.244.0.7", "port": 8080, "id": 1, "slot": 1, "local": true,
//	                  "state": "ready",  // the agent's; without names: ready or terminating from the map's flags
//	                  "snat": "192.168.77.10"}], // (tc) the source NAT address a flow to it gets; empty: the client's address is kept
//	  "selection": {                    // how the backend is chosen; absent unless forwarded
//	    "method": "affinity",           // existing-flow, affinity, maglev, random
//	    "backend": {...},               // the chosen candidate; absent when the choice is random
//	    "affinityAgeSeconds": 3.2, "affinityTimeoutSeconds": 10800, // with an affinity entry
//	    "maglevIndex": 77, "maglevTableSize": 16381,               // with a Maglev table and a known source port
//	    "note": "..."
//	  },
//	  "snat": {"address": "192.168.77.10", "port": 61003, "device": "eth0"}, // source NAT of the chosen backend (port: of an existing flow); absent: none
//	  "flows": [{"client": "198.18.0.2:40112", "backend": "10.244.1.3:8080", "snat": "192.168.77.10:61003",
//	             "backendID": 3, "flags": "snat", "expiresInSeconds": 7430, "holds": true}], // existing conntrack entries (tc)
//	  "steps": [{"check": "services map: 10.96.0.80:80/TCP, slot 0", "result": "..."}] // the lookups in the programs' order
//	}
type Result struct {
	Named       bool           `json:"named"`
	Node        string         `json:"node,omitempty"`
	Client      ClientInfo     `json:"client"`
	Destination netip.AddrPort `json:"destination"`
	Protocol    string         `json:"protocol"`
	IPFamily    string         `json:"ipFamily"`
	Path        string         `json:"path"`
	Frontend    *Frontend      `json:"frontend,omitempty"`
	Verdict     string         `json:"verdict"`
	Rule        string         `json:"rule"`
	Outcome     string         `json:"outcome"`
	Candidates  []Backend      `json:"candidates"`
	Selection   *Selection     `json:"selection,omitempty"`
	SNAT        *SNAT          `json:"snat,omitempty"`
	Flows       []Flow         `json:"flows"`
	Steps       []Step         `json:"steps"`
}

// ClientInfo is the client as traced.
type ClientInfo struct {
	Kind        string     `json:"kind"`
	Address     netip.Addr `json:"address,omitzero"`
	Port        uint16     `json:"port,omitempty"`
	NetnsCookie uint64     `json:"netnsCookie,omitempty"`
	Device      string     `json:"device,omitempty"`
}

// Frontend is the services map's entry that matched.
type Frontend struct {
	Address                netip.Addr      `json:"address"`
	Port                   uint16          `json:"port"`
	Kind                   string          `json:"kind"`
	Scope                  string          `json:"scope"`
	TrafficPolicy          string          `json:"trafficPolicy,omitempty"`
	Service                dump.ServiceRef `json:"service"`
	Flags                  string          `json:"flags"`
	Count                  int             `json:"count"`
	AffinityTimeoutSeconds int             `json:"affinityTimeoutSeconds,omitempty"`
}

// Backend is a candidate backend: one of the frontend's slots.
type Backend struct {
	Address netip.Addr `json:"address,omitzero"`
	Port    uint16     `json:"port,omitempty"`
	ID      uint32     `json:"id"`
	Slot    int        `json:"slot"`
	Local   bool       `json:"local"`
	State   string     `json:"state"`
	Missing bool       `json:"missing,omitempty"`
	SNAT    netip.Addr `json:"snat,omitzero"`
}

// AddrPort is the backend's address and port.
func (b Backend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(b.Address, b.Port) }

// Selection is how the backend is chosen.
type Selection struct {
	Method                 string   `json:"method"`
	Backend                *Backend `json:"backend,omitempty"`
	AffinityAgeSeconds     *float64 `json:"affinityAgeSeconds,omitempty"`
	AffinityTimeoutSeconds int      `json:"affinityTimeoutSeconds,omitempty"`
	MaglevIndex            *uint32  `json:"maglevIndex,omitempty"`
	MaglevTableSize        int      `json:"maglevTableSize,omitempty"`
	Note                   string   `json:"note,omitempty"`
}

// SNAT is the source NAT of the flow.
type SNAT struct {
	Address netip.Addr `json:"address"`
	Port    uint16     `json:"port,omitempty"`
	Device  string     `json:"device,omitempty"`
}

// Flow is an existing connection tracking entry of the client's flow.
type Flow struct {
	Client           netip.AddrPort `json:"client"`
	Backend          netip.AddrPort `json:"backend"`
	SNAT             netip.AddrPort `json:"snat,omitzero"`
	BackendID        uint32         `json:"backendID"`
	Flags            string         `json:"flags"`
	ExpiresInSeconds int64          `json:"expiresInSeconds"`
	// Holds says whether a new connection's first packet on the tuple
	// follows the entry (np_orig_valid).
	Holds bool `json:"holds"`
}

// Step is one lookup the programs make and what it found.
type Step struct {
	Check  string `json:"check"`
	Result string `json:"result"`
}

// tracer carries one trace.
type tracer struct {
	in  Input
	env Env
	r   *Result
	sp  *api.ServicePort
}

func (t *tracer) step(check, format string, args ...any) {
	t.r.Steps = append(t.r.Steps, Step{Check: check, Result: fmt.Sprintf(format, args...)})
}

func (t *tracer) verdict(v, rule, outcome string) {
	t.r.Verdict, t.r.Rule, t.r.Outcome = v, rule, outcome
}

// Trace decides what the datapath does with in.
func Trace(in Input, env Env) (*Result, error) {
	in.Dest = netip.AddrPortFrom(in.Dest.Addr().Unmap(), in.Dest.Port())
	fam := "IPv4"
	if in.Dest.Addr().Is6() {
		fam = "IPv6"
	}
	if env.Maps.IPv6() != in.Dest.Addr().Is6() {
		return nil, fmt.Errorf("the maps given are not of the destination's family %s", fam)
	}
	r := &Result{Named: env.Names != nil, Destination: in.Dest, Protocol: in.Proto.String(), IPFamily: fam,
		Candidates: []Backend{}, Flows: []Flow{}, Steps: []Step{},
		Client: ClientInfo{Kind: in.Client.Kind, Address: in.Client.Addr, Port: in.Client.Port, NetnsCookie: in.Client.NetnsCookie,
			Device: in.Client.Device}}
	if env.Names != nil {
		r.Node = env.Names.Node
	}
	t := &tracer{in: in, env: env, r: r}
	var err error
	if in.Client.Kind == ClientExternal {
		r.Path = PathTC
		err = t.external()
	} else {
		r.Path = PathSocket
		err = t.socket()
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// frontend fills r.Frontend from the entry found and names it.
func (t *tracer) frontend(fe maps.Frontend, svc maps.ServiceValue) {
	f := &Frontend{Address: fe.Addr, Port: fe.Port, Kind: dump.KindOf(svc.Flags), Scope: dump.ScopeExternal,
		Service: dump.ServiceRef{ServiceID: svc.SvcId}, Flags: maps.FlagNames(svc.Flags), Count: int(svc.Count),
		AffinityTimeoutSeconds: int(svc.AffinityTimeout)}
	if fe.Scope == maps.ScopeInternal {
		f.Scope = dump.ScopeInternal
	}
	if svc.Flags&maps.FlagExternalLocal != 0 && fe.Scope == maps.ScopeExternal {
		f.TrafficPolicy = "Local"
	}
	if t.env.Names != nil {
		for i := range t.env.Names.Services {
			sp := &t.env.Names.Services[i]
			if sp.Protocol != fe.Proto.String() {
				continue
			}
			for _, afe := range sp.Frontends {
				if afe.Address == fe.Addr && afe.Port == fe.Port {
					t.sp = sp
					f.Kind, f.TrafficPolicy = afe.Kind, afe.TrafficPolicy
					f.Service.Namespace, f.Service.Name, f.Service.Port = sp.Namespace, sp.Name, sp.Port
				}
			}
		}
	}
	t.r.Frontend = f
}

// candidates reads the frontend's slots 1..count and their backends, as
// lb_random_backend would find them.
func (t *tracer) candidates(fe maps.Frontend, svc maps.ServiceValue) error {
	for slot := 1; slot <= int(svc.Count); slot++ {
		id, ok, err := t.env.Maps.Slot(fe, uint16(slot))
		if err != nil {
			return err
		}
		if !ok {
			t.step(fmt.Sprintf("services map: %s, slot %d", fe, slot), "missing (connections that pick it fail: %s)", RuleInconsistentMaps)
			continue
		}
		be, err := t.env.Maps.Backend(id)
		if err != nil {
			return err
		}
		b := Backend{Address: be.Addr, Port: be.Port, ID: id, Slot: slot, Local: be.Local(), Missing: be.Missing, State: api.StateReady}
		if be.Terminating() {
			b.State = api.StateTerminating
		}
		if t.sp != nil {
			for _, ab := range t.sp.Backends {
				if ab.Address == be.Addr && ab.Port == be.Port {
					b.State = ab.State
				}
			}
		}
		t.r.Candidates = append(t.r.Candidates, b)
	}
	desc := make([]string, 0, len(t.r.Candidates))
	for _, b := range t.r.Candidates {
		desc = append(desc, describeBackend(b))
	}
	t.step(fmt.Sprintf("services map: %s, slots 1..%d", fe, svc.Count), "%s", joinOr(desc, "none"))
	return nil
}

func describeBackend(b Backend) string {
	if b.Missing {
		return fmt.Sprintf("#%d missing from the backends map", b.ID)
	}
	s := fmt.Sprintf("%s (#%d, %s", b.AddrPort(), b.ID, b.State)
	if b.Local {
		s += ", local"
	}
	return s + ")"
}

func joinOr(s []string, none string) string {
	if len(s) == 0 {
		return none
	}
	out := s[0]
	for _, x := range s[1:] {
		out += ", " + x
	}
	return out
}

// candidate returns the candidate with backend id, or one read from the
// backends map when no slot names it (an affinity entry or a flow may name
// a backend no longer chosen).
func (t *tracer) candidate(id uint32) (*Backend, error) {
	for i := range t.r.Candidates {
		if t.r.Candidates[i].ID == id {
			b := t.r.Candidates[i]
			return &b, nil
		}
	}
	be, err := t.env.Maps.Backend(id)
	if err != nil {
		return nil, err
	}
	b := &Backend{Address: be.Addr, Port: be.Port, ID: id, Local: be.Local(), Missing: be.Missing, State: api.StateReady}
	if be.Terminating() {
		b.State = api.StateTerminating
	}
	return b, nil
}

// affinity looks up the client's affinity entry as lb_affinity_backend
// does: it holds while younger than the timeout and its backend is still
// a member. Returns the backend it gives, or nil (a new choice follows,
// which the entry then remembers).
func (t *tracer) affinity(svc maps.ServiceValue, e maps.AffinityEntry, found bool, client string) (*Backend, error) {
	check := fmt.Sprintf("affinity map: %s, ServicePort %d", client, svc.SvcId)
	sel := &Selection{Method: MethodAffinity, AffinityTimeoutSeconds: int(svc.AffinityTimeout)}
	t.r.Selection = sel
	if !found {
		t.step(check, "no entry: a new choice, remembered for %ds", svc.AffinityTimeout)
		return nil, nil
	}
	age := (t.env.Now - time.Duration(e.LastUsedNs)).Round(time.Millisecond).Seconds()
	sel.AffinityAgeSeconds = &age
	if t.env.Now-time.Duration(e.LastUsedNs) > time.Duration(svc.AffinityTimeout)*time.Second {
		t.step(check, "backend #%d, last used %.1fs ago, older than the timeout %ds: expired, a new choice", e.BackendID, age, svc.AffinityTimeout)
		return nil, nil
	}
	member, err := t.env.Maps.Member(e.BackendID, svc.SvcId)
	if err != nil {
		return nil, err
	}
	if !member {
		t.step(check, "backend #%d, last used %.1fs ago, no longer one the Service may choose (members map): a new choice", e.BackendID, age)
		return nil, nil
	}
	b, err := t.candidate(e.BackendID)
	if err != nil {
		return nil, err
	}
	if b.Missing {
		t.step(check, "backend #%d, missing from the backends map: a new choice", e.BackendID)
		return nil, nil
	}
	t.step(check, "backend %s, last used %.1fs ago, within the timeout %ds: chosen", b.AddrPort(), age, svc.AffinityTimeout)
	sel.Backend = b
	return b, nil
}

func policyOr(p, def string) string {
	if p == "" {
		return def
	}
	return p
}

// onlyCandidate is the backend of a random choice among one slot, which
// it then names (nil with more slots, or a missing backend).
func (t *tracer) onlyCandidate() *Backend {
	if len(t.r.Candidates) != 1 || t.r.Candidates[0].Missing || t.r.Selection == nil {
		return nil
	}
	b := t.r.Candidates[0]
	t.r.Selection.Backend = &b
	return &b
}
