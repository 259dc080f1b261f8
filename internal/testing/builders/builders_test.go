package builders_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// TestObjectsTranslateAsBuilt: what the builders make is what the agent
// reads, from the API or from a manifests directory, without complaint.
func TestObjectsTranslateAsBuilt(t *testing.T) {
	svc := builders.Service("default", "web", builders.ClusterIP("10.96.0.80"), builders.NodePort(30080), builders.ExternalLocal(0))
	objs := []runtime.Object{
		builders.Node("node-a", builders.NodeZone("z1"), builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.77.11"})),
		svc,
		builders.SliceFor(svc,
			builders.Endpoint("10.244.1.10", "node-a", builders.Zone("z1")),
			builders.Endpoint("10.244.2.10", "node-b", builders.Terminating),
			builders.Endpoint("10.244.2.11", "node-b", builders.NotReady)),
	}
	dir := t.TempDir()
	if err := builders.WriteManifest(dir, "web.yaml", objs...); err != nil {
		t.Fatal(err)
	}
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var invalid []string
	m, err := k8swatch.NewManifests(dir, "node-a", []k8swatch.Target{{Tracker: tr}}, k8swatch.ManifestOptions{Invalid: func(kind, ns, name, reason string) {
		invalid = append(invalid, fmt.Sprintf("%s %s/%s: %s", kind, ns, name, reason))
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	if len(invalid) > 0 {
		t.Fatalf("the agent complains:\n%s", strings.Join(invalid, "\n"))
	}
	st := tr.Apply().State
	if st.Node.Zone != "z1" || !slices.Equal(st.Node.Addrs, []netip.Addr{netip.MustParseAddr("192.168.77.11")}) {
		t.Errorf("node: %+v", st.Node)
	}
	var got []string
	for name, s := range st.Services {
		got = append(got, fmt.Sprintf("%s %s:%d nodePort %d local=%v", name, s.Port.ClusterIP, s.Port.Port, s.Port.NodePort, s.Port.ExternalPolicy == model.PolicyLocal))
		for _, e := range s.Endpoints {
			got = append(got, fmt.Sprintf("  %s@%s ready=%v serving=%v terminating=%v", e.AddrPort(), e.NodeName, e.Ready, e.Serving, e.Terminating))
		}
	}
	want := []string{
		"default/web:http/TCP 10.96.0.80:80 nodePort 30080 local=true",
		"  10.244.1.10:8080@node-a ready=true serving=true terminating=false",
		"  10.244.2.10:8080@node-b ready=false serving=true terminating=true",
		"  10.244.2.11:8080@node-b ready=false serving=false terminating=false",
	}
	if !slices.Equal(got, want) {
		t.Errorf("translated:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNilOptionsAreSkipped(t *testing.T) {
	var none builders.ServiceOption
	svc := builders.Service("ns", "web", none, builders.ClusterIP("10.96.0.11"))
	if svc.Spec.ClusterIP != "10.96.0.11" || svc.Spec.ClusterIPs[0] != "10.96.0.11" {
		t.Errorf("cluster IPs %s %v", svc.Spec.ClusterIP, svc.Spec.ClusterIPs)
	}
}

// TestOptionsShareNothing: an option given to several builders leaves each
// object its own, so that later options change them apart.
func TestOptionsShareNothing(t *testing.T) {
	http := builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http")))
	a := builders.Service("ns", "a", http, builders.NodePort(30080))
	b := builders.Service("ns", "b", http, builders.NodePort(30081))
	if a.Spec.Ports[0].NodePort != 30080 || b.Spec.Ports[0].NodePort != 30081 {
		t.Errorf("node ports %d and %d, want 30080 and 30081", a.Spec.Ports[0].NodePort, b.Spec.Ports[0].NodePort)
	}
}
