// Package k8swatch is the Kubernetes source of ebpf-proxy: it turns Services,
// EndpointSlices and the proxy's own Node into model values and records them
// in a tracker.Tracker. Two front ends share one translation: client-go
// informers (Watch) and a directory of manifests (Manifests) for standalone
// use and the demo.
//
// The package only translates. It never programs anything and logs nothing:
// input that cannot be proxied as written is handed to the caller's
// InvalidFunc, which logs it and counts it.
package k8swatch

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Kinds passed to an InvalidFunc.
const (
	// KindService is a Service, or a part of one.
	KindService = "Service"
	// KindEndpointSlice is an EndpointSlice, or a part of one.
	KindEndpointSlice = "EndpointSlice"
	// KindNode is the proxy's own Node.
	KindNode = "Node"
	// KindManifest is a file, or a document in a file, of the manifests
	// directory that could not be read or decoded; name is the file's path.
	KindManifest = "Manifest"
)

// Labels and annotations the proxy reads.
const (
	// LabelServiceProxyName marks objects that another proxy implementation
	// handles; kube-proxy, and so ebpf-proxy, ignore them.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless is set by the EndpointSlice controller on the slices of
	// headless Services.
	LabelHeadless = v1.IsHeadlessService
	// AnnotationLBAlgorithm on a Service chooses its load-balancing
	// algorithm for traffic from outside the node: "random" or "maglev".
	AnnotationLBAlgorithm = "ebpf-proxy/lb-algorithm"
)

// InvalidFunc is told about input that cannot be proxied as written: an
// object that is skipped as a whole, or a part of it (one address, one port)
// that is left out while the rest is used. kind is one of the Kind
// constants. reason starts with a short fixed cause ("invalid externalIP",
// "missing service name", "undecodable document") followed by ": " and the
// details, so that the cause can serve as a metric label. It may be called
// from several goroutines at once.
type InvalidFunc func(kind, namespace, name, reason string)

// Translator turns Kubernetes objects into model values for one IP family.
// The zero value translates for IPv4 and drops reports.
type Translator struct {
	// Family is the proxy's IP family; empty means IPv4. Addresses of the
	// other family are left out silently, as kube-proxy's per-family
	// proxiers do.
	Family v1.IPFamily
	// Invalid receives every problem found; nil discards them.
	Invalid InvalidFunc
	// LBAlgorithm is the algorithm of Services without the
	// AnnotationLBAlgorithm annotation (--lb-algorithm).
	LBAlgorithm model.LBAlgorithm
	// NodeIP, when valid, comes first among the Node's addresses: the
	// node's primary address (kube-proxy's --bind-address).
	NodeIP netip.Addr
}

func (t *Translator) family() v1.IPFamily {
	if t.Family == "" {
		return v1.IPv4Protocol
	}
	return t.Family
}

// inFamily reports whether a (already unmapped) is of the translator's family.
func (t *Translator) inFamily(a netip.Addr) bool {
	if t.family() == v1.IPv6Protocol {
		return a.Is6()
	}
	return a.Is4()
}

func (t *Translator) report(kind, namespace, name, format string, args ...any) {
	if t.Invalid != nil {
		t.Invalid(kind, namespace, name, fmt.Sprintf(format, args...))
	}
}

// ServiceProxied reports whether a Service with these labels is meant for
// kube-proxy: it lacks LabelServiceProxyName. SliceProxied reports it of
// an EndpointSlice: it lacks LabelHeadless. The informers select on the
// same conditions at the API server (ServiceSelector, SliceSelector).
func ServiceProxied(labels map[string]string) bool {
	_, other := labels[LabelServiceProxyName]
	return !other
}

// SliceProxied: see ServiceProxied.
func SliceProxied(labels map[string]string) bool {
	_, headless := labels[LabelHeadless]
	return !headless
}

// ShouldSkipService reports whether a Service is never proxied: headless (no
// cluster IP, or "None") or of type ExternalName, even with a cluster IP.
func ShouldSkipService(svc *v1.Service) bool {
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone {
		return true
	}
	return svc.Spec.Type == v1.ServiceTypeExternalName
}

// ClusterIPByFamily returns the Service's cluster IP of the given family, ""
// when it has none. Without spec.ipFamilies (objects written before dual
// stack, and manifests) spec.clusterIP is used when it is of that family.
func ClusterIPByFamily(family v1.IPFamily, svc *v1.Service) string {
	if len(svc.Spec.IPFamilies) == 0 {
		ip := svc.Spec.ClusterIP
		if ip == "" || ip == v1.ClusterIPNone {
			return ""
		}
		if (family == v1.IPv6Protocol) == netutils.IsIPv6String(ip) {
			return ip
		}
		return ""
	}
	for i, f := range svc.Spec.IPFamilies {
		if f == family && i < len(svc.Spec.ClusterIPs) {
			return svc.Spec.ClusterIPs[i]
		}
	}
	return ""
}

// ServiceName returns the model's name of a Service.
func ServiceName(svc *v1.Service) model.ServiceName {
	return model.ServiceName{Namespace: svc.Namespace, Name: svc.Name}
}

// ServicePorts translates a Service into one ServicePort per spec.ports
// entry. It returns nil for a Service that is not proxied by this family:
// headless, ExternalName, without a cluster IP of the family, or whose
// cluster IP is invalid (reported).
func (t *Translator) ServicePorts(svc *v1.Service) []*model.ServicePort {
	if ShouldSkipService(svc) {
		return nil
	}
	ns, name := svc.Namespace, svc.Name
	ipStr := ClusterIPByFamily(t.family(), svc)
	if ipStr == "" {
		return nil
	}
	clusterIP, ok := parseIP(ipStr)
	if !ok || !t.inFamily(clusterIP) {
		t.report(KindService, ns, name, "invalid cluster IP: %q is not a valid %s address; Service not proxied", ipStr, t.family())
		return nil
	}

	typ := svc.Spec.Type
	if typ == "" {
		// The API server defaults it; manifests may leave it out.
		typ = v1.ServiceTypeClusterIP
	}
	externallyAccessible := typ == v1.ServiceTypeLoadBalancer || typ == v1.ServiceTypeNodePort ||
		(typ == v1.ServiceTypeClusterIP && len(svc.Spec.ExternalIPs) > 0)

	// Everything but the port itself is shared by all ports of the Service:
	// model values are immutable, so one copy is enough.
	base := model.ServicePort{
		ClusterIP:                clusterIP,
		ExternalIPs:              t.externalIPs(svc),
		LoadBalancerIPs:          t.loadBalancerIPs(svc),
		LoadBalancerSourceRanges: t.sourceRanges(svc),
		AffinityTimeout:          t.affinityTimeout(svc),
		LBAlgorithm:              t.lbAlgorithm(svc),
	}
	if svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal {
		base.InternalPolicy = model.PolicyLocal
	}
	if externallyAccessible && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		base.ExternalPolicy = model.PolicyLocal
	}
	if typ == v1.ServiceTypeLoadBalancer && base.ExternalPolicy == model.PolicyLocal {
		if p, ok := portNumber(svc.Spec.HealthCheckNodePort); ok {
			base.HealthCheckNodePort = p
		} else {
			t.report(KindService, ns, name, "invalid healthCheckNodePort: %d is not a valid port; no health check served", svc.Spec.HealthCheckNodePort)
		}
	}
	if svc.Spec.TrafficDistribution != nil {
		base.TrafficDistribution = *svc.Spec.TrafficDistribution
	}

	out := make([]*model.ServicePort, 0, len(svc.Spec.Ports))
	index := make(map[model.ServicePortName]int, len(svc.Spec.Ports))
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		proto, err := model.ParseProtocol(string(p.Protocol))
		if err != nil {
			t.report(KindService, ns, name, "invalid port protocol: port %q: %v; port not proxied", p.Name, err)
			continue
		}
		port, ok := portNumber(p.Port)
		if !ok {
			t.report(KindService, ns, name, "invalid port number: port %q: %d is not a valid port; port not proxied", p.Name, p.Port)
			continue
		}
		sp := base
		sp.Name = model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Port: p.Name, Protocol: proto}
		sp.Port = port
		if p.NodePort != 0 {
			if np, ok := portNumber(p.NodePort); ok {
				sp.NodePort = np
			} else {
				t.report(KindService, ns, name, "invalid nodePort: port %q: %d is not a valid port; no NodePort", p.Name, p.NodePort)
			}
		}
		j, dup := index[sp.Name]
		clash := false
		// The API server refuses a Service that lists a port or a node port
		// twice with one protocol; manifests are not validated, and two
		// ServicePorts would then claim one frontend: the later is left out.
		for k, o := range out {
			switch {
			case dup && k == j:
			case o.Port == sp.Port && o.Name.Protocol == proto:
				t.report(KindService, ns, name, "duplicate port: port %q: %d/%s is already port %q's; port not proxied", p.Name, sp.Port, proto, o.Name.Port)
				clash = true
			case sp.NodePort != 0 && o.NodePort == sp.NodePort && o.Name.Protocol == proto:
				t.report(KindService, ns, name, "duplicate nodePort: port %q: %d/%s is already port %q's; no NodePort", p.Name, sp.NodePort, proto, o.Name.Port)
				sp.NodePort = 0
			}
		}
		if clash {
			continue
		}
		if dup {
			// kube-proxy keys ports by name and protocol; the last one wins.
			t.report(KindService, ns, name, "duplicate port: %q/%s is listed twice; the last entry is used", p.Name, proto)
			out[j] = &sp
			continue
		}
		index[sp.Name] = len(out)
		out = append(out, &sp)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (t *Translator) externalIPs(svc *v1.Service) []netip.Addr {
	var out []netip.Addr
	for _, s := range svc.Spec.ExternalIPs {
		a, ok := parseIP(s)
		if !ok {
			// The API server does not validate every legacy value; an empty
			// string is common and not worth a report.
			if strings.TrimSpace(s) != "" {
				t.report(KindService, svc.Namespace, svc.Name, "invalid externalIP: %q is not an IP address; skipped", s)
			}
			continue
		}
		if t.inFamily(a) {
			out = append(out, a)
		}
	}
	return out
}

// loadBalancerIPs keeps the ingress IPs of VIP mode only: with ipMode Proxy
// the load balancer delivers traffic to the nodes itself and the node must
// not capture the address.
func (t *Translator) loadBalancerIPs(svc *v1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP) {
			continue
		}
		a, ok := parseIP(ing.IP)
		if !ok {
			t.report(KindService, svc.Namespace, svc.Name, "invalid load balancer ingress IP: %q is not an IP address; skipped", ing.IP)
			continue
		}
		if t.inFamily(a) {
			out = append(out, a)
		}
	}
	return out
}

// sourceRanges parses spec.loadBalancerSourceRanges. Validation once allowed
// padding, hence the TrimSpace. A zero-length prefix of the family means
// "allow any", the same as no ranges at all, as in kube-proxy.
func (t *Translator) sourceRanges(svc *v1.Service) []netip.Prefix {
	var out []netip.Prefix
	for _, raw := range svc.Spec.LoadBalancerSourceRanges {
		s := strings.TrimSpace(raw)
		if s == "" {
			continue
		}
		p, ok := parsePrefix(s)
		if !ok {
			t.report(KindService, svc.Namespace, svc.Name, "invalid loadBalancerSourceRange: %q is not a CIDR; skipped", raw)
			continue
		}
		if !t.inFamily(p.Addr()) {
			continue
		}
		if p.Bits() == 0 {
			return nil
		}
		out = append(out, p)
	}
	return out
}

func (t *Translator) lbAlgorithm(svc *v1.Service) model.LBAlgorithm {
	v, ok := svc.Annotations[AnnotationLBAlgorithm]
	if !ok {
		return t.LBAlgorithm
	}
	a, err := model.ParseLBAlgorithm(v)
	if err != nil {
		t.report(KindService, svc.Namespace, svc.Name, "invalid annotation %s: %v; using %s", AnnotationLBAlgorithm, err, t.LBAlgorithm)
		return t.LBAlgorithm
	}
	return a
}

func (t *Translator) affinityTimeout(svc *v1.Service) time.Duration {
	switch svc.Spec.SessionAffinity {
	case "", v1.ServiceAffinityNone:
		return 0
	case v1.ServiceAffinityClientIP:
	default:
		t.report(KindService, svc.Namespace, svc.Name, "invalid sessionAffinity: %q is unknown; treated as None", svc.Spec.SessionAffinity)
		return 0
	}
	cfg := svc.Spec.SessionAffinityConfig
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return model.DefaultAffinityTimeout
	}
	secs := *cfg.ClientIP.TimeoutSeconds
	d := time.Duration(secs) * time.Second
	switch {
	case secs <= 0:
		t.report(KindService, svc.Namespace, svc.Name, "invalid affinity timeout: timeoutSeconds %d is not positive; using %d",
			secs, int(model.DefaultAffinityTimeout/time.Second))
		return model.DefaultAffinityTimeout
	case d > model.MaxAffinityTimeout:
		t.report(KindService, svc.Namespace, svc.Name, "invalid affinity timeout: timeoutSeconds %d exceeds %d; clamped",
			secs, int(model.MaxAffinityTimeout/time.Second))
		return model.MaxAffinityTimeout
	}
	return d
}

// EndpointSliceService returns the Service an EndpointSlice belongs to,
// from its kubernetes.io/service-name label; false when the label is
// missing or empty.
func EndpointSliceService(es *discoveryv1.EndpointSlice) (model.ServiceName, bool) {
	name := es.Labels[discoveryv1.LabelServiceName]
	return model.ServiceName{Namespace: es.Namespace, Name: name}, name != ""
}

// addressType is the EndpointSlice address type of the translator's family.
func (t *Translator) addressType() discoveryv1.AddressType {
	if t.family() == v1.IPv6Protocol {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

// EndpointSlice translates an EndpointSlice. It returns nil for a slice of
// another address type (FQDN, or the other family) and for a slice without
// the kubernetes.io/service-name label (reported). Ports and endpoints that
// cannot be used are left out and reported; the rest of the slice is kept.
func (t *Translator) EndpointSlice(es *discoveryv1.EndpointSlice) *model.EndpointSlice {
	ns, name := es.Namespace, es.Name
	if es.AddressType != t.addressType() {
		if es.AddressType == "" {
			t.report(KindEndpointSlice, ns, name, "missing addressType: addressType is not set; slice ignored")
		}
		return nil
	}
	svc, ok := EndpointSliceService(es)
	if !ok {
		t.report(KindEndpointSlice, ns, name, "missing service name: no %s label; slice ignored", discoveryv1.LabelServiceName)
		return nil
	}
	out := &model.EndpointSlice{Service: svc, Name: name}

	for _, p := range es.Ports {
		switch {
		case p.Name == nil:
			t.report(KindEndpointSlice, ns, name, "invalid slice port: a port has no name; port ignored")
			continue
		case p.Port == nil || *p.Port == 0:
			t.report(KindEndpointSlice, ns, name, "invalid slice port: port %q has no port number; port ignored", *p.Name)
			continue
		}
		port, ok := portNumber(*p.Port)
		if !ok {
			t.report(KindEndpointSlice, ns, name, "invalid slice port: port %q: %d is not a valid port; port ignored", *p.Name, *p.Port)
			continue
		}
		var protoName string
		if p.Protocol != nil {
			protoName = string(*p.Protocol)
		}
		proto, err := model.ParseProtocol(protoName)
		if err != nil {
			t.report(KindEndpointSlice, ns, name, "invalid slice port: port %q: %v; port ignored", *p.Name, err)
			continue
		}
		out.Ports = append(out.Ports, model.EndpointPort{Name: *p.Name, Port: port, Protocol: proto})
	}

	out.Endpoints = make([]model.Endpoint, 0, len(es.Endpoints))
	for i := range es.Endpoints {
		ep := &es.Endpoints[i]
		if len(ep.Addresses) == 0 {
			t.report(KindEndpointSlice, ns, name, "invalid endpoint: endpoint %d has no address; ignored", i)
			continue
		}
		// Only the first address is used: the API defines the others as
		// fungible and kube-proxy ignores them.
		a, ok := parseIP(ep.Addresses[0])
		if !ok || !t.inFamily(a) {
			t.report(KindEndpointSlice, ns, name, "invalid endpoint: address %q is not a valid %s address; ignored", ep.Addresses[0], t.family())
			continue
		}
		c := ep.Conditions
		m := model.Endpoint{
			Addr:        a,
			Ready:       c.Ready == nil || *c.Ready,
			Serving:     c.Serving == nil || *c.Serving,
			Terminating: c.Terminating != nil && *c.Terminating,
		}
		if ep.NodeName != nil {
			// Interned: a cluster's 100,000s of endpoints name a few
			// hundred nodes, and each decoded name is its own copy.
			m.NodeName = unique.Make(*ep.NodeName).Value()
		}
		if ep.Hints != nil && (len(ep.Hints.ForZones) > 0 || len(ep.Hints.ForNodes) > 0) {
			m.Hints = &model.Hints{}
			for _, z := range ep.Hints.ForZones {
				m.Hints.Zones = append(m.Hints.Zones, z.Name)
			}
			for _, n := range ep.Hints.ForNodes {
				m.Hints.Nodes = append(m.Hints.Nodes, n.Name)
			}
		}
		out.Endpoints = append(out.Endpoints, m)
	}
	// In address order, and with the port of a single-port slice set, the
	// list is what the tracker would build for its ServicePort, and the
	// tracker uses it as it is (most Services have one port and one slice).
	slices.SortStableFunc(out.Endpoints, func(a, b model.Endpoint) int { return a.Addr.Compare(b.Addr) })
	if len(out.Ports) == 1 {
		for i := range out.Endpoints {
			out.Endpoints[i].Port = out.Ports[0].Port
		}
	}

	if v, ok := es.Annotations[v1.EndpointsLastChangeTriggerTime]; ok {
		tt, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			t.report(KindEndpointSlice, ns, name, "invalid trigger time: annotation %s: %v; not used for latency", v1.EndpointsLastChangeTriggerTime, err)
		} else {
			out.TriggerTime = tt
		}
	}
	return out
}

// Node translates the proxy's own Node: its zone label and its InternalIP
// and ExternalIP addresses of the family, in the order listed, without
// duplicates.
func (t *Translator) Node(n *v1.Node) model.Node {
	out := model.Node{Name: n.Name, Zone: n.Labels[v1.LabelTopologyZone]}
	if t.NodeIP.IsValid() && t.inFamily(t.NodeIP) {
		out.Addrs = append(out.Addrs, t.NodeIP)
	}
	for _, na := range n.Status.Addresses {
		if na.Type != v1.NodeInternalIP && na.Type != v1.NodeExternalIP {
			continue
		}
		a, ok := parseIP(na.Address)
		if !ok {
			t.report(KindNode, "", n.Name, "invalid node address: %q is not an IP address; skipped", na.Address)
			continue
		}
		if t.inFamily(a) && !containsAddr(out.Addrs, a) {
			out.Addrs = append(out.Addrs, a)
		}
	}
	return out
}

func containsAddr(addrs []netip.Addr, a netip.Addr) bool {
	for _, b := range addrs {
		if a == b {
			return true
		}
	}
	return false
}

// parseIP parses an address the way Kubernetes does (ParseIPSloppy: legacy
// IPv4 with leading zeros is read as decimal) and unmaps IPv4-in-IPv6, which
// Kubernetes counts as IPv4.
func parseIP(s string) (netip.Addr, bool) {
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// parsePrefix parses a CIDR as Kubernetes does (ParseCIDRSloppy) and returns
// it masked, so "10.0.0.1/8" is 10.0.0.0/8.
func parsePrefix(s string) (netip.Prefix, bool) {
	_, ipn, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	return prefixFromIPNet(ipn)
}

func prefixFromIPNet(ipn *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(ipn.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := ipn.Mask.Size()
	if bits == 0 {
		return netip.Prefix{}, false
	}
	if a.Is4In6() {
		if bits == 128 {
			if ones < 96 {
				return netip.Prefix{}, false
			}
			ones -= 96
		}
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

func portNumber(p int32) (uint16, bool) {
	if p <= 0 || p > 65535 {
		return 0, false
	}
	return uint16(p), true
}
