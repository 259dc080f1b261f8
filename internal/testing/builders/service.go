package builders

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ServiceOption changes a Service built by Service.
type ServiceOption = func(*v1.Service)

// Service returns the Service ns/name as the API server stores it (defaults
// filled in): type ClusterIP, IPv4 single-stack at 10.96.0.10, session
// affinity None, one TCP port "http" 80 -> 8080; then opts change it in
// order. Nil options are skipped.
func Service(ns, name string, opts ...ServiceOption) *v1.Service {
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:            v1.ServiceTypeClusterIP,
			ClusterIP:       "10.96.0.10",
			ClusterIPs:      []string{"10.96.0.10"},
			IPFamilies:      []v1.IPFamily{v1.IPv4Protocol},
			SessionAffinity: v1.ServiceAffinityNone,
			Ports:           []v1.ServicePort{Port("http", 80, v1.ProtocolTCP, intstr.FromInt32(8080))},
		},
	}
	for _, o := range opts {
		if o != nil {
			o(svc)
		}
	}
	return svc
}

// Port returns a Service port.
func Port(name string, port int32, proto v1.Protocol, target intstr.IntOrString) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: proto, TargetPort: target}
}

// ClusterIP sets the Service's (single) cluster IP; "" leaves it to the
// API server to allocate one.
func ClusterIP(ip string) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
		if ip == "" {
			s.Spec.ClusterIPs = nil
		}
	}
}

// DualStack makes the Service RequireDualStack, its ClusterIPs the one set
// so far and ip6, its families IPv4 then IPv6.
func DualStack(ip6 string) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP, ip6}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		p := v1.IPFamilyPolicyRequireDualStack
		s.Spec.IPFamilyPolicy = &p
	}
}

// Ports replaces the Service's ports with a copy of ports, so that one
// option can serve several Services that later options change apart.
func Ports(ports ...v1.ServicePort) ServiceOption {
	return func(s *v1.Service) { s.Spec.Ports = append([]v1.ServicePort(nil), ports...) }
}

// AddPort adds a port to the Service's.
func AddPort(p v1.ServicePort) ServiceOption {
	return func(s *v1.Service) { s.Spec.Ports = append(s.Spec.Ports, p) }
}

// NodePort makes the Service type NodePort with the given node port on its
// first port.
func NodePort(port int32) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = port
	}
}

// LoadBalancer makes the Service type LoadBalancer with a node port on its
// first port and an ingress IP in VIP mode.
func LoadBalancer(nodePort int32, ingress string) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = nodePort
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ingress}}
	}
}

// ExternalLocal sets externalTrafficPolicy Local and the health check node
// port (0 for none, as for a NodePort Service).
func ExternalLocal(healthCheckNodePort int32) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = healthCheckNodePort
	}
}

// InternalLocal sets internalTrafficPolicy Local.
func InternalLocal() ServiceOption {
	return func(s *v1.Service) {
		p := v1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &p
	}
}

// ExternalIPs sets spec.externalIPs.
func ExternalIPs(ips ...string) ServiceOption {
	return func(s *v1.Service) { s.Spec.ExternalIPs = append([]string(nil), ips...) }
}

// SourceRanges sets spec.loadBalancerSourceRanges.
func SourceRanges(cidrs ...string) ServiceOption {
	return func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = append([]string(nil), cidrs...) }
}

// Affinity sets sessionAffinity ClientIP with the timeout in seconds.
func Affinity(seconds int32) ServiceOption {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &seconds}}
	}
}
