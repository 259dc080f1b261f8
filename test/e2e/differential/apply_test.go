package differential

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// scenarioLabel marks every object of a scenario, so that a step can find
// what the previous one left.
const scenarioLabel = "e2e.ebpf-proxy.io/scenario"

// world is one proxy kind's run: its testbed, namespace and the addresses
// given to the scenarios' Services. Addresses are chosen here rather than by
// the API server so that a probe can reach an address after its Service is
// gone, and so that no address is reused by another scenario meanwhile.
type world struct {
	kind  testbed.Kind
	index int // of the kind, to keep address ranges apart
	tb    *testbed.Testbed
	cs    kubernetes.Interface
	ns    string

	mu         sync.Mutex
	clusterIPs map[string]netip.Addr
	nodePorts  map[string]int32
	vips       map[string]netip.Addr
	// held are the connections the scenarios hold (Probe.Hold), by
	// scenario and name.
	held map[string]*heldConn
	// mesh is the sidecar proxy of meshPod (Probe.Mesh); meshMu keeps its
	// probes one at a time, so that what it was told is the probe's.
	mesh   *sandbox.RedirectProxy
	meshMu sync.Mutex
}

// heldConn is a connection a scenario holds open (TCP), or a flow it
// keeps sending on (UDP: h is nil and local the source the first datagram
// went from), with the address it connected to.
type heldConn struct {
	h     *sandbox.Held
	local netip.AddrPort
	dst   netip.AddrPort
}

// source is the held connection's or flow's client address, or the zero
// AddrPort if it never opened.
func (c *heldConn) source() netip.AddrPort {
	if c.h == nil {
		return c.local
	}
	if c.h.First.Err != "" {
		return netip.AddrPort{}
	}
	return c.h.First.Local
}

// heldSources are the client addresses of the held connections and flows,
// which the flush between waves spares.
func (w *world) heldSources() map[netip.AddrPort]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := map[netip.AddrPort]bool{}
	for _, c := range w.held {
		if src := c.source(); src.IsValid() {
			keep[netip.AddrPortFrom(src.Addr().Unmap(), src.Port())] = true
		}
	}
	return keep
}

func newWorld(kind testbed.Kind, index int, tb *testbed.Testbed, ns string) *world {
	return &world{kind: kind, index: index, tb: tb, cs: tb.Cluster.Clientset(), ns: ns,
		clusterIPs: map[string]netip.Addr{}, nodePorts: map[string]int32{}, vips: map[string]netip.Addr{}, held: map[string]*heldConn{}}
}

// Address plan inside the API server's 10.96.0.0/16 (and, for IPv6
// scenarios, fd00:10:96::/112 with the same last 16 bits) and the default
// NodePort range, one block per proxy kind.
const (
	clusterIPBlocks = 4 // /24 blocks of ClusterIPs per kind
	nodePortBase    = 30000
	nodePortsPerRun = 450 // six kinds within 30000-32767
)

func prefix(sc int) string { return tag(sc) + "-" }

// tag is the value of scenarioLabel on scenario sc's objects.
func tag(sc int) string { return fmt.Sprintf("s%02d", sc) }

// clusterIP returns the ClusterIP of a Service of scenario sc, of the
// scenario's family.
func (w *world) clusterIP(sc int, svc string) (netip.Addr, error) {
	return w.clusterIPOf(sc, svc, scenarios[sc].IPv6)
}

// clusterIPOf returns the ClusterIP of a Service of scenario sc in the
// family ipv6 says.
func (w *world) clusterIPOf(sc int, svc string, ipv6 bool) (netip.Addr, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := prefix(sc) + svc
	if ipv6 {
		key += "/IPv6"
	}
	if ip, ok := w.clusterIPs[key]; ok {
		return ip, nil
	}
	n := len(w.clusterIPs)
	if n >= clusterIPBlocks*250 {
		return netip.Addr{}, fmt.Errorf("out of ClusterIPs for %s", w.kind)
	}
	block, host := byte(16+w.index*clusterIPBlocks+n/250), byte(n%250+1)
	ip := netip.AddrFrom4([4]byte{10, 96, block, host})
	if ipv6 {
		ip = ipv6Service(block, host)
	}
	w.clusterIPs[key] = ip
	return ip, nil
}

// ipv6Service is the address of fd00:10:96::/112 (the API server's IPv6
// Service range) whose last two bytes are hi and lo.
func ipv6Service(hi, lo byte) netip.Addr {
	a := sandbox.ServiceCIDR6.Addr().As16()
	a[14], a[15] = hi, lo
	return netip.AddrFrom16(a)
}

// nodePort returns the NodePort of a Service port number of scenario sc;
// TCP and UDP ports with the same number share it.
func (w *world) nodePort(sc int, svc string, port int32) (int32, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := fmt.Sprintf("%s%s/%d", prefix(sc), svc, port)
	if p, ok := w.nodePorts[key]; ok {
		return p, nil
	}
	n := len(w.nodePorts)
	if n >= nodePortsPerRun {
		return 0, fmt.Errorf("out of NodePorts for %s", w.kind)
	}
	p := int32(nodePortBase + w.index*nodePortsPerRun + n)
	w.nodePorts[key] = p
	return p, nil
}

// addVIPs gives each VIP of scenario sc an address in 198.19.0.0/24 (in
// IPv6 scenarios its twin in fd00:198:19::/64) and routes it to its node.
func (w *world) addVIPs(sc int, vips map[string]string) error {
	names := make([]string, 0, len(vips))
	for name := range vips {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		node := w.tb.Node(vips[name])
		if node == nil {
			return fmt.Errorf("VIP %s: no node %s", name, vips[name])
		}
		w.mu.Lock()
		n := len(w.vips)
		ip := netip.AddrFrom4([4]byte{198, 19, 0, byte(10 + n)})
		if scenarios[sc].IPv6 {
			ip = sandbox.IPv6Of(ip)
		}
		w.vips[prefix(sc)+name] = ip
		w.mu.Unlock()
		if n >= 200 {
			return fmt.Errorf("out of VIPs")
		}
		if err := w.tb.RouteToNode(ip, node); err != nil {
			return err
		}
	}
	return nil
}

func (w *world) vip(sc int, name string) (netip.Addr, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ip, ok := w.vips[prefix(sc)+name]
	if !ok {
		return netip.Addr{}, fmt.Errorf("scenario declares no VIP %q", name)
	}
	return ip, nil
}

// clientIP resolves a client name used in loadBalancerSourceRanges of
// scenario sc to its address of the scenario's family.
func (w *world) clientIP(sc int, name string) (netip.Addr, error) {
	c, err := w.client(name)
	if err != nil {
		return netip.Addr{}, err
	}
	return w.addr(sc, c.Host), nil
}

// addr is h's address of scenario sc's family.
func (w *world) addr(sc int, h *sandbox.Host) netip.Addr { return addrOf(h, scenarios[sc].IPv6) }

// addrOf is h's IPv6 address with ipv6, else its IPv4 one.
func addrOf(h *sandbox.Host, ipv6 bool) netip.Addr {
	if ipv6 {
		return h.IP6
	}
	return h.IP
}

// service renders s as scenario sc's Service, with the load balancer
// ingress to write into its status.
func (w *world) service(sc int, s Svc) (*corev1.Service, []corev1.LoadBalancerIngress, error) {
	typ := s.Type
	if typ == "" {
		typ = corev1.ServiceTypeClusterIP
	}
	labels := map[string]string{scenarioLabel: tag(sc)}
	for k, v := range s.Labels {
		labels[k] = v
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: prefix(sc) + s.Name, Namespace: w.ns, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type:                     typ,
			PublishNotReadyAddresses: s.PublishNotReady,
			SessionAffinity:          corev1.ServiceAffinityNone,
		},
	}
	switch {
	case typ == corev1.ServiceTypeExternalName:
		svc.Spec.ExternalName = s.ExternalName
	case s.Headless:
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	default:
		ip, err := w.clusterIP(sc, s.Name)
		if err != nil {
			return nil, nil, err
		}
		svc.Spec.ClusterIP = ip.String()
		switch {
		case scenarios[sc].IPv6:
			single := corev1.IPFamilyPolicySingleStack
			svc.Spec.IPFamilies, svc.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv6Protocol}, &single
		case s.DualStack:
			ip6, err := w.clusterIPOf(sc, s.Name, true)
			if err != nil {
				return nil, nil, err
			}
			dual := corev1.IPFamilyPolicyRequireDualStack
			if s.PreferDualStack {
				dual = corev1.IPFamilyPolicyPreferDualStack
			}
			svc.Spec.ClusterIPs = []string{ip.String(), ip6.String()}
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
			svc.Spec.IPFamilyPolicy = &dual
		}
	}
	if typ != corev1.ServiceTypeExternalName {
		for _, p := range s.Ports {
			sp := corev1.ServicePort{Name: p.Name, Protocol: p.Proto, Port: p.Port, TargetPort: p.Target}
			if typ == corev1.ServiceTypeNodePort || typ == corev1.ServiceTypeLoadBalancer {
				np, err := w.nodePort(sc, s.Name, p.Port)
				if err != nil {
					return nil, nil, err
				}
				sp.NodePort = np
			}
			svc.Spec.Ports = append(svc.Spec.Ports, sp)
		}
	}
	if s.ITP != "" {
		itp := s.ITP
		svc.Spec.InternalTrafficPolicy = &itp
	}
	svc.Spec.ExternalTrafficPolicy = s.ETP
	if s.TrafficDistribution != "" {
		td := s.TrafficDistribution
		svc.Spec.TrafficDistribution = &td
	}
	if typ == corev1.ServiceTypeLoadBalancer && s.ETP == corev1.ServiceExternalTrafficPolicyLocal {
		// Planned as the NodePorts are: one the API server picked would
		// land anywhere in the range, now and then on a port planned
		// for a Service applied after it.
		hc, err := w.nodePort(sc, s.Name, 0)
		if err != nil {
			return nil, nil, err
		}
		svc.Spec.HealthCheckNodePort = hc
	}
	if s.Affinity {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	for _, name := range s.ExternalIPs {
		ip, err := w.vip(sc, name)
		if err != nil {
			return nil, nil, err
		}
		svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, ip.String())
	}
	for _, r := range s.SourceRanges {
		if p, err := netip.ParsePrefix(r); err == nil {
			if p.Addr().Is4() && scenarios[sc].IPv6 {
				return nil, nil, fmt.Errorf("source range %s in an IPv6 scenario: name a client instead", p)
			}
			svc.Spec.LoadBalancerSourceRanges = append(svc.Spec.LoadBalancerSourceRanges, p.String())
			continue
		}
		ip, err := w.clientIP(sc, r)
		if err != nil {
			return nil, nil, err
		}
		svc.Spec.LoadBalancerSourceRanges = append(svc.Spec.LoadBalancerSourceRanges, netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	var ingress []corev1.LoadBalancerIngress
	for _, in := range s.LBIngress {
		ip, err := w.vip(sc, in.VIP)
		if err != nil {
			return nil, nil, err
		}
		mode := corev1.LoadBalancerIPModeVIP
		if in.Proxy {
			mode = corev1.LoadBalancerIPModeProxy
		}
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: &mode})
	}
	return svc, ingress, nil
}

// slice renders sl as scenario sc's EndpointSlice, written the way the
// EndpointSlice controller writes one: the Service's name label, each
// endpoint's node and zone.
func (w *world) slice(sc int, sl Slice) (*discoveryv1.EndpointSlice, error) {
	labels := map[string]string{
		scenarioLabel:                tag(sc),
		discoveryv1.LabelServiceName: prefix(sc) + sl.Service,
		discoveryv1.LabelManagedBy:   "e2e.ebpf-proxy.io",
	}
	for k, v := range sl.Labels {
		labels[k] = v
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: prefix(sc) + sl.Name, Namespace: w.ns, Labels: labels},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	ipv6 := scenarios[sc].IPv6 || sl.IPv6
	if ipv6 {
		es.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, p := range sl.Ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(p.Name), Protocol: ptr(p.Proto), Port: ptr(p.Port)})
	}
	for _, ep := range sl.Eps {
		pod, node := w.tb.Pod(ep.Pod)
		if pod == nil {
			return nil, fmt.Errorf("endpoint %s: no such pod", ep.Pod)
		}
		e := discoveryv1.Endpoint{
			Addresses:  []string{addrOf(pod.Host, ipv6).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ep.Ready, Serving: ep.Serving, Terminating: ep.Terminating},
			NodeName:   ptr(node.Spec.Name),
		}
		if node.Spec.Zone != "" {
			e.Zone = ptr(node.Spec.Zone)
		}
		if len(ep.ZoneHints) > 0 || len(ep.NodeHints) > 0 {
			e.Hints = &discoveryv1.EndpointHints{}
			for _, z := range ep.ZoneHints {
				e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range ep.NodeHints {
				e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es, nil
}

func ptr[T any](v T) *T { return &v }

// apply makes the API server hold exactly step's objects for scenario sc:
// it creates and replaces what the step lists and deletes the rest, as
// `kubectl apply --prune` would.
func (w *world) apply(ctx context.Context, sc int, step Step) error {
	sel := metav1.ListOptions{LabelSelector: scenarioLabel + "=" + tag(sc)}
	services := w.cs.CoreV1().Services(w.ns)
	want := map[string]bool{}
	for _, s := range step.Services {
		svc, ingress, err := w.service(sc, s)
		if err != nil {
			return err
		}
		want[svc.Name] = true
		cur, err := services.Get(ctx, svc.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			cur, err = services.Create(ctx, svc, metav1.CreateOptions{})
		case err == nil:
			svc.ResourceVersion = cur.ResourceVersion
			cur, err = services.Update(ctx, svc, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("service %s: %w", svc.Name, err)
		}
		if len(ingress) > 0 {
			cur.Status.LoadBalancer.Ingress = ingress
			if _, err := services.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("status of service %s: %w", svc.Name, err)
			}
		}
	}
	list, err := services.List(ctx, sel)
	if err != nil {
		return err
	}
	for _, svc := range list.Items {
		if !want[svc.Name] {
			if err := services.Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete service %s: %w", svc.Name, err)
			}
		}
	}

	eps := w.cs.DiscoveryV1().EndpointSlices(w.ns)
	want = map[string]bool{}
	for _, sl := range step.Slices {
		es, err := w.slice(sc, sl)
		if err != nil {
			return err
		}
		want[es.Name] = true
		cur, err := eps.Get(ctx, es.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = eps.Create(ctx, es, metav1.CreateOptions{})
		case err == nil:
			es.ResourceVersion = cur.ResourceVersion
			_, err = eps.Update(ctx, es, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("endpointslice %s: %w", es.Name, err)
		}
	}
	slist, err := eps.List(ctx, sel)
	if err != nil {
		return err
	}
	for _, es := range slist.Items {
		if !want[es.Name] {
			if err := eps.Delete(ctx, es.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete endpointslice %s: %w", es.Name, err)
			}
		}
	}
	return nil
}

// barrier creates a Service of its own after every change of a wave and
// waits until each node's proxy serves it. Services and EndpointSlices each
// come to a proxy on one ordered watch, and both proxies fold every change
// received into their next sync, so once the barrier's Service and slice
// are programmed, so is everything written before them. A proxy syncs each
// IP family on its own (kube-proxy's per-family proxiers), so with IPv6
// scenarios in the wave there is an IPv6 barrier too.
func (w *world) barrier(ctx context.Context, wave int, ipv6 bool) error {
	families := []bool{false}
	if ipv6 {
		families = append(families, true)
	}
	a1, node := w.tb.Pod("a1")
	var dsts []netip.AddrPort
	for _, v6 := range families {
		name := fmt.Sprintf("barrier-%d", wave)
		block, host := byte(64+w.index), byte(wave+1)
		ip, ep := netip.AddrFrom4([4]byte{10, 96, block, host}), a1.IP
		family := builders.ServiceOption(nil)
		slice := func(es *discoveryv1.EndpointSlice) { es.Labels[scenarioLabel] = "barrier" }
		if v6 {
			name += "-ipv6"
			ip, ep = ipv6Service(block, host), a1.IP6
			family = func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} }
			slice = func(es *discoveryv1.EndpointSlice) {
				es.Labels[scenarioLabel] = "barrier"
				es.AddressType = discoveryv1.AddressTypeIPv6
			}
		}
		svc := builders.Service(w.ns, name, builders.ClusterIP(ip.String()), family,
			func(s *corev1.Service) { s.Labels = map[string]string{scenarioLabel: "barrier"} })
		if _, err := w.cs.CoreV1().Services(w.ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create barrier: %w", err)
		}
		es := builders.EndpointSlice(w.ns, name, name, []discoveryv1.Endpoint{builders.Endpoint(ep.String(), node.Spec.Name)}, slice)
		if _, err := w.cs.DiscoveryV1().EndpointSlices(w.ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create barrier slice: %w", err)
		}
		dsts = append(dsts, netip.AddrPortFrom(ip, 80))
	}
	for _, dst := range dsts {
		for _, n := range w.tb.Nodes {
			if err := waitReachable(ctx, n.Self, dst); err != nil {
				return fmt.Errorf("barrier %d on %s: %w", wave, n.Spec.Name, err)
			}
		}
	}
	return nil
}

// cleanup deletes every object of the run.
func (w *world) cleanup(ctx context.Context) error {
	var errs []error
	w.mu.Lock()
	for _, c := range w.held {
		if c.h != nil {
			c.h.Close()
		}
	}
	w.held = map[string]*heldConn{}
	w.mu.Unlock()
	// Services have no deletecollection: one by one.
	list, err := w.cs.CoreV1().Services(w.ns).List(ctx, metav1.ListOptions{LabelSelector: scenarioLabel})
	if err != nil {
		errs = append(errs, err)
	} else {
		for _, s := range list.Items {
			if err := w.cs.CoreV1().Services(w.ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	if err := w.cs.DiscoveryV1().EndpointSlices(w.ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: scenarioLabel}); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("delete objects of the %s run: %v", w.kind, errs)
	}
	return nil
}
