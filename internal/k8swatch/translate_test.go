package k8swatch

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/addrs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// wantPort is the translation of makeService's default port, changed by mod.
func wantPort(mod func(*model.ServicePort)) *model.ServicePort {
	sp := &model.ServicePort{
		Name:      spn("ns", "svc", "http", model.TCP),
		ClusterIP: addrs.Parse("10.96.0.10")[0],
		Port:      80,
	}
	if mod != nil {
		mod(sp)
	}
	return sp
}

func fmtPorts(ps []*model.ServicePort) string {
	if ps == nil {
		return "nil"
	}
	s := ""
	for _, p := range ps {
		s += fmt.Sprintf("\n    %+v", *p)
	}
	return s
}

func TestServicePorts(t *testing.T) {
	tests := []struct {
		name    string
		family  v1.IPFamily
		lb      model.LBAlgorithm
		svc     *v1.Service
		want    []*model.ServicePort
		reports []string
	}{
		{
			name: "ClusterIP Service with one TCP port",
			svc:  builders.Service("ns", "svc"),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name: "headless Service (clusterIP None) is skipped",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
			}),
		},
		{
			name: "Service without cluster IP is skipped",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "", nil, nil
			}),
		},
		{
			name: "ExternalName Service is skipped even with a cluster IP",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "example.com"
			}),
		},
		{
			name: "dual-stack IPv6-primary Service: the IPv4 cluster IP is taken from clusterIPs by ipFamilies",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIP = "fd00:96::10"
				s.Spec.ClusterIPs = []string{"fd00:96::10", "10.96.0.20"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.ClusterIP = addrs.Parse("10.96.0.20")[0] })},
		},
		{
			name:   "the family is a parameter: the IPv6 translator takes the IPv6 cluster IP",
			family: v1.IPv6Protocol,
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
				s.Spec.ExternalIPs = []string{"198.19.0.1", "2001:db8::1"}
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) {
				sp.ClusterIP = addrs.Parse("fd00:96::10")[0]
				sp.ExternalIPs = addrs.Parse("2001:db8::1")
			})},
		},
		{
			name: "IPv6-only Service is invisible to the IPv4 translator",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00:96::10", []string{"fd00:96::10"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
			}),
		},
		{
			name: "without ipFamilies (legacy object or manifest) spec.clusterIP is used",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil
			}),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name: "without ipFamilies an IPv6 spec.clusterIP is not ours",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "fd00:96::10", nil, nil
			}),
		},
		{
			name: "invalid cluster IP is reported and the Service skipped",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "10.96.0.999", nil, nil
			}),
			reports: []string{`Service ns/svc: invalid cluster IP: "10.96.0.999"`},
		},
		{
			name: "legacy cluster IP with leading zeros is read as decimal, as Kubernetes does",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "010.096.000.010", []string{"010.096.000.010"}
			}),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name: "externalIPs are filtered to the family; invalid ones reported, empty ones ignored",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"198.19.0.1", "2001:db8::1", "not-an-ip", "", "198.19.0.2"}
			}),
			want:    []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.ExternalIPs = addrs.Parse("198.19.0.1", "198.19.0.2") })},
			reports: []string{`invalid externalIP: "not-an-ip"`},
		},
		{
			name: "LoadBalancer ingress: VIP and unset ipMode kept, Proxy mode, hostnames and IPv6 ignored",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "198.19.0.10", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)},
					{IP: "198.19.0.11"},
					{IP: "198.19.0.12", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
					{IP: "2001:db8::10"},
				}
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) {
				sp.NodePort = 30080
				sp.LoadBalancerIPs = addrs.Parse("198.19.0.10", "198.19.0.11")
			})},
		},
		{
			name: "source ranges: whitespace trimmed, host bits masked, other family dropped, invalid reported",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{" 198.18.0.0/24 ", "10.1.2.3/8\t", "2001:db8::/32", "bogus"}
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) {
				sp.LoadBalancerSourceRanges = addrs.Prefixes("198.18.0.0/24", "10.0.0.0/8")
			})},
			reports: []string{`invalid loadBalancerSourceRange: "bogus"`},
		},
		{
			name: "a zero-length source range allows everyone, like no ranges",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/24", "0.0.0.0/0"}
			}),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name: "LoadBalancer with externalTrafficPolicy Local has a health check node port",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) {
				sp.NodePort, sp.HealthCheckNodePort, sp.ExternalPolicy = 30080, 32000, model.PolicyLocal
			})},
		},
		{
			name: "LoadBalancer with externalTrafficPolicy Cluster has none",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name: "NodePort with externalTrafficPolicy Local is external Local without health check port",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) {
				sp.NodePort, sp.ExternalPolicy = 30080, model.PolicyLocal
			})},
		},
		{
			name: "LoadBalancer Local without a health check node port is reported",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want:    []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.ExternalPolicy = model.PolicyLocal })},
			reports: []string{"invalid healthCheckNodePort: 0"},
		},
		{
			name: "externalTrafficPolicy Local on a ClusterIP Service without external IPs means nothing",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name: "externalTrafficPolicy Local applies to external IPs, also with the type left out (manifest)",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = ""
				s.Spec.ExternalIPs = []string{"198.19.0.1"}
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) {
				sp.ExternalIPs, sp.ExternalPolicy = addrs.Parse("198.19.0.1"), model.PolicyLocal
			})},
		},
		{
			name: "internalTrafficPolicy Local",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.InternalPolicy = model.PolicyLocal })},
		},
		{
			name: "internalTrafficPolicy Cluster",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyCluster)
			}),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name: "ClientIP affinity without a timeout gets the API default of 3 hours",
			svc:  builders.Service("ns", "svc", func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })},
		},
		{
			name: "ClientIP affinity with a timeout",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.AffinityTimeout = 10 * time.Minute })},
		},
		{
			name: "ClientIP affinity timeout above one day is clamped and reported",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](100000)}}
			}),
			want:    []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.AffinityTimeout = 24 * time.Hour })},
			reports: []string{"invalid affinity timeout: timeoutSeconds 100000 exceeds 86400"},
		},
		{
			name: "ClientIP affinity timeout of zero is reported and defaulted",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](0)}}
			}),
			want:    []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })},
			reports: []string{"invalid affinity timeout: timeoutSeconds 0 is not positive"},
		},
		{
			name: "the lb-algorithm annotation chooses Maglev",
			svc:  builders.Service("ns", "svc", func(s *v1.Service) { s.Annotations = map[string]string{AnnotationLBAlgorithm: "maglev"} }),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.LBAlgorithm = model.LBMaglev })},
		},
		{
			name: "the translator's default applies without the annotation",
			lb:   model.LBMaglev,
			svc:  builders.Service("ns", "svc"),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.LBAlgorithm = model.LBMaglev })},
		},
		{
			name: "the annotation overrides the default",
			lb:   model.LBMaglev,
			svc:  builders.Service("ns", "svc", func(s *v1.Service) { s.Annotations = map[string]string{AnnotationLBAlgorithm: "random"} }),
			want: []*model.ServicePort{wantPort(nil)},
		},
		{
			name:    "an unknown algorithm is reported and the default used",
			lb:      model.LBMaglev,
			svc:     builders.Service("ns", "svc", func(s *v1.Service) { s.Annotations = map[string]string{AnnotationLBAlgorithm: "roundrobin"} }),
			want:    []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.LBAlgorithm = model.LBMaglev })},
			reports: []string{`invalid annotation ebpf-proxy/lb-algorithm: unknown load-balancing algorithm "roundrobin"`},
		},
		{
			name: "trafficDistribution is carried",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferClose)
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.TrafficDistribution = model.TrafficDistributionPreferClose })},
		},
		{
			name: "TCP and UDP on the same port number are two ServicePorts",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{
					{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
					{Name: "dns-tcp", Port: 53, Protocol: v1.ProtocolTCP},
				}
			}),
			want: []*model.ServicePort{
				wantPort(func(sp *model.ServicePort) { sp.Name, sp.Port = spn("ns", "svc", "dns", model.UDP), 53 }),
				wantPort(func(sp *model.ServicePort) { sp.Name, sp.Port = spn("ns", "svc", "dns-tcp", model.TCP), 53 }),
			},
		},
		{
			name: "an unnamed port defaults to TCP when the protocol is left out",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{{Port: 80}}
			}),
			want: []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.Name = spn("ns", "svc", "", model.TCP) })},
		},
		{
			name: "a port listed twice: the last one wins, as in kube-proxy, and it is reported",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80}, {Name: "http", Port: 81}}
			}),
			want:    []*model.ServicePort{wantPort(func(sp *model.ServicePort) { sp.Port = 81 })},
			reports: []string{`duplicate port: "http"/TCP is listed twice`},
		},
		{
			name: "two ports on one port number and protocol (refused by the API server, possible in manifests): the second is left out, reported",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80}, {Name: "web", Port: 80}, {Name: "dns", Port: 80, Protocol: v1.ProtocolUDP}}
			}),
			want: []*model.ServicePort{
				wantPort(nil),
				wantPort(func(sp *model.ServicePort) { sp.Name = spn("ns", "svc", "dns", model.UDP) }),
			},
			reports: []string{`duplicate port: port "web": 80/TCP is already port "http"'s; port not proxied`},
		},
		{
			name: "two ports on one node port and protocol: the second has no NodePort, reported",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80, NodePort: 30080}, {Name: "alt", Port: 8080, NodePort: 30080}}
			}),
			want: []*model.ServicePort{
				wantPort(func(sp *model.ServicePort) { sp.NodePort = 30080 }),
				wantPort(func(sp *model.ServicePort) { sp.Name, sp.Port = spn("ns", "svc", "alt", model.TCP), 8080 }),
			},
			reports: []string{`duplicate nodePort: port "alt": 30080/TCP is already port "http"'s; no NodePort`},
		},
		{
			name: "an unknown protocol leaves the port out, reported",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "x", Port: 99, Protocol: "ICMP"})
			}),
			want:    []*model.ServicePort{wantPort(nil)},
			reports: []string{`invalid port protocol: port "x": unknown protocol "ICMP"`},
		},
		{
			name: "a Service with only unusable ports is not proxied",
			svc: builders.Service("ns", "svc", func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{{Name: "x", Port: 70000}}
			}),
			reports: []string{`invalid port number: port "x": 70000 is not a valid port`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r reports
			tl := Translator{Family: tc.family, Invalid: r.fn, LBAlgorithm: tc.lb}
			got := tl.ServicePorts(tc.svc)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ServicePorts:\n  got  %s\n  want %s", fmtPorts(got), fmtPorts(tc.want))
			}
			checkReports(t, r.take(), tc.reports)
		})
	}
}

func TestEndpointSlice(t *testing.T) {
	triggerTime := time.Date(2026, 7, 1, 12, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name    string
		family  v1.IPFamily
		es      *discoveryv1.EndpointSlice
		want    *model.EndpointSlice
		reports []string
	}{
		{
			name: "unset conditions default to ready, serving, not terminating",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.1.1"}},
			}),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-abc",
				Ports:     []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}},
				Endpoints: []model.Endpoint{{Addr: addrs.Parse("10.244.1.1")[0], Port: 8080, Ready: true, Serving: true}},
			},
		},
		{
			name: "explicit conditions, node, zone and hints are kept",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", []discoveryv1.Endpoint{
				builders.Endpoint("10.244.1.1", "node-a", func(ep *discoveryv1.Endpoint) {
					builders.Terminating(ep)
					ep.Zone = ptr.To("zone-a")
					ep.Hints = &discoveryv1.EndpointHints{
						ForZones: []discoveryv1.ForZone{{Name: "zone-a"}, {Name: "zone-b"}},
						ForNodes: []discoveryv1.ForNode{{Name: "node-a"}},
					}
				}),
				builders.Endpoint("10.244.1.2", "node-b", func(ep *discoveryv1.Endpoint) {
					ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false)}
				}),
			}),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-abc",
				Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}},
				Endpoints: []model.Endpoint{
					{
						Addr: addrs.Parse("10.244.1.1")[0], Port: 8080, Serving: true, Terminating: true, NodeName: "node-a",
						Hints: &model.Hints{Zones: []string{"zone-a", "zone-b"}, Nodes: []string{"node-a"}},
					},
					{Addr: addrs.Parse("10.244.1.2")[0], Port: 8080, NodeName: "node-b"},
				},
			},
		},
		{
			name: "endpoints in address order; with two ports the tracker gives each its port",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", []discoveryv1.Endpoint{
				builders.Endpoint("10.244.1.9", ""), builders.Endpoint("10.244.1.10", ""), builders.Endpoint("10.244.1.1", ""),
			}, func(es *discoveryv1.EndpointSlice) {
				es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(v1.ProtocolUDP)})
			}),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-abc",
				Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}, {Name: "dns", Port: 53, Protocol: model.UDP}},
				Endpoints: []model.Endpoint{
					{Addr: addrs.Parse("10.244.1.1")[0], Ready: true, Serving: true},
					{Addr: addrs.Parse("10.244.1.9")[0], Ready: true, Serving: true},
					{Addr: addrs.Parse("10.244.1.10")[0], Ready: true, Serving: true},
				},
			},
		},
		{
			name: "slice without the service-name label is reported and ignored",
			es: builders.EndpointSlice("ns", "orphan", "svc", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "")},
				func(es *discoveryv1.EndpointSlice) { es.Labels = nil }),
			reports: []string{"EndpointSlice ns/orphan: missing service name: no kubernetes.io/service-name label"},
		},
		{
			name: "IPv6 slice is not for the IPv4 translator",
			es: builders.EndpointSlice("ns", "svc-v6", "svc", []discoveryv1.Endpoint{builders.Endpoint("fd00::1", "")},
				func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeIPv6 }),
		},
		{
			name: "FQDN slice is ignored",
			es: builders.EndpointSlice("ns", "svc-fqdn", "svc", []discoveryv1.Endpoint{{Addresses: []string{"example.com"}}},
				func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN }),
		},
		{
			name:   "the IPv6 translator takes IPv6 slices",
			family: v1.IPv6Protocol,
			es: builders.EndpointSlice("ns", "svc-v6", "svc", []discoveryv1.Endpoint{builders.Endpoint("fd00::1", "")},
				func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeIPv6 }),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-v6",
				Ports:     []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}},
				Endpoints: []model.Endpoint{{Addr: addrs.Parse("fd00::1")[0], Port: 8080, Ready: true, Serving: true}},
			},
		},
		{
			name: "slice without addressType is reported (a manifest mistake)",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", nil,
				func(es *discoveryv1.EndpointSlice) { es.AddressType = "" }),
			reports: []string{"missing addressType: addressType is not set"},
		},
		{
			name: "ports: nil name or nil/0 number ignored and reported, nil protocol is TCP",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", nil, func(es *discoveryv1.EndpointSlice) {
				es.Ports = []discoveryv1.EndpointPort{
					{Port: ptr.To[int32](1), Protocol: ptr.To(v1.ProtocolTCP)},
					{Name: ptr.To("all"), Protocol: ptr.To(v1.ProtocolTCP)},
					{Name: ptr.To("zero"), Port: ptr.To[int32](0)},
					{Name: ptr.To("dns"), Port: ptr.To[int32](5353)},
					builders.SlicePort("dns", 5353, v1.ProtocolUDP),
				}
			}),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-abc",
				Ports: []model.EndpointPort{
					{Name: "dns", Port: 5353, Protocol: model.TCP},
					{Name: "dns", Port: 5353, Protocol: model.UDP},
				},
				Endpoints: []model.Endpoint{},
			},
			reports: []string{"invalid slice port: a port has no name", `invalid slice port: port "all" has no port number`, `invalid slice port: port "zero" has no port number`},
		},
		{
			name: "endpoints: only the first address is used; missing, invalid and other-family addresses reported",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.1.1", "10.244.1.99"}},
				{Addresses: nil},
				{Addresses: []string{"10.244.1.300"}},
				{Addresses: []string{"fd00::1"}},
			}),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-abc",
				Ports:     []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}},
				Endpoints: []model.Endpoint{{Addr: addrs.Parse("10.244.1.1")[0], Port: 8080, Ready: true, Serving: true}},
			},
			reports: []string{"invalid endpoint: endpoint 1 has no address", `invalid endpoint: address "10.244.1.300" is not a valid IPv4 address`, `invalid endpoint: address "fd00::1" is not a valid IPv4 address`},
		},
		{
			name: "trigger time annotation is parsed",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", nil, func(es *discoveryv1.EndpointSlice) {
				es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: triggerTime.Format(time.RFC3339Nano)}
			}),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-abc",
				Ports:       []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}},
				Endpoints:   []model.Endpoint{},
				TriggerTime: triggerTime,
			},
		},
		{
			name: "an invalid trigger time is reported and left zero",
			es: builders.EndpointSlice("ns", "svc-abc", "svc", nil, func(es *discoveryv1.EndpointSlice) {
				es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "yesterday"}
			}),
			want: &model.EndpointSlice{
				Service: model.ServiceName{Namespace: "ns", Name: "svc"}, Name: "svc-abc",
				Ports:     []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}},
				Endpoints: []model.Endpoint{},
			},
			reports: []string{"invalid trigger time: annotation endpoints.kubernetes.io/last-change-trigger-time"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r reports
			tl := Translator{Family: tc.family, Invalid: r.fn}
			got := tl.EndpointSlice(tc.es)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("EndpointSlice:\n  got  %+v\n  want %+v", got, tc.want)
			}
			checkReports(t, r.take(), tc.reports)
		})
	}
}

func TestNode(t *testing.T) {
	var r reports
	tl := Translator{Invalid: r.fn}
	n := builders.Node("node-a", builders.NodeZone("zone-a"), builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeHostName, Address: "node-a"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.77.10"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd00:77::10"},
		v1.NodeAddress{Type: v1.NodeExternalIP, Address: "198.19.0.100"},
		v1.NodeAddress{Type: v1.NodeExternalIP, Address: "192.168.77.10"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "bogus"}))
	want := model.Node{Name: "node-a", Zone: "zone-a", Addrs: addrs.Parse("192.168.77.10", "198.19.0.100")}
	if got := tl.Node(n); !reflect.DeepEqual(got, want) {
		t.Errorf("Node: got %+v, want %+v", got, want)
	}
	checkReports(t, r.take(), []string{`Node /node-a: invalid node address: "bogus"`})
}

// --bind-address makes an address the node's primary one, first among the
// Node's own, which follow without it repeated.
func TestNodeIPOverride(t *testing.T) {
	n := builders.Node("node-a", builders.NodeZone(""), builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.77.10"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.88.10"}))
	for _, tc := range []struct {
		name     string
		override netip.Addr
		want     []netip.Addr
	}{
		{"none", netip.Addr{}, addrs.Parse("192.168.77.10", "192.168.88.10")},
		{"another address", netip.MustParseAddr("10.0.0.5"), addrs.Parse("10.0.0.5", "192.168.77.10", "192.168.88.10")},
		{"the second address", netip.MustParseAddr("192.168.88.10"), addrs.Parse("192.168.88.10", "192.168.77.10")},
		{"other family: ignored", netip.MustParseAddr("fd00::5"), addrs.Parse("192.168.77.10", "192.168.88.10")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := Translator{NodeIP: tc.override}
			if got := tl.Node(n).Addrs; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Addrs %v, want %v", got, tc.want)
			}
		})
	}
}
