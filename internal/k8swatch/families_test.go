package k8swatch

import (
	"context"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// dualStack makes a Service dual-stack, IPv4 first, as the API server
// stores one created with ipFamilyPolicy PreferDualStack on a dual-stack
// cluster.
func dualStack(v4, v6 string) builders.ServiceOption {
	return func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = v4, []string{v4, v6}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		p := v1.IPFamilyPolicyPreferDualStack
		s.Spec.IPFamilyPolicy = &p
	}
}

func ipv6Slice(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeIPv6 }

// dualStackObjects: "web" dual-stack with a slice of each family and an
// externalIP that is not an address; "v6only" single-stack IPv6; the own
// Node with an address of each family.
func dualStackObjects() []runtime.Object {
	return []runtime.Object{
		builders.Service("ns", "web", dualStack("10.96.0.10", "fd00:10:96::10"), func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"bogus"}
		}),
		builders.EndpointSlice("ns", "web-v4", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")}),
		builders.EndpointSlice("ns", "web-v6", "web", []discoveryv1.Endpoint{builders.Endpoint("fd00:10:244:1::1", "node-a")}, ipv6Slice),
		builders.Service("ns", "v6only", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00:10:96::11", []string{"fd00:10:96::11"}
			s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
		}),
		builders.EndpointSlice("ns", "v6only-1", "v6only", []discoveryv1.Endpoint{builders.Endpoint("fd00:10:244:2::1", "node-b")}, ipv6Slice),
		&v1.Node{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "192.168.77.10"},
				{Type: v1.NodeInternalIP, Address: "fd00:192:168:77::10"},
			}},
		},
	}
}

var (
	dualWebV4  = "ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a] internal=FORWARD[10.244.1.1:8080 @node-a]"
	dualWebV6  = "ns/web:http/TCP fd00:10:96::10:80 eps=[[fd00:10:244:1::1]:8080 @node-a] internal=FORWARD[[fd00:10:244:1::1]:8080 @node-a]"
	dualV6Only = "ns/v6only:http/TCP fd00:10:96::11:80 eps=[[fd00:10:244:2::1]:8080 @node-b] internal=FORWARD[[fd00:10:244:2::1]:8080 @node-b]"
	dualReport = []string{`Service ns/web: invalid externalIP: "bogus" is not an IP address; skipped`}
)

// TestWatchDualStack checks kube-proxy's per-family view through one
// watch: each family's tracker gets the Services' addresses of its family
// and the EndpointSlices of its address type, a problem both families meet
// is reported once, and a change to one family's slice is a change to that
// family only.
func TestWatchDualStack(t *testing.T) {
	client := fake.NewClientset(dualStackObjects()...)
	tr4 := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	tr6 := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var r reports
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, fakeSource{client}, "node-a", []Target{{Family: v1.IPv4Protocol, Tracker: tr4}, {Family: v1.IPv6Protocol, Tracker: tr6}},
			WatchOptions{Invalid: r.fn})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})

	waitSynced(t, tr4)
	waitSynced(t, tr6)
	checkLines(t, "IPv4 state", describe(tr4.Apply().State), []string{dualWebV4})
	checkLines(t, "IPv6 state", describe(tr6.Apply().State), []string{dualV6Only, dualWebV6})
	checkReports(t, r.take(), dualReport)
	for _, c := range []struct {
		tr   *tracker.Tracker
		addr string
	}{{tr4, "192.168.77.10"}, {tr6, "fd00:192:168:77::10"}} {
		st, _ := waitFor(t, c.tr, "the Node", func(st *model.State) bool { return len(st.Node.Addrs) > 0 })
		if len(st.Node.Addrs) != 1 || st.Node.Addrs[0].String() != c.addr {
			t.Errorf("node addresses %v, want [%s]", st.Node.Addrs, c.addr)
		}
	}

	// The IPv6 slice of web loses its endpoint: IPv6 web refuses, IPv4 web
	// is not touched.
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, builders.EndpointSlice("ns", "web-v6", "web", nil, ipv6Slice), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	st6, changed6 := waitFor(t, tr6, "IPv6 web without endpoints", func(st *model.State) bool {
		s := st.Services[spn("ns", "web", "http", model.TCP)]
		return s != nil && len(s.Endpoints) == 0
	})
	checkLines(t, "IPv6 state after the IPv6 slice emptied", describe(st6), []string{dualV6Only, "ns/web:http/TCP fd00:10:96::10:80 eps=[] internal=REJECT[]"})
	if len(changed6) != 1 {
		t.Errorf("IPv6 changes %v, want web only", changed6)
	}
	if up := tr4.Apply(); len(up.Changed) != 0 {
		t.Errorf("an IPv6 slice changed IPv4 ServicePorts %v", up.Changed)
	}

	// web becomes IPv4 single-stack: it leaves the IPv6 view only.
	if _, err := client.CoreV1().Services("ns").Update(ctx, builders.Service("ns", "web"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	st6, _ = waitFor(t, tr6, "web gone from IPv6", func(st *model.State) bool {
		return st.Services[spn("ns", "web", "http", model.TCP)] == nil
	})
	checkLines(t, "IPv6 state after web became IPv4 only", describe(st6), []string{dualV6Only})
	checkLines(t, "IPv4 state after web became IPv4 only", describe(tr4.Apply().State), []string{dualWebV4})
}

// TestManifestsDualStack checks the same per-family view from the
// manifests directory.
func TestManifestsDualStack(t *testing.T) {
	dir := t.TempDir()
	if err := builders.WriteManifest(dir, "cluster.yaml", dualStackObjects()...); err != nil {
		t.Fatal(err)
	}
	tr4 := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	tr6 := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var r reports
	m, err := NewManifests(dir, "node-a", []Target{{Family: v1.IPv6Protocol, Tracker: tr6}, {Family: v1.IPv4Protocol, Tracker: tr4}},
		ManifestOptions{Invalid: r.fn})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	if !tr4.Synced() || !tr6.Synced() {
		t.Fatal("a family's tracker is not synced after the first read")
	}
	up4, up6 := tr4.Apply(), tr6.Apply()
	checkLines(t, "IPv4 state", describe(up4.State), []string{dualWebV4})
	checkLines(t, "IPv6 state", describe(up6.State), []string{dualV6Only, dualWebV6})
	if a := up6.State.Node.Addrs; len(a) != 1 || a[0].String() != "fd00:192:168:77::10" {
		t.Errorf("IPv6 node addresses %v", a)
	}
	checkReports(t, r.take(), dualReport)
}

// TestTargetsChecked checks that a source refuses targets it cannot serve.
func TestTargetsChecked(t *testing.T) {
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	for name, targets := range map[string][]Target{
		"none":           nil,
		"family twice":   {{Tracker: tr}, {Family: v1.IPv4Protocol, Tracker: tr}},
		"unknown family": {{Family: "IPv5", Tracker: tr}},
		"no tracker":     {{Family: v1.IPv6Protocol}},
	} {
		if _, err := NewManifests(t.TempDir(), "node-a", targets, ManifestOptions{}); err == nil {
			t.Errorf("%s: NewManifests accepted %v", name, targets)
		}
		if err := Watch(t.Context(), fakeSource{fake.NewClientset()}, "node-a", targets, WatchOptions{}); err == nil {
			t.Errorf("%s: Watch accepted %v", name, targets)
		}
	}
}

// TestNodeFamilies checks kube-proxy's reading of a Node's families:
// InternalIPs before ExternalIPs, the first one's family primary.
func TestNodeFamilies(t *testing.T) {
	addr := func(typ v1.NodeAddressType, a string) v1.NodeAddress { return v1.NodeAddress{Type: typ, Address: a} }
	for _, tc := range []struct {
		name  string
		addrs []v1.NodeAddress
		want  []v1.IPFamily
	}{
		{"no address", nil, nil},
		{"IPv4", []v1.NodeAddress{addr(v1.NodeInternalIP, "192.168.77.10"), addr(v1.NodeHostName, "node-a")}, []v1.IPFamily{v1.IPv4Protocol}},
		{"IPv6 primary", []v1.NodeAddress{addr(v1.NodeInternalIP, "fd00::10"), addr(v1.NodeInternalIP, "192.168.77.10")},
			[]v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}},
		{"an InternalIP before an earlier ExternalIP", []v1.NodeAddress{addr(v1.NodeExternalIP, "fd00::10"), addr(v1.NodeInternalIP, "192.168.77.10")},
			[]v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}},
		{"an address that does not parse", []v1.NodeAddress{addr(v1.NodeInternalIP, "bogus"), addr(v1.NodeInternalIP, "fd00::10")},
			[]v1.IPFamily{v1.IPv6Protocol}},
	} {
		n := &v1.Node{Status: v1.NodeStatus{Addresses: tc.addrs}}
		if got := NodeFamilies(n); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
