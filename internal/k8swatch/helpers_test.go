package k8swatch

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// makeService returns a ClusterIP Service as the API server stores it
// (defaults filled in) with one TCP port "http" 80 -> 8080, changed by
// tweak.
func makeService(ns, name string, tweak func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:            v1.ServiceTypeClusterIP,
			ClusterIP:       "10.96.0.10",
			ClusterIPs:      []string{"10.96.0.10"},
			IPFamilies:      []v1.IPFamily{v1.IPv4Protocol},
			SessionAffinity: v1.ServiceAffinityNone,
			Ports: []v1.ServicePort{{
				Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
	if tweak != nil {
		tweak(svc)
	}
	return svc
}

// makeEndpointSlice returns an IPv4 EndpointSlice of Service svc with one
// port "http" 8080/TCP and the given endpoints, changed by tweak.
func makeEndpointSlice(ns, name, svc string, eps []discoveryv1.Endpoint, tweak func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{slicePort("http", 8080, v1.ProtocolTCP)},
		Endpoints:   eps,
	}
	if tweak != nil {
		tweak(es)
	}
	return es
}

func slicePort(name string, port int32, proto v1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}
}

// endpoint returns a ready endpoint on node, changed by tweak.
func endpoint(ip, node string, tweak func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
	}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	if tweak != nil {
		tweak(&ep)
	}
	return ep
}

// terminating marks an endpoint as a terminating pod that still serves.
func terminating(ep *discoveryv1.Endpoint) {
	ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
}

func makeNode(name, zone string, addrs ...v1.NodeAddress) *v1.Node {
	n := &v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     v1.NodeStatus{Addresses: addrs},
	}
	if zone != "" {
		n.Labels = map[string]string{v1.LabelTopologyZone: zone}
	}
	return n
}

// reports collects what an InvalidFunc is told.
type reports struct {
	mu   sync.Mutex
	list []string
}

func (r *reports) fn(kind, namespace, name, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, fmt.Sprintf("%s %s/%s: %s", kind, namespace, name, reason))
}

func (r *reports) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.list
	r.list = nil
	return out
}

// checkReports checks that the reports match the wanted substrings one for
// one, in order.
func checkReports(t *testing.T, got, want []string) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.Contains(got[i], want[i])
	}
	if !ok {
		t.Errorf("reports:\n  got  %q\n  want %q", got, want)
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func spn(ns, name, port string, proto model.Protocol) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

// epStrings renders endpoints as "ip:port" plus the conditions that are not
// the plain ready state, for readable comparisons.
func epStrings(eps []model.Endpoint) []string {
	out := []string{}
	for i := range eps {
		ep := &eps[i]
		s := ep.String()
		switch {
		case ep.Ready && !ep.Terminating:
		case ep.Serving && ep.Terminating:
			s += " serving-terminating"
		case ep.Terminating:
			s += " terminating"
		default:
			s += " not-ready"
		}
		if ep.NodeName != "" {
			s += " @" + ep.NodeName
		}
		out = append(out, s)
	}
	return out
}

// describe renders a State as one sorted line per ServicePort: frontend,
// every endpoint, and the ClusterIP verdict.
func describe(st *model.State) []string {
	out := []string{}
	for name, svc := range st.Services {
		act, eps := svc.Internal()
		out = append(out, fmt.Sprintf("%s %s:%d eps=%v internal=%s%v",
			name, svc.Port.ClusterIP, svc.Port.Port, epStrings(svc.Endpoints), act, epStrings(eps)))
	}
	slices.Sort(out)
	return out
}

func checkLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n  got:\n    %s\n  want:\n    %s", what, strings.Join(got, "\n    "), strings.Join(want, "\n    "))
	}
}

// cacheTombstone wraps obj as an informer does when it missed the delete.
func cacheTombstone(key string, obj any) cache.DeletedFinalStateUnknown {
	return cache.DeletedFinalStateUnknown{Key: key, Obj: obj}
}
