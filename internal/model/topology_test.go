package model_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

const thisNode = "node-a"

func makeService(name string, tweak ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	for _, t := range tweak {
		t(svc)
	}
	return svc
}

// epSpec is one endpoint: "10.244.1.1 node-a ready zone=z1 hints=z1,z2 nodehints=node-a".
type epSpec string

func makeSlice(svc string, eps ...epSpec) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("p"), Port: ptr[int32](8080), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for _, spec := range eps {
		f := strings.Fields(string(spec))
		ep := discoveryv1.Endpoint{Addresses: []string{f[0]}, NodeName: ptr(f[1])}
		for _, attr := range f[2:] {
			k, v, _ := strings.Cut(attr, "=")
			switch k {
			case "ready":
				ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}
			case "terminating":
				ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
			case "terminating-not-serving":
				ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false), Terminating: ptr(true)}
			case "not-ready":
				ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false), Terminating: ptr(false)}
			case "zone":
				ep.Zone = ptr(v)
			case "hints":
				ep.Hints = addZoneHints(ep.Hints, strings.Split(v, ","))
			case "nodehints":
				if ep.Hints == nil {
					ep.Hints = &discoveryv1.EndpointHints{}
				}
				for _, n := range strings.Split(v, ",") {
					ep.Hints.ForNodes = append(ep.Hints.ForNodes, discoveryv1.ForNode{Name: n})
				}
			default:
				panic("unknown endpoint attribute " + attr)
			}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

func addZoneHints(h *discoveryv1.EndpointHints, zones []string) *discoveryv1.EndpointHints {
	if h == nil {
		h = &discoveryv1.EndpointHints{}
	}
	for _, z := range zones {
		h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: z})
	}
	return h
}

func ptr[T any](v T) *T { return &v }

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

func local(svc *v1.Service) {
	svc.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
}
func nodePort(svc *v1.Service) {
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort = 30080
}
func etpLocal(svc *v1.Service) {
	nodePort(svc)
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
}

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
			svc := makeService("svc")
			if tc.svc != nil {
				tc.svc(svc)
			}
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
	svc := makeService("svc", etpLocal)
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
