package model_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

const thisNode = "node-a"

// epSpec is one endpoint: "10.244.1.1 node-a ready zone=z1 hints=z1,z2 nodehints=node-a".
type epSpec string

// makeSlice builds the EndpointSlice of Service ns/svc from endpoint specs.
func makeSlice(svc string, eps ...epSpec) *discoveryv1.EndpointSlice {
	var out []discoveryv1.Endpoint
	for _, spec := range eps {
		f := strings.Fields(string(spec))
		var opts []builders.EndpointOption
		for _, attr := range f[2:] {
			k, v, _ := strings.Cut(attr, "=")
			switch k {
			case "ready":
			case "terminating":
				opts = append(opts, builders.Terminating)
			case "terminating-not-serving":
				opts = append(opts, builders.TerminatingNotServing)
			case "not-ready":
				opts = append(opts, builders.NotReady)
			case "zone":
				opts = append(opts, builders.Zone(v))
			case "hints":
				opts = append(opts, builders.ZoneHints(strings.Split(v, ",")...))
			case "nodehints":
				opts = append(opts, builders.NodeHints(strings.Split(v, ",")...))
			default:
				panic("unknown endpoint attribute " + attr)
			}
		}
		out = append(out, builders.Endpoint(f[0], f[1], opts...))
	}
	return builders.EndpointSlice("ns", svc+"-1", svc, out)
}

// selectFor runs the objects through the translator and the tracker, as
// the agent does, and returns the one ServicePort's entry.
func selectFor(t *testing.T, zone string, svc *v1.Service, es *discoveryv1.EndpointSlice) *model.Service {
	t.Helper()
	var tl k8swatch.Translator
	tl.Invalid = func(kind, ns, name, reason string) { t.Fatalf("invalid %s %s/%s: %s", kind, ns, name, reason) }
	tr := tracker.New(thisNode, model.DefaultOptions, model.NodePortSpec{})
	tr.UpdateNode(model.Node{Name: thisNode, Zone: zone})
	tr.UpdateService(k8swatch.ServiceName(svc), tl.ServicePorts(svc))
	if es != nil {
		tr.UpdateEndpointSlice(tl.EndpointSlice(es))
	}
	st := tr.Apply().State
	if len(st.Services) != 1 {
		t.Fatalf("%d service ports, want 1", len(st.Services))
	}
	for _, s := range st.Services {
		return s
	}
	return nil
}

func ips(eps []model.Endpoint) string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Addr.String())
	}
	return strings.Join(out, ",")
}

func verdict(a model.Action, eps []model.Endpoint) string {
	if a != model.Forward {
		return a.String()
	}
	return ips(eps)
}

var (
	local    = builders.InternalLocal()
	nodePort = builders.NodePort(30080)
	etpLocal = func(svc *v1.Service) {
		nodePort(svc)
		builders.ExternalLocal(0)(svc)
	}
)

func TestEndpointSelection(t *testing.T) {
	for _, tc := range []struct {
		name     string
		zone     string
		svc      func(*v1.Service)
		eps      []epSpec
		internal string // verdict for ClusterIP traffic
		external string // verdict for external traffic ("" when not externally accessible)
		shortCut string // verdict for pods and the node reaching an external frontend
	}{{
		name:     "no endpoints: every frontend rejects",
		svc:      nodePort,
		internal: "REJECT", external: "REJECT", shortCut: "REJECT",
	}, {
		name:     "ready endpoints only; not-ready and non-serving terminating ones are never used",
		eps:      []epSpec{"10.0.0.1 node-a ready", "10.0.0.2 node-b ready", "10.0.0.3 node-b not-ready", "10.0.0.4 node-b terminating-not-serving"},
		internal: "10.0.0.1,10.0.0.2",
	}, {
		name:     "ready endpoints win over serving-terminating ones",
		eps:      []epSpec{"10.0.0.1 node-a terminating", "10.0.0.2 node-b ready"},
		internal: "10.0.0.2",
	}, {
		name:     "no ready endpoint: fall back to serving-terminating ones",
		eps:      []epSpec{"10.0.0.1 node-a terminating", "10.0.0.2 node-b terminating", "10.0.0.3 node-b not-ready"},
		internal: "10.0.0.1,10.0.0.2",
	}, {
		name:     "only not-ready endpoints: reject",
		eps:      []epSpec{"10.0.0.3 node-b not-ready", "10.0.0.4 node-b terminating-not-serving"},
		internal: "REJECT",
	}, {
		name:     "internalTrafficPolicy=Local uses this node's endpoints",
		svc:      local,
		eps:      []epSpec{"10.0.0.1 node-a ready", "10.0.0.2 node-b ready"},
		internal: "10.0.0.1",
	}, {
		name:     "internalTrafficPolicy=Local without a local endpoint drops",
		svc:      local,
		eps:      []epSpec{"10.0.0.2 node-b ready"},
		internal: "DROP",
	}, {
		name:     "internalTrafficPolicy=Local falls back to local serving-terminating endpoints",
		svc:      local,
		eps:      []epSpec{"10.0.0.1 node-a terminating", "10.0.0.2 node-b ready"},
		internal: "10.0.0.1",
	}, {
		name:     "internalTrafficPolicy=Local with no endpoint anywhere rejects",
		svc:      local,
		eps:      []epSpec{"10.0.0.1 node-a not-ready"},
		internal: "REJECT",
	}, {
		name:     "externalTrafficPolicy=Cluster: external traffic to every endpoint",
		svc:      nodePort,
		eps:      []epSpec{"10.0.0.1 node-a ready", "10.0.0.2 node-b ready"},
		internal: "10.0.0.1,10.0.0.2", external: "10.0.0.1,10.0.0.2", shortCut: "10.0.0.1,10.0.0.2",
	}, {
		name:     "externalTrafficPolicy=Local: external traffic to local endpoints, pods short-circuit to all",
		svc:      etpLocal,
		eps:      []epSpec{"10.0.0.1 node-a ready", "10.0.0.2 node-b ready"},
		internal: "10.0.0.1,10.0.0.2", external: "10.0.0.1", shortCut: "10.0.0.1,10.0.0.2",
	}, {
		name:     "externalTrafficPolicy=Local without a local endpoint drops external traffic only",
		svc:      etpLocal,
		eps:      []epSpec{"10.0.0.2 node-b ready"},
		internal: "10.0.0.2", external: "DROP", shortCut: "10.0.0.2",
	}, {
		name:     "zone hints: all ready endpoints hinted, one for this zone",
		zone:     "z1",
		eps:      []epSpec{"10.0.0.1 node-b ready zone=z1 hints=z1", "10.0.0.2 node-c ready zone=z2 hints=z2", "10.0.0.3 node-c ready zone=z1 hints=z1"},
		internal: "10.0.0.1,10.0.0.3",
	}, {
		name:     "zone hints ignored when one ready endpoint has none",
		zone:     "z1",
		eps:      []epSpec{"10.0.0.1 node-b ready zone=z1 hints=z1", "10.0.0.2 node-c ready zone=z2"},
		internal: "10.0.0.1,10.0.0.2",
	}, {
		name:     "zone hints ignored when none is for this zone",
		zone:     "z3",
		eps:      []epSpec{"10.0.0.1 node-b ready hints=z1", "10.0.0.2 node-c ready hints=z2"},
		internal: "10.0.0.1,10.0.0.2",
	}, {
		name:     "zone hints ignored when the node has no zone label",
		eps:      []epSpec{"10.0.0.1 node-b ready hints=z1", "10.0.0.2 node-c ready hints=z2"},
		internal: "10.0.0.1,10.0.0.2",
	}, {
		name:     "node hints win over zone hints",
		zone:     "z1",
		eps:      []epSpec{"10.0.0.1 node-a ready hints=z1 nodehints=node-a", "10.0.0.2 node-b ready hints=z1 nodehints=node-b"},
		internal: "10.0.0.1",
	}, {
		name:     "hints are not applied to local endpoints",
		zone:     "z1",
		svc:      local,
		eps:      []epSpec{"10.0.0.1 node-a ready hints=z2", "10.0.0.2 node-b ready hints=z1"},
		internal: "10.0.0.1",
	}, {
		name:     "hints only among ready endpoints; the fallback ignores them",
		zone:     "z1",
		eps:      []epSpec{"10.0.0.1 node-b terminating hints=z2", "10.0.0.2 node-c terminating hints=z2"},
		internal: "10.0.0.1,10.0.0.2",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := builders.Service("ns", "svc", tc.svc)
			var es *discoveryv1.EndpointSlice
			if len(tc.eps) > 0 {
				es = makeSlice("svc", tc.eps...)
			}
			s := selectFor(t, tc.zone, svc, es)
			if got := verdict(s.Internal()); got != tc.internal {
				t.Errorf("ClusterIP traffic: %s, want %s", got, tc.internal)
			}
			if tc.external != "" {
				if got := verdict(s.External()); got != tc.external {
					t.Errorf("external traffic: %s, want %s", got, tc.external)
				}
				if got := verdict(s.ShortCircuit()); got != tc.shortCut {
					t.Errorf("short-circuited traffic: %s, want %s", got, tc.shortCut)
				}
			}
		})
	}
}

func TestLocalReadyCountsOnlyReadyLocalEndpoints(t *testing.T) {
	svc := builders.Service("ns", "svc", etpLocal)
	s := selectFor(t, "", svc, makeSlice("svc",
		"10.0.0.1 node-a ready", "10.0.0.2 node-a terminating", "10.0.0.3 node-b ready", "10.0.0.4 node-a ready"))
	if s.Selection.LocalReady != 2 {
		t.Errorf("LocalReady = %d, want 2", s.Selection.LocalReady)
	}
}

func TestCategorizeIsPureAndStable(t *testing.T) {
	// The same input always gives the same, sorted selection: dataplanes
	// diff against it.
	eps := []model.Endpoint{}
	for i := range 5 {
		eps = append(eps, model.Endpoint{Addr: netip.MustParseAddr(fmt.Sprintf("10.0.0.%d", i+1)), Port: 80, Ready: true, Serving: true, NodeName: "node-b"})
	}
	sp := &model.ServicePort{}
	node := &model.Node{Name: thisNode}
	a := model.Categorize(sp, eps, node, model.DefaultOptions)
	b := model.Categorize(sp, eps, node, model.DefaultOptions)
	if !slices.EqualFunc(a.Cluster, b.Cluster, func(x, y model.Endpoint) bool { return x.String() == y.String() }) {
		t.Errorf("two runs differ: %v and %v", a.Cluster, b.Cluster)
	}
	// The lists may share the input's memory, but appending to them must
	// not write into it.
	if len(a.Cluster) != len(eps) {
		t.Fatalf("Cluster = %v, want all of %v", a.Cluster, eps)
	}
	if cap(a.Cluster) != len(a.Cluster) {
		t.Errorf("the selection can be appended into: cap %d, len %d", cap(a.Cluster), len(a.Cluster))
	}
}
