package k8swatch

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// TestSliceInformerKeepsOnlyTheTranslation: the EndpointSlice informer's
// transform keeps a slice's name, version and translation, not the decoded
// object; it is idempotent; and a slice's problems are reported once per
// version, when the handlers see it, not again when a relist transforms
// the same version anew.
func TestSliceInformerKeepsOnlyTheTranslation(t *testing.T) {
	var r reports
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	h := &handlers{lanes: []lane{{tr: tr}}, nodeName: "node-a", invalid: r.fn}
	h.addNode(builders.Node("node-a", builders.NodeZone("zone-a")))
	h.addService(builders.Service("ns", "web"))

	version := func(rv string, badPort bool) *discoveryv1.EndpointSlice {
		return builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")},
			func(es *discoveryv1.EndpointSlice) {
				es.ResourceVersion = rv
				if badPort {
					es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: es.Ports[0].Name})
				}
			})
	}
	transform := func(es *discoveryv1.EndpointSlice) *cachedSlice {
		t.Helper()
		obj, err := h.sliceTransform(es)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := obj.(*cachedSlice)
		if !ok {
			t.Fatalf("transform made %T", obj)
		}
		if again, _ := h.sliceTransform(c); again != any(c) {
			t.Error("transform of its own result changed it")
		}
		return c
	}

	v1 := transform(version("1", true))
	if v1.Name != "web-1" || v1.Namespace != "ns" || v1.ResourceVersion != "1" || !v1.serviceOK || v1.service.Name != "web" || v1.slices[0] == nil {
		t.Fatalf("cached %+v", v1)
	}
	checkReports(t, r.take(), nil) // not yet: the handler reports
	h.addSlice(v1)
	checkReports(t, r.take(), []string{"port \"http\" has no port number"})
	checkLines(t, "after add", describe(tr.Apply().State), []string{webLine})

	// A relist delivers the same version, transformed anew.
	h.updateSlice(v1, transform(version("1", true)))
	checkReports(t, r.take(), nil)

	// A new version with the same problem is reported again.
	v2 := transform(version("2", true))
	h.updateSlice(v1, v2)
	checkReports(t, r.take(), []string{"port \"http\" has no port number"})

	h.deleteSlice(v2)
	checkLines(t, "after delete", describe(tr.Apply().State), []string{"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]"})
}

// TestServiceInformerKeepsOnlyTheTranslation: the Service informer's
// transform keeps a Service's name, version and translation, the same as
// translating the whole object; it is idempotent; problems are reported
// once per version, when the handlers see it.
func TestServiceInformerKeepsOnlyTheTranslation(t *testing.T) {
	var r reports
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	h := &handlers{lanes: []lane{{tr: tr}}, nodeName: "node-a", invalid: r.fn}
	version := func(rv string, badIP bool) *corev1.Service {
		return builders.Service("ns", "web", func(s *corev1.Service) {
			bulkyMeta(&s.ObjectMeta)
			s.ResourceVersion = rv
			s.Annotations[AnnotationLBAlgorithm] = "maglev"
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Selector = map[string]string{"app": "web"}
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalIPs = []string{"198.19.0.1"}
			if badIP {
				s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, "not-an-ip")
			}
			s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/24"}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.0.10", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
		})
	}
	transform := func(svc *corev1.Service) *cachedService {
		t.Helper()
		obj, err := h.serviceTransform(svc)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := obj.(*cachedService)
		if !ok {
			t.Fatalf("transform made %T", obj)
		}
		if again, _ := h.serviceTransform(c); again != any(c) {
			t.Error("transform of its own result changed it")
		}
		return c
	}

	v1 := transform(version("1", true))
	tl := Translator{}
	if want := tl.ServicePorts(version("1", true)); v1.Name != "web" || v1.Namespace != "ns" ||
		v1.ResourceVersion != "1" || !reflect.DeepEqual(v1.ports[0], want) {
		t.Fatalf("cached %+v, want the translation %+v", v1, want)
	}
	if v1.Annotations != nil || v1.Labels != nil || v1.ManagedFields != nil {
		t.Errorf("metadata kept: %+v", v1.ObjectMeta)
	}
	checkReports(t, r.take(), nil) // not yet: the handler reports
	h.addService(v1)
	checkReports(t, r.take(), []string{"not-an-ip"})
	if got := describe(tr.Apply().State); len(got) != 1 || !strings.Contains(got[0], "ns/web:http/TCP 10.96.0.10:80") {
		t.Errorf("after add: %q", got)
	}

	// A relist delivers the same version, transformed anew.
	h.updateService(v1, transform(version("1", true)))
	checkReports(t, r.take(), nil)

	// A new version with the same problem is reported again; one without
	// it is not, and changes nothing the proxy uses.
	v2 := transform(version("2", true))
	h.updateService(v1, v2)
	checkReports(t, r.take(), []string{"not-an-ip"})
	v3 := transform(version("3", false))
	h.updateService(v2, v3)
	checkReports(t, r.take(), nil)
	if up := tr.Apply(); len(up.Changed) != 0 {
		t.Errorf("an update that changes no translation changed %v", up.Changed)
	}

	h.deleteService(cacheTombstone("ns/web", v3))
	if got := describe(tr.Apply().State); len(got) != 0 {
		t.Errorf("after delete: %q", got)
	}
}
