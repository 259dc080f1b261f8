package k8swatch

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// fuzzBytes hands out values decoded from a fuzz input; past its end every
// value is zero.
type fuzzBytes struct{ b []byte }

func (f *fuzzBytes) byte() byte {
	if len(f.b) == 0 {
		return 0
	}
	c := f.b[0]
	f.b = f.b[1:]
	return c
}

func (f *fuzzBytes) bool() bool { return f.byte()&1 == 1 }

func (f *fuzzBytes) int32() int32 {
	switch c := f.byte(); c % 8 {
	case 0:
		return int32(c / 8) // small, often 0
	case 1:
		return 65535 + int32(c/8)%3 // around the top
	case 2:
		return -int32(c / 8)
	default:
		return int32(f.byte())<<24 | int32(f.byte())<<16 | int32(f.byte())<<8 | int32(f.byte())
	}
}

// str picks one of pool, or (when the byte says so) a raw string of the
// input, so that the fuzzer reaches both well-known values and garbage.
func (f *fuzzBytes) str(pool ...string) string {
	c := int(f.byte())
	if c < 200 && len(pool) > 0 {
		return pool[c%len(pool)]
	}
	n := int(f.byte()) % 24
	if n > len(f.b) {
		n = len(f.b)
	}
	s := string(f.b[:n])
	f.b = f.b[n:]
	return s
}

func (f *fuzzBytes) optStr(pool ...string) *string {
	if f.byte()%3 == 0 {
		return nil
	}
	s := f.str(pool...)
	return &s
}

func (f *fuzzBytes) optBool() *bool {
	switch f.byte() % 3 {
	case 0:
		return nil
	case 1:
		b := true
		return &b
	}
	b := false
	return &b
}

var (
	fuzzIPs = []string{"10.96.0.10", "10.96.0.11", "fd00::10", "fd00::11", "::ffff:10.96.0.12", "010.096.000.013", "",
		"None", "1.2.3", "::", "0.0.0.0", "255.255.255.255", " 10.0.0.1", "10.244.1.1", "10.244.1.2", "fd00:244::1"}
	fuzzCIDRs     = []string{"10.0.0.0/8", "0.0.0.0/0", "::/0", "fd00::/64", "10.0.0.1/33", "::ffff:10.0.0.0/104", "::ffff:0:0/95", " 192.168.0.0/16 ", "", "x"}
	fuzzProtocols = []string{"TCP", "UDP", "SCTP", "", "tcp", "ICMP"}
	fuzzNames     = []string{"", "http", "https", "dns", "a"}
	fuzzTypes     = []string{"", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName", "Weird"}
)

// fuzzService builds a Service of default/web from the input.
func fuzzService(f *fuzzBytes) *v1.Service {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}
	svc.Spec.Type = v1.ServiceType(f.str(fuzzTypes...))
	svc.Spec.ClusterIP = f.str(fuzzIPs...)
	if f.bool() {
		for n := f.byte() % 3; n > 0; n-- {
			svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, v1.IPFamily(f.str("IPv4", "IPv6", "")))
			svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, f.str(fuzzIPs...))
		}
	}
	for n := f.byte() % 4; n > 0; n-- {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{
			Name: f.str(fuzzNames...), Protocol: v1.Protocol(f.str(fuzzProtocols...)),
			Port: f.int32(), NodePort: f.int32(),
		})
	}
	for n := f.byte() % 3; n > 0; n-- {
		svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, f.str(fuzzIPs...))
	}
	for n := f.byte() % 3; n > 0; n-- {
		ing := v1.LoadBalancerIngress{IP: f.str(fuzzIPs...)}
		if m := f.optStr("VIP", "Proxy", ""); m != nil {
			mode := v1.LoadBalancerIPMode(*m)
			ing.IPMode = &mode
		}
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, ing)
	}
	for n := f.byte() % 3; n > 0; n-- {
		svc.Spec.LoadBalancerSourceRanges = append(svc.Spec.LoadBalancerSourceRanges, f.str(fuzzCIDRs...))
	}
	if p := f.optStr("Local", "Cluster", ""); p != nil {
		itp := v1.ServiceInternalTrafficPolicy(*p)
		svc.Spec.InternalTrafficPolicy = &itp
	}
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicy(f.str("Local", "Cluster", ""))
	svc.Spec.HealthCheckNodePort = f.int32()
	svc.Spec.SessionAffinity = v1.ServiceAffinity(f.str("", "None", "ClientIP", "Sticky"))
	if f.bool() {
		secs := f.int32()
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &secs}}
	}
	if a := f.optStr("random", "maglev", "Maglev"); a != nil {
		svc.Annotations = map[string]string{AnnotationLBAlgorithm: *a}
	}
	svc.Spec.TrafficDistribution = f.optStr("PreferClose", "PreferSameNode", "")
	return svc
}

// fuzzSlice builds an EndpointSlice of default/web from the input.
func fuzzSlice(f *fuzzBytes) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: f.str("web-1", "web-2", "")}}
	es.AddressType = discoveryv1.AddressType(f.str("IPv4", "IPv6", "FQDN", ""))
	if svc := f.optStr("web", ""); svc != nil {
		es.Labels = map[string]string{discoveryv1.LabelServiceName: *svc}
	}
	for n := f.byte() % 3; n > 0; n-- {
		p := discoveryv1.EndpointPort{Name: f.optStr(fuzzNames...)}
		if f.bool() {
			port := f.int32()
			p.Port = &port
		}
		if s := f.optStr(fuzzProtocols...); s != nil {
			proto := v1.Protocol(*s)
			p.Protocol = &proto
		}
		es.Ports = append(es.Ports, p)
	}
	for n := f.byte() % 4; n > 0; n-- {
		ep := discoveryv1.Endpoint{
			Conditions: discoveryv1.EndpointConditions{Ready: f.optBool(), Serving: f.optBool(), Terminating: f.optBool()},
			NodeName:   f.optStr("node-a", "node-b"),
			Zone:       f.optStr("zone-a", "zone-b"),
		}
		for m := f.byte() % 3; m > 0; m-- {
			ep.Addresses = append(ep.Addresses, f.str(fuzzIPs...))
		}
		if f.bool() {
			ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: f.str("zone-a", "")}}}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	if f.bool() {
		es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: f.str("2024-01-02T03:04:05Z", "yesterday")}
	}
	return es
}

// checkAddr fails unless a is a valid, unmapped address of the family.
func checkAddr(t *testing.T, what string, a netip.Addr, fam v1.IPFamily) {
	t.Helper()
	if !a.IsValid() || a.Is4In6() || a.Is6() != (fam == v1.IPv6Protocol) {
		t.Errorf("%s %v is not a %s address", what, a, fam)
	}
}

func FuzzTranslateService(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x02\x00\x00\x03\x00\x01\x00\x50\x00\x00\x00\x00\x03\x00\x00\x10\x00\x01\x01\x00\x00\x50\x00\x00\x00\x00"))
	f.Add([]byte("\x02\x02\x01\x02\x00\x02\x01\x03\x02\x01\x00\x80\x00\x00\x80\x01\x01\x00\x88\x00\x00\x01\x02\x00\x00\x01\x02\x01\x00\x01\x00\x00\x00\x02\x01\x00\x00\x01\x03\x01\x02"))
	f.Add([]byte("\x03\x01\x00\x02\x01\x01\x02\x00\x00\x03\x00\x00\x00\x50\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x50\x00\x00\x00\x00\x00\x00\x01\x0e\x01\x00\x01\x00\x00\x02\x00\x02\x00\x00\x00\x00\x00\x00\x00\x02"))
	f.Add([]byte("\x01\x02\x00\x01\x02\x01\x00\x00\x00\x1f\x90\x03\x00\x00\x75\x30\x01\x03\x01\x05\x02\x00\x02\x01\x01\x00\x00\x00\x00\x0b"))
	f.Fuzz(func(t *testing.T, data []byte) {
		svc := fuzzService(&fuzzBytes{data})
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			var r reports
			tl := Translator{Family: fam, Invalid: r.fn}
			out := tl.ServicePorts(svc)
			if out != nil && len(out) == 0 {
				t.Errorf("%s: empty, non-nil list", fam)
			}
			names := map[model.ServicePortName]bool{}
			frontends := map[string]model.ServicePortName{}
			for _, sp := range out {
				if sp.Name.ServiceName != ServiceName(svc) {
					t.Errorf("%s: port of %v", fam, sp.Name.ServiceName)
				}
				if sp.Name.Protocol != model.TCP && sp.Name.Protocol != model.UDP && sp.Name.Protocol != model.SCTP {
					t.Errorf("%s: %v: protocol %d", fam, sp.Name, sp.Name.Protocol)
				}
				if names[sp.Name] {
					t.Errorf("%s: %v listed twice", fam, sp.Name)
				}
				names[sp.Name] = true
				if sp.Port == 0 {
					t.Errorf("%s: %v: port 0", fam, sp.Name)
				}
				checkAddr(t, "cluster IP", sp.ClusterIP, fam)
				for _, a := range sp.ExternalIPs {
					checkAddr(t, "external IP", a, fam)
				}
				for _, a := range sp.LoadBalancerIPs {
					checkAddr(t, "load balancer IP", a, fam)
				}
				for _, p := range sp.LoadBalancerSourceRanges {
					checkAddr(t, "source range", p.Addr(), fam)
					if p.Bits() <= 0 || p != p.Masked() {
						t.Errorf("%s: source range %v: not a masked prefix of at least one bit", fam, p)
					}
				}
				if sp.AffinityTimeout < 0 || sp.AffinityTimeout > model.MaxAffinityTimeout {
					t.Errorf("%s: affinity timeout %v", fam, sp.AffinityTimeout)
				}
				if sp.HealthCheckNodePort != 0 && sp.ExternalPolicy != model.PolicyLocal {
					t.Errorf("%s: health check node port %d with external policy %v", fam, sp.HealthCheckNodePort, sp.ExternalPolicy)
				}
				// One frontend, one ServicePort: the API server refuses
				// a Service that repeats a port or a node port with the
				// same protocol, and so must the manifests' translation.
				fes := []string{fmt.Sprintf("%s/%s", netip.AddrPortFrom(sp.ClusterIP, sp.Port), sp.Name.Protocol)}
				if sp.NodePort != 0 {
					fes = append(fes, fmt.Sprintf("nodePort %d/%s", sp.NodePort, sp.Name.Protocol))
				}
				for _, fe := range fes {
					if other, dup := frontends[fe]; dup {
						t.Errorf("%s: frontend %s of %v and of %v", fam, fe, other, sp.Name)
					}
					frontends[fe] = sp.Name
				}
			}
			// A port left out is said.
			if len(out) > 0 && len(out) < len(svc.Spec.Ports) && len(r.take()) == 0 {
				t.Errorf("%s: %d of %d ports translated and nothing reported", fam, len(out), len(svc.Spec.Ports))
			}
		}
	})
}

func FuzzTranslateEndpointSlice(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x01\x01\x02\x01\x01\x01\x03\x00\x00\x50\x01\x00\x02\x01\x01\x01\x01\x01\x00\x01\x0d\x00"))
	f.Add([]byte("\x01\x01\x01\x01\x01\x01\x00\x01\x00\x01\x01\x00\x03\x01\x00\x02\x01\x01\x0f\x01\x00\x01\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		es := fuzzSlice(&fuzzBytes{data})
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			tl := Translator{Family: fam, Invalid: func(string, string, string, string) {}}
			s := tl.EndpointSlice(es)
			if s == nil {
				continue
			}
			if s.Service != (model.ServiceName{Namespace: "default", Name: es.Labels[discoveryv1.LabelServiceName]}) || s.Service.Name == "" || s.Name != es.Name {
				t.Errorf("%s: slice %v/%s from %s", fam, s.Service, s.Name, es.Name)
			}
			for _, p := range s.Ports {
				if p.Port == 0 || (p.Protocol != model.TCP && p.Protocol != model.UDP && p.Protocol != model.SCTP) {
					t.Errorf("%s: slice port %+v", fam, p)
				}
			}
			for i, ep := range s.Endpoints {
				checkAddr(t, "endpoint", ep.Addr, fam)
				if i > 0 && s.Endpoints[i-1].Addr.Compare(ep.Addr) > 0 {
					t.Errorf("%s: endpoints out of order: %v before %v", fam, s.Endpoints[i-1].Addr, ep.Addr)
				}
				if len(s.Ports) == 1 && ep.Port != s.Ports[0].Port {
					t.Errorf("%s: endpoint %v of a one-port slice without its port %d", fam, ep, s.Ports[0].Port)
				}
			}
		}
	})
}

// FuzzManifests reads arbitrary bytes as a manifests file: no panic, a
// file the reader cannot use is reported, and whatever it accepts is a
// valid model (Services translated by the same rules as above).
func FuzzManifests(f *testing.F) {
	f.Add([]byte(svcYAML("", "web", "10.96.0.10") + "---\n" + sliceYAML("", "web-1", "web", "10.244.1.1", "node-a")))
	f.Add([]byte(nodeYAML))
	f.Add([]byte("apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(svcYAML("ns", "db", "fd00::1"), "\n", "\n  ")))
	f.Add([]byte("--- junk\nkind: [half\n---\napiVersion: example.com/v1\nkind: Widget\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"j"},"spec":{"clusterIP":"10.0.0.1","ports":[{"port":1}]}}`))
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80, name: a}, {port: 80, name: b}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "in.yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		tr4 := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
		tr6 := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
		m, err := NewManifests(dir, "node-a", []Target{{Family: v1.IPv4Protocol, Tracker: tr4}, {Family: v1.IPv6Protocol, Tracker: tr6}},
			ManifestOptions{Invalid: func(kind, ns, name, reason string) {
				if !strings.Contains(reason, ": ") {
					t.Errorf("report %s %s/%s %q without a cause", kind, ns, name, reason)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Reload(); err != nil {
			t.Fatal(err)
		}
		for i, tr := range []*tracker.Tracker{tr4, tr6} {
			fam := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}[i]
			st := tr.Apply().State
			for name, svc := range st.Services {
				if svc.Port.Name != name || svc.Port.Port == 0 {
					t.Errorf("%s: %v holds %v port %d", fam, name, svc.Port.Name, svc.Port.Port)
				}
				checkAddr(t, "cluster IP", svc.Port.ClusterIP, fam)
				for _, ep := range svc.Endpoints {
					checkAddr(t, "endpoint", ep.Addr, fam)
				}
			}
		}
	})
}
