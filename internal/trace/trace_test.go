package trace

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

var (
	ap       = netip.MustParseAddrPort
	ip       = netip.MustParseAddr
	nodeIP   = ip("192.0.2.1")
	inside   = ip("10.244.1.3")  // a pod on node-a, also web's local backend
	outside  = ip("198.18.0.10") // a client outside, within ranged's ranges
	stranger = ip("198.18.0.11") // one outside them
)

const (
	eth0     = 2 // ifindex of the device outside clients arrive on
	now      = 1000 * time.Second
	podNetns = 4097 // the pod client's network namespace cookie
)

// programmed writes the scenario's Services with the real Writer into
// fakes, as the agent of node-a would, and returns them.
func programmed(t *testing.T) *maps.Fakes {
	t.Helper()
	node := model.Node{Name: "node-a", Addrs: []netip.Addr{nodeIP}}
	spec, err := model.ParseNodePortSpec(nil, false, true)
	if err != nil {
		t.Fatal(err)
	}
	// The local addresses hold loopback: NodePorts on 127.0.0.1 too.
	node.NodePorts = spec.Resolve(&node, []netip.Addr{nodeIP, ip("127.0.0.1")})
	st := &model.State{Node: node, Services: map[model.ServicePortName]*model.Service{}}
	add := func(name string, proto model.Protocol, clusterIP string, port uint16, eps []model.Endpoint, opts ...func(*model.ServicePort)) {
		sp := builders.ModelServicePort("default", name, proto, ip(clusterIP), port, opts...)
		st.Services[sp.Name] = builders.ModelService(sp, eps, &st.Node)
	}
	here := func(a string) model.Endpoint { return builders.ModelEndpoint(ap(a), "node-a") }
	there := func(a string) model.Endpoint { return builders.ModelEndpoint(ap(a), "node-b") }
	two := []model.Endpoint{here("10.244.1.3:8080"), there("10.244.2.3:8080")}
	nodePort := func(p uint16) func(*model.ServicePort) { return func(sp *model.ServicePort) { sp.NodePort = p } }
	add("web", model.TCP, "10.96.0.80", 80, two, nodePort(30080))
	add("remote", model.TCP, "10.96.0.81", 80, []model.Endpoint{there("10.244.2.4:8080")}, nodePort(30081))
	add("empty", model.TCP, "10.96.0.82", 80, nil, nodePort(30082))
	add("local", model.TCP, "10.96.0.83", 80, []model.Endpoint{there("10.244.2.5:8080")}, nodePort(30083),
		func(sp *model.ServicePort) { sp.ExternalPolicy = model.PolicyLocal })
	add("itp", model.TCP, "10.96.0.84", 80, []model.Endpoint{there("10.244.2.6:8080")},
		func(sp *model.ServicePort) { sp.InternalPolicy = model.PolicyLocal })
	add("ranged", model.TCP, "10.96.0.85", 80, []model.Endpoint{there("10.244.2.7:8080")}, nodePort(30085), func(sp *model.ServicePort) {
		sp.LoadBalancerIPs = []netip.Addr{ip("198.19.0.30")}
		sp.LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(outside, 32)}
	})
	add("sticky", model.TCP, "10.96.0.86", 80, two, nodePort(30086), func(sp *model.ServicePort) { sp.AffinityTimeout = 600 * time.Second })
	add("dns", model.UDP, "10.96.0.10", 53, nil)
	add("maglev", model.TCP, "10.96.0.87", 80, two, nodePort(30087), func(sp *model.ServicePort) { sp.LBAlgorithm = model.LBMaglev })
	f := maps.NewFakes(0, 0, 0)
	w, err := maps.NewWriter(f.Maps(), maps.Limits{Backends: 1000, RevNat: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(model.Update{State: st, Full: true}); err != nil {
		t.Fatal(err)
	}
	return f
}

// ids finds the service and backend ids the Writer gave.
func ids(t *testing.T, f *maps.Fakes, fe netip.AddrPort) (svcID uint32, backends map[netip.Addr]uint32) {
	t.Helper()
	es, err := maps.ReadFrontends(f.Maps())
	if err != nil {
		t.Fatal(err)
	}
	backends = map[netip.Addr]uint32{}
	for _, e := range es {
		if netip.AddrPortFrom(e.Frontend.Addr, e.Frontend.Port) == fe {
			svcID = e.SvcID
			for _, b := range e.Backends {
				backends[b.Addr] = b.ID
			}
		}
	}
	return svcID, backends
}

func pod(addr netip.Addr) Client { return Client{Kind: ClientPod, Addr: addr, NetnsCookie: podNetns} }

func from(addr netip.Addr, port uint16) Client {
	return Client{Kind: ClientExternal, Addr: addr, Port: port, Device: "eth0", Ifindex: eth0}
}

var node = Client{Kind: ClientNode, NetnsCookie: 1}

func TestTrace(t *testing.T) {
	f := programmed(t)
	stickySvc, stickyBackends := ids(t, f, ap("10.96.0.86:80"))
	webSvc, webBackends := ids(t, f, ap("192.0.2.1:30080"))
	for _, tc := range []struct {
		name    string
		client  Client
		to      string
		proto   model.Protocol
		prepare func(p *maps.FakeProgramMaps)
		verdict string
		rule    string
		kind    string
		// check looks at the rest.
		check func(t *testing.T, r *Result)
	}{
		{name: "a pod to a ClusterIP: a random one of its backends, no source NAT", client: pod(inside), to: "10.96.0.80:80",
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindClusterIP, check: func(t *testing.T, r *Result) {
				if len(r.Candidates) != 2 || r.Selection.Method != MethodRandom || r.Selection.Backend != nil || r.SNAT != nil || r.Path != PathSocket {
					t.Errorf("%+v, want a random choice of two over the socket path", r)
				}
			}},
		{name: "a pod to no Service: untouched", client: pod(inside), to: "10.96.0.99:80", verdict: VerdictUntouched, rule: RuleNoFrontend},
		{name: "a pod to loopback: its own", client: pod(inside), to: "127.0.0.1:30080", verdict: VerdictUntouched, rule: RuleLoopback},
		{name: "the node to a localhost NodePort: forward", client: node, to: "127.0.0.1:30080", verdict: VerdictForward,
			rule: RuleEndpoints, kind: api.KindLocalNodePort},
		{name: "no endpoints: reject, ECONNREFUSED", client: pod(inside), to: "10.96.0.82:80", verdict: VerdictReject,
			rule: RuleNoEndpoints, kind: api.KindClusterIP, check: outcome("ECONNREFUSED")},
		{name: "the node's UDP to a Service without endpoints: EPERM", client: node, to: "10.96.0.10:53", proto: model.UDP,
			verdict: VerdictReject, rule: RuleNoEndpoints, kind: api.KindClusterIP, check: outcome("EPERM")},
		{name: "internalTrafficPolicy Local, none here: drop, ETIMEDOUT at once", client: pod(inside), to: "10.96.0.84:80",
			verdict: VerdictDrop, rule: RuleTrafficPolicyLocal, kind: api.KindClusterIP, check: outcome("ETIMEDOUT")},
		{name: "a pod to a NodePort under externalTrafficPolicy Local: its internal entry, short-circuited", client: pod(inside),
			to: "192.0.2.1:30083", verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				if r.Frontend.Scope != "internal" || r.Selection.Backend == nil || r.Selection.Backend.Address != ip("10.244.2.5") {
					t.Errorf("frontend %+v, selection %+v: want the internal entry, to the endpoint on node-b", r.Frontend, r.Selection)
				}
			}},
		{name: "outside, externalTrafficPolicy Local with none here: drop", client: from(outside, 40000), to: "192.0.2.1:30083",
			verdict: VerdictDrop, rule: RuleTrafficPolicyLocal, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				if r.Frontend.Scope != "external" || r.Frontend.TrafficPolicy != "Local" || r.Path != PathTC {
					t.Errorf("frontend %+v, path %s: want the external entry, policy Local, at TC", r.Frontend, r.Path)
				}
			}},
		{name: "outside, no endpoints: reject with an ICMP port unreachable", client: from(outside, 40000), to: "192.0.2.1:30082",
			verdict: VerdictReject, rule: RuleNoEndpoints, kind: api.KindNodePort, check: outcome("ICMP port unreachable")},
		{name: "outside the source ranges: drop", client: from(stranger, 40000), to: "198.19.0.30:80",
			verdict: VerdictDrop, rule: RuleSourceRange, kind: api.KindLoadBalancer},
		{name: "within the source ranges: forward", client: from(outside, 40000), to: "198.19.0.30:80",
			prepare: func(p *maps.FakeProgramMaps) { p.PutSNATAddr(eth0, nodeIP) },
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindLoadBalancer},
		{name: "outside to a ClusterIP: untouched", client: from(outside, 40000), to: "10.96.0.80:80",
			verdict: VerdictUntouched, rule: RuleNotExternal, kind: api.KindClusterIP},
		{name: "outside to a remote backend: source NAT to the device's address", client: from(outside, 40000), to: "192.0.2.1:30081",
			prepare: func(p *maps.FakeProgramMaps) { p.PutSNATAddr(eth0, nodeIP) },
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				if r.SNAT == nil || r.SNAT.Address != nodeIP || r.SNAT.Device != "eth0" || r.Selection.Backend == nil ||
					r.Selection.Backend.Address != ip("10.244.2.4") || r.Candidates[0].SNAT != nodeIP {
					t.Errorf("snat %+v, selection %+v: want 10.244.2.4 under source NAT to %s on eth0", r.SNAT, r.Selection, nodeIP)
				}
			}},
		{name: "outside to a remote backend without a source NAT address: drop", client: from(outside, 40000), to: "192.0.2.1:30081",
			verdict: VerdictDrop, rule: RuleNoSNATAddress, kind: api.KindNodePort},
		{name: "a pod's fresh affinity entry decides", client: pod(inside), to: "10.96.0.86:80",
			prepare: func(p *maps.FakeProgramMaps) {
				p.PutAffinity(netip.Addr{}, podNetns, stickySvc, stickyBackends[ip("10.244.2.3")], uint64(now-5*time.Second))
			},
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindClusterIP, check: func(t *testing.T, r *Result) {
				s := r.Selection
				if s.Method != MethodAffinity || s.Backend == nil || s.Backend.Address != ip("10.244.2.3") || s.AffinityAgeSeconds == nil ||
					*s.AffinityAgeSeconds != 5 || s.AffinityTimeoutSeconds != 600 {
					t.Errorf("selection %+v, want affinity to 10.244.2.3, 5s old", s)
				}
			}},
		{name: "an expired affinity entry: a new random choice", client: pod(inside), to: "10.96.0.86:80",
			prepare: func(p *maps.FakeProgramMaps) {
				p.PutAffinity(netip.Addr{}, podNetns, stickySvc, stickyBackends[ip("10.244.2.3")], 1)
			},
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindClusterIP, check: func(t *testing.T, r *Result) {
				if s := r.Selection; s.Method != MethodRandom || s.Backend != nil || s.AffinityAgeSeconds == nil {
					t.Errorf("selection %+v, want a random choice noting the stale entry's age", s)
				}
			}},
		{name: "an outside client's affinity entry, by address", client: from(outside, 40000), to: "192.0.2.1:30086",
			prepare: func(p *maps.FakeProgramMaps) {
				p.PutAffinity(outside, 0, stickySvc, stickyBackends[ip("10.244.1.3")], uint64(now-time.Second))
			},
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				if s := r.Selection; s.Method != MethodAffinity || s.Backend == nil || s.Backend.Address != ip("10.244.1.3") || r.SNAT != nil {
					t.Errorf("selection %+v, snat %+v: want affinity to the local 10.244.1.3, no source NAT", s, r.SNAT)
				}
			}},
		{name: "Maglev: the table's backend at the flow's hash", client: from(outside, 40000), to: "192.0.2.1:30087",
			prepare: func(p *maps.FakeProgramMaps) { p.PutSNATAddr(eth0, nodeIP) },
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				s := r.Selection
				if s.Method != MethodMaglev || s.MaglevIndex == nil || s.MaglevTableSize != maps.FakeMaglevSize || s.Backend == nil {
					t.Fatalf("selection %+v, want a Maglev slot of %d", s, maps.FakeMaglevSize)
				}
				id := f.Maglev.Tables[r.Frontend.Service.ServiceID][*s.MaglevIndex]
				if s.Backend.ID != id {
					t.Errorf("backend #%d, the table holds #%d at index %d", s.Backend.ID, id, *s.MaglevIndex)
				}
			}},
		{name: "Maglev without a source port: left open", client: from(outside, 0), to: "192.0.2.1:30087",
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				if s := r.Selection; s.Method != MethodMaglev || s.Backend != nil || s.MaglevTableSize != maps.FakeMaglevSize {
					t.Errorf("selection %+v, want a Maglev choice left open", s)
				}
			}},
		{name: "a flow that holds keeps its backend", client: from(outside, 40000), to: "192.0.2.1:30080",
			prepare: func(p *maps.FakeProgramMaps) {
				p.PutFlow(model.TCP, ap("198.18.0.10:40000"), ap("192.0.2.1:30080"), ap("10.244.2.3:8080"), ap("192.0.2.1:61000"),
					webBackends[ip("10.244.2.3")], webSvc, 1100)
			},
			verdict: VerdictForward, rule: RuleExistingFlow, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				if s := r.Selection; s.Method != MethodExistingFlow || s.Backend.Address != ip("10.244.2.3") || r.SNAT == nil ||
					r.SNAT.Port != 61000 || len(r.Flows) != 1 || !r.Flows[0].Holds || r.Flows[0].ExpiresInSeconds != 100 {
					t.Errorf("selection %+v, snat %+v, flows %+v: want the flow's backend and source NAT port", s, r.SNAT, r.Flows)
				}
			}},
		{name: "an expired flow without source NAT: a new choice", client: from(outside, 40000), to: "192.0.2.1:30080",
			prepare: func(p *maps.FakeProgramMaps) {
				p.PutSNATAddr(eth0, nodeIP)
				p.PutFlow(model.TCP, ap("198.18.0.10:40000"), ap("192.0.2.1:30080"), ap("10.244.1.3:8080"), netip.AddrPort{},
					webBackends[ip("10.244.1.3")], webSvc, 900)
			},
			verdict: VerdictForward, rule: RuleEndpoints, kind: api.KindNodePort, check: func(t *testing.T, r *Result) {
				if len(r.Flows) != 1 || r.Flows[0].Holds || r.Selection.Method != MethodRandom {
					t.Errorf("flows %+v, selection %+v: want the expired flow listed, not holding, and a random choice", r.Flows, r.Selection)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := maps.NewFakeProgramMaps()
			if tc.prepare != nil {
				tc.prepare(p)
			}
			proto := tc.proto
			if proto == 0 {
				proto = model.TCP
			}
			r, err := Trace(Input{Client: tc.client, Dest: ap(tc.to), Proto: proto}, Env{Maps: f.Lookups(p), Now: now})
			if err != nil {
				t.Fatal(err)
			}
			kind := ""
			if r.Frontend != nil {
				kind = r.Frontend.Kind
			}
			if r.Verdict != tc.verdict || r.Rule != tc.rule || kind != tc.kind || len(r.Steps) == 0 {
				t.Errorf("%s (%s) at %q, %d steps; want %s (%s) at %q\n%s", r.Verdict, r.Rule, kind, len(r.Steps), tc.verdict, tc.rule, tc.kind, table(t, r))
			}
			if tc.check != nil && !t.Failed() {
				tc.check(t, r)
			}
			if t.Failed() {
				t.Log(table(t, r))
			}
		})
	}
}

func outcome(want string) func(*testing.T, *Result) {
	return func(t *testing.T, r *Result) {
		if !strings.Contains(r.Outcome, want) {
			t.Errorf("outcome %q, want %s", r.Outcome, want)
		}
	}
}

func table(t *testing.T, r *Result) string {
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The names come from the agent's answer: the frontend's Service, its kind
// and policy, and the backends' states; the JSON keeps the documented keys.
func TestTraceNamesAndJSON(t *testing.T) {
	f := programmed(t)
	names := &api.Services{Node: "node-a", Services: []api.ServicePort{{
		Namespace: "default", Name: "web", Port: "http", Protocol: "TCP", IPFamily: "IPv4",
		Frontends: []api.Frontend{{Address: ip("10.96.0.80"), Port: 80, Kind: api.KindClusterIP, TrafficPolicy: "Cluster"}},
		Backends:  []api.Backend{{Address: ip("10.244.1.3"), Port: 8080, State: api.StateServing, Local: true}},
	}}}
	r, err := Trace(Input{Client: pod(inside), Dest: ap("10.96.0.80:80"), Proto: model.TCP}, Env{Maps: f.Lookups(nil), Now: now, Names: names})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Named || r.Node != "node-a" || r.Frontend.Service.String() != "default/web:http" || r.Frontend.TrafficPolicy != "Cluster" {
		t.Errorf("named %v on %q, frontend %+v: want default/web:http, policy Cluster", r.Named, r.Node, r.Frontend)
	}
	states := map[netip.Addr]string{}
	for _, b := range r.Candidates {
		states[b.Address] = b.State
	}
	if states[ip("10.244.1.3")] != api.StateServing || states[ip("10.244.2.3")] != api.StateReady {
		t.Errorf("backend states %v: want the agent's serving for 10.244.1.3, the map's ready for the other", states)
	}
	var b bytes.Buffer
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"named", "node", "client", "destination", "protocol", "ipFamily", "path", "frontend", "verdict", "rule",
		"outcome", "candidates", "selection", "flows", "steps"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q:\n%s", k, b.String())
		}
	}
	if out := table(t, r); !strings.Contains(out, "default/web:http ClusterIP, policy Cluster") || !strings.Contains(out, "VERDICT      forward (endpoints)") {
		t.Errorf("table:\n%s", out)
	}
	if _, err := Trace(Input{Client: pod(inside), Dest: ap("[fd00::1]:80"), Proto: model.TCP}, Env{Maps: f.Lookups(nil)}); err == nil {
		t.Errorf("an IPv6 destination traced over the IPv4 maps")
	}
}
