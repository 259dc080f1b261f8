package k8swatch

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// TestState feeds real API objects through the informer handlers into a
// tracker and checks the State a dataplane would be given: endpoints
// merged, deduplicated and selected for node-a in zone-a.
func TestState(t *testing.T) {
	nodeA := builders.Node("node-a", builders.NodeZone("zone-a"), builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.77.10"}))
	tests := []struct {
		name    string
		objects []runtime.Object
		want    []string
		reports []string
	}{
		{
			name: "several EndpointSlices of one Service are merged",
			objects: []runtime.Object{
				builders.Service("ns", "web"),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")}),
				builders.EndpointSlice("ns", "web-2", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.2.1", "node-b")}),
			},
			want: []string{
				"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a 10.244.2.1:8080 @node-b] internal=FORWARD[10.244.1.1:8080 @node-a 10.244.2.1:8080 @node-b]",
			},
		},
		{
			name: "an endpoint in two slices is kept once, the non-terminating copy",
			objects: []runtime.Object{
				builders.Service("ns", "web"),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a", builders.Terminating)}),
				builders.EndpointSlice("ns", "web-2", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")}),
			},
			want: []string{
				"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a] internal=FORWARD[10.244.1.1:8080 @node-a]",
			},
		},
		{
			name: "named target ports are resolved through the slice's port names",
			objects: []runtime.Object{
				builders.Service("ns", "web", func(s *v1.Service) {
					s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "metrics", Port: 9090, Protocol: v1.ProtocolTCP})
				}),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")},
					func(es *discoveryv1.EndpointSlice) {
						es.Ports = []discoveryv1.EndpointPort{builders.SlicePort("metrics", 9100, v1.ProtocolTCP), builders.SlicePort("http", 8080, v1.ProtocolTCP)}
					}),
			},
			want: []string{
				"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a] internal=FORWARD[10.244.1.1:8080 @node-a]",
				"ns/web:metrics/TCP 10.96.0.10:9090 eps=[10.244.1.1:9100 @node-a] internal=FORWARD[10.244.1.1:9100 @node-a]",
			},
		},
		{
			name: "TCP and UDP on the same port get their own endpoints",
			objects: []runtime.Object{
				builders.Service("kube-system", "dns", func(s *v1.Service) {
					s.Spec.Ports = []v1.ServicePort{
						{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
						{Name: "dns-tcp", Port: 53, Protocol: v1.ProtocolTCP},
					}
				}),
				builders.EndpointSlice("kube-system", "dns-1", "dns", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.53", "node-a")},
					func(es *discoveryv1.EndpointSlice) {
						es.Ports = []discoveryv1.EndpointPort{builders.SlicePort("dns", 5353, v1.ProtocolUDP), builders.SlicePort("dns-tcp", 5354, v1.ProtocolTCP)}
					}),
			},
			want: []string{
				"kube-system/dns:dns-tcp/TCP 10.96.0.10:53 eps=[10.244.1.53:5354 @node-a] internal=FORWARD[10.244.1.53:5354 @node-a]",
				"kube-system/dns:dns/UDP 10.96.0.10:53 eps=[10.244.1.53:5353 @node-a] internal=FORWARD[10.244.1.53:5353 @node-a]",
			},
		},
		{
			name: "a slice port of the right name but the other protocol does not match",
			objects: []runtime.Object{
				builders.Service("ns", "web"),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")},
					func(es *discoveryv1.EndpointSlice) {
						es.Ports = []discoveryv1.EndpointPort{builders.SlicePort("http", 8080, v1.ProtocolUDP)}
					}),
			},
			want: []string{"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]"},
		},
		{
			name: "headless and ExternalName Services are not proxied, their slices change nothing",
			objects: []runtime.Object{
				builders.Service("ns", "headless", func(s *v1.Service) {
					s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
				}),
				builders.EndpointSlice("ns", "headless-1", "headless", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")}),
				builders.Service("ns", "ext", func(s *v1.Service) { s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "example.com" }),
			},
		},
		{
			name: "objects labelled for another proxy or as headless are ignored",
			objects: []runtime.Object{
				builders.Service("ns", "other", func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other-proxy"} }),
				builders.EndpointSlice("ns", "other-1", "other", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")},
					func(es *discoveryv1.EndpointSlice) { es.Labels[LabelServiceProxyName] = "other-proxy" }),
				builders.Service("ns", "web"),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.2", "node-a")},
					func(es *discoveryv1.EndpointSlice) { es.Labels[LabelHeadless] = "" }),
			},
			want: []string{"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]"},
		},
		{
			// kube-proxy 1.37: each label filters its own kind.
			name: "a Service labelled headless but with a ClusterIP is proxied; a slice named for another proxy serves ours",
			objects: []runtime.Object{
				builders.Service("ns", "web", func(s *v1.Service) { s.Labels = map[string]string{LabelHeadless: ""} }),
				builders.Service("ns", "api", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"} }),
				builders.EndpointSlice("ns", "api-1", "api", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.2", "node-a")},
					func(es *discoveryv1.EndpointSlice) { es.Labels[LabelServiceProxyName] = "other-proxy" }),
			},
			want: []string{
				"ns/api:http/TCP 10.96.0.11:80 eps=[10.244.1.2:8080 @node-a] internal=FORWARD[10.244.1.2:8080 @node-a]",
				"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]",
			},
		},
		{
			name: "a slice without the service-name label is reported and ignored",
			objects: []runtime.Object{
				builders.Service("ns", "web"),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")},
					func(es *discoveryv1.EndpointSlice) { delete(es.Labels, discoveryv1.LabelServiceName) }),
			},
			want:    []string{"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]"},
			reports: []string{"EndpointSlice ns/web-1: missing service name: no kubernetes.io/service-name label"},
		},
		{
			name: "only terminating endpoints: the serving ones are used",
			objects: []runtime.Object{
				builders.Service("ns", "web"),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{
					builders.Endpoint("10.244.1.1", "node-a", builders.Terminating),
					builders.Endpoint("10.244.2.1", "node-b", func(ep *discoveryv1.Endpoint) {
						builders.Terminating(ep)
						ep.Conditions.Serving = ptr.To(false)
					}),
				}),
			},
			want: []string{
				"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 serving-terminating @node-a 10.244.2.1:8080 terminating @node-b] " +
					"internal=FORWARD[10.244.1.1:8080 serving-terminating @node-a]",
			},
		},
		{
			name: "publishNotReadyAddresses is not consulted: a not-ready endpoint stays unused",
			objects: []runtime.Object{
				builders.Service("ns", "web", func(s *v1.Service) { s.Spec.PublishNotReadyAddresses = true }),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{
					builders.Endpoint("10.244.1.1", "node-a", func(ep *discoveryv1.Endpoint) {
						ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}
					}),
				}),
			},
			want: []string{"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 not-ready @node-a] internal=REJECT[]"},
		},
		{
			name: "internalTrafficPolicy Local with endpoints only on other nodes drops",
			objects: []runtime.Object{
				builders.Service("ns", "web", func(s *v1.Service) {
					s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
				}),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.2.1", "node-b")}),
			},
			want: []string{"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.2.1:8080 @node-b] internal=DROP[]"},
		},
		{
			name: "zone hints are followed for the Node's zone",
			objects: []runtime.Object{
				builders.Service("ns", "web", func(s *v1.Service) {
					s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferClose)
				}),
				builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{
					builders.Endpoint("10.244.1.1", "node-a", func(ep *discoveryv1.Endpoint) {
						ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
					}),
					builders.Endpoint("10.244.2.1", "node-b", func(ep *discoveryv1.Endpoint) {
						ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
					}),
				}),
			},
			want: []string{"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a 10.244.2.1:8080 @node-b] internal=FORWARD[10.244.1.1:8080 @node-a]"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r reports
			tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
			h := &handlers{lanes: []lane{{tr: tr}}, nodeName: "node-a", invalid: r.fn}
			h.addNode(nodeA)
			for _, o := range tc.objects {
				switch o := o.(type) {
				case *v1.Service:
					h.addService(o)
				case *discoveryv1.EndpointSlice:
					h.addSlice(o)
				default:
					t.Fatalf("unexpected object %T", o)
				}
			}
			up := tr.Apply()
			checkLines(t, "state", describe(up.State), tc.want)
			checkReports(t, r.take(), tc.reports)
		})
	}
}

// TestHandlerUpdates checks how updates and deletes reach the tracker:
// changes that matter do, no-op updates do not, and tombstones are
// understood.
func TestHandlerUpdates(t *testing.T) {
	web := builders.Service("ns", "web")
	web.ResourceVersion = "1"
	slice := builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")})
	slice.ResourceVersion = "1"

	type step struct {
		name string
		do   func(h *handlers)
		// changed are the ServicePorts the Apply after the step reports.
		changed []model.ServicePortName
		want    []string
	}
	webHTTP := spn("ns", "web", "http", model.TCP)
	steps := []step{
		{
			name:    "add",
			do:      func(h *handlers) { h.addService(web); h.addSlice(slice) },
			changed: []model.ServicePortName{webHTTP},
			want:    []string{"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a] internal=FORWARD[10.244.1.1:8080 @node-a]"},
		},
		{
			name: "resync with the same resource version changes nothing",
			do:   func(h *handlers) { h.updateService(web, web); h.updateSlice(slice, slice) },
			want: []string{"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a] internal=FORWARD[10.244.1.1:8080 @node-a]"},
		},
		{
			name: "annotation and status churn on a new version changes nothing",
			do: func(h *handlers) {
				w2 := web.DeepCopy()
				w2.ResourceVersion = "2"
				w2.Annotations = map[string]string{"note": "x"}
				h.updateService(web, w2)
				s2 := slice.DeepCopy()
				s2.ResourceVersion = "2"
				s2.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-07-01T12:00:00Z"}
				h.updateSlice(slice, s2)
			},
			want: []string{"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a] internal=FORWARD[10.244.1.1:8080 @node-a]"},
		},
		{
			name: "an endpoint turning terminating is passed on",
			do: func(h *handlers) {
				s2 := slice.DeepCopy()
				s2.ResourceVersion = "3"
				builders.Terminating(&s2.Endpoints[0])
				h.updateSlice(slice, s2)
			},
			changed: []model.ServicePortName{webHTTP},
			want:    []string{"ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 serving-terminating @node-a] internal=FORWARD[10.244.1.1:8080 serving-terminating @node-a]"},
		},
		{
			name: "a slice moved to another Service leaves the first one",
			do: func(h *handlers) {
				s2 := slice.DeepCopy()
				builders.Terminating(&s2.Endpoints[0])
				s2.ResourceVersion = "3"
				s3 := s2.DeepCopy()
				s3.ResourceVersion = "4"
				s3.Labels[discoveryv1.LabelServiceName] = "other"
				h.updateSlice(s2, s3)
			},
			changed: []model.ServicePortName{webHTTP},
			want:    []string{"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]"},
		},
		{
			name: "a Service turned ExternalName is removed",
			do: func(h *handlers) {
				w2 := web.DeepCopy()
				w2.ResourceVersion = "5"
				w2.Spec.Type = v1.ServiceTypeExternalName
				h.updateService(web, w2)
			},
			changed: []model.ServicePortName{webHTTP},
		},
		{
			name: "a delete event for a Service that stopped matching the selector still removes it",
			do: func(h *handlers) {
				h.addService(web)
				h.addSlice(slice)
				w2 := web.DeepCopy()
				w2.Labels = map[string]string{LabelServiceProxyName: "other-proxy"}
				h.deleteService(w2)
				s2 := slice.DeepCopy()
				s2.Labels[LabelHeadless] = ""
				s2.Endpoints = nil
				h.deleteSlice(s2)
				h.addService(web)
			},
			changed: []model.ServicePortName{webHTTP},
			want:    []string{"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]"},
		},
		{
			name:    "deleted through a tombstone",
			do:      func(h *handlers) { h.addService(web); h.deleteService(cacheTombstone("ns/web", web)) },
			changed: []model.ServicePortName{webHTTP},
		},
	}
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	h := &handlers{lanes: []lane{{tr: tr}}, nodeName: "node-a"}
	for _, s := range steps {
		s.do(h)
		up := tr.Apply()
		var changed []model.ServicePortName
		for n := range up.Changed {
			changed = append(changed, n)
		}
		if len(changed) != len(s.changed) || (len(changed) == 1 && changed[0] != s.changed[0]) {
			t.Errorf("%s: changed %v, want %v", s.name, changed, s.changed)
		}
		checkLines(t, s.name, describe(up.State), s.want)
	}
}
