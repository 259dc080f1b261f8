package example_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestExample6IsTheIPv6TwinOfExample: the behaviour table runs its IPv4
// rows against Example6 by mapping each destination with sandbox.IPv6Of,
// so every address of Example6 must be the twin of Example's.
func TestExample6IsTheIPv6TwinOfExample(t *testing.T) {
	v4, v6 := example.Example(), example.Example6()
	if len(v4) != len(v6) {
		t.Fatalf("Example has %d Services, Example6 %d", len(v4), len(v6))
	}
	twins := func(what string, a, b []string) {
		t.Helper()
		if len(a) != len(b) {
			t.Errorf("%s: %v against %v", what, a, b)
			return
		}
		for i := range a {
			if want := sandbox.IPv6Of(netip.MustParseAddr(a[i])); netip.MustParseAddr(b[i]) != want {
				t.Errorf("%s: %s in Example6, want %s, the twin of %s", what, b[i], want, a[i])
			}
		}
	}
	for i := range v4 {
		s4, s6 := v4[i].Service, v6[i].Service
		name := s4.Name
		if s6.Name != name {
			t.Errorf("Service %d: %s in Example6, %s in Example", i, s6.Name, name)
			continue
		}
		twins(name+" clusterIP", []string{s4.Spec.ClusterIP}, []string{s6.Spec.ClusterIP})
		twins(name+" externalIPs", s4.Spec.ExternalIPs, s6.Spec.ExternalIPs)
		var lb4, lb6 []string
		for _, in := range s4.Status.LoadBalancer.Ingress {
			lb4 = append(lb4, in.IP)
		}
		for _, in := range s6.Status.LoadBalancer.Ingress {
			lb6 = append(lb6, in.IP)
		}
		twins(name+" load balancer IPs", lb4, lb6)
		if (v4[i].Slice == nil) != (v6[i].Slice == nil) {
			t.Errorf("%s: endpoints in one family only", name)
			continue
		}
		if v4[i].Slice == nil {
			continue
		}
		var e4, e6 []string
		for _, ep := range v4[i].Slice.Endpoints {
			e4 = append(e4, ep.Addresses...)
		}
		for _, ep := range v6[i].Slice.Endpoints {
			e6 = append(e6, ep.Addresses...)
		}
		twins(name+" endpoints", e4, e6)
	}
}
