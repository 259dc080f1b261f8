package differential

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Feature is something a scenario needs from a proxy beyond ClusterIP load
// balancing from the node's own processes.
type Feature string

// Features that scenarios declare.
const (
	// FeatureNodePort is NodePort traffic (TC/XDP in ebpf-proxy).
	FeatureNodePort Feature = "nodeport"
	// FeatureExternalIP is traffic to spec.externalIPs.
	FeatureExternalIP Feature = "externalip"
	// FeatureLoadBalancer is traffic to status.loadBalancer.ingress IPs.
	FeatureLoadBalancer Feature = "loadbalancer"
	// FeatureAffinity is sessionAffinity ClientIP.
	FeatureAffinity Feature = "affinity"
	// FeatureHealthCheck is the healthCheckNodePort server.
	FeatureHealthCheck Feature = "healthchecknodeport"
	// FeatureExternalTraffic is traffic that reaches a node from the
	// network for one of its NodePorts, ExternalIPs or LoadBalancer IPs:
	// in ebpf-proxy the TC/XDP programs, not the socket hooks.
	FeatureExternalTraffic Feature = "external-traffic"
	// FeatureSourceRanges is loadBalancerSourceRanges.
	FeatureSourceRanges Feature = "loadbalancersourceranges"
	// FeatureIPv6 is IPv6 (every IPv6 twin needs it) and
	// FeatureIPv6External IPv6 traffic from the network (the twins of
	// scenarios that need FeatureExternalTraffic).
	FeatureIPv6         Feature = "ipv6"
	FeatureIPv6External Feature = "ipv6-external-traffic"
	// FeatureMesh is a pod's own view of its connections to Services: a
	// service mesh's sidecar in the pod, told where the pod connected
	// (SO_ORIGINAL_DST), must be told the Service. In ebpf-proxy the
	// per-packet translation of pods (--socket-lb-scope=node).
	FeatureMesh Feature = "mesh"
)

// ebpfProxyFeatures are the features ebpf-proxy implements today: its
// socket hooks serve ClusterIPs, NodePorts, ExternalIPs and LoadBalancer IPs
// to clients on the node, with session affinity; its TC programs serve
// them to traffic from the network, with source ranges; both in both
// families; and it serves health check node ports.
var ebpfProxyFeatures = map[Feature]bool{
	FeatureIPv6:            true,
	FeatureIPv6External:    true,
	FeatureNodePort:        true,
	FeatureExternalIP:      true,
	FeatureLoadBalancer:    true,
	FeatureAffinity:        true,
	FeatureHealthCheck:     true,
	FeatureExternalTraffic: true,
	FeatureSourceRanges:    true,
	// The meshed pod is opted out of the socket hooks by its Pod's
	// annotation (runKind): its packets are translated at its device.
	FeatureMesh: true,
}

// ebpfPodsFeatures are those of the BPF mode translating pods per packet
// (--socket-lb-scope=node).
var ebpfPodsFeatures = ebpfProxyFeatures

// Scenario is one behaviour to compare: a sequence of states of some
// Services and EndpointSlices, each followed by probes.
type Scenario struct {
	// Name says what behaviour the scenario shows.
	Name string
	// Needs lists the features ebpf-proxy must have for the scenario to be
	// run against it.
	Needs []Feature
	// Pending, when set, says how ebpf-proxy is known to differ from
	// upstream here, pending a decision by the project's lead: the scenario
	// runs only when EBPF_PROXY_E2E_PENDING=1, and the report names it.
	Pending string
	// KeepsSource, when set, says why ebpf-proxy keeps the client's own
	// address where upstream masquerades it to an address of the node: a
	// documented deviation (docs/architecture/differences.md, "Where ebpf-proxy differs
	// from kube-proxy"). The scenario matches when ebpf-proxy's verdict is
	// upstream's with every node address the endpoints saw read as the
	// client's.
	KeepsSource string
	// VIPs are the scenario's ExternalIPs and LoadBalancer IPs, by name,
	// each with the node the router sends its traffic to.
	VIPs map[string]string
	// Steps run in order.
	Steps []Step
	// IPv6 makes every address of the scenario an IPv6 one: its Services
	// are IPv6 single-stack, its EndpointSlices of type IPv6, its clients
	// and destinations their IPv6 addresses. withIPv6Twins sets it.
	IPv6 bool
}

// Step is the whole desired state of the scenario's objects (what is not
// listed is deleted), and the probes to run once every proxy has it.
type Step struct {
	// Name says what the step changes.
	Name string
	// Services and Slices are every object of the scenario at this step.
	Services []Svc
	Slices   []Slice
	// Probes run once every proxy has programmed the step.
	Probes []Probe
}

// Svc describes a Service. Its ClusterIP, NodePorts and VIP addresses are
// chosen by the runner, stable for the scenario's whole run.
type Svc struct {
	// Name is unique in the scenario.
	Name string
	// Type defaults to ClusterIP.
	Type corev1.ServiceType
	// Headless makes clusterIP None.
	Headless bool
	// ExternalName is the name of an ExternalName Service.
	ExternalName string
	Ports        []Port
	// ITP and ETP are the internal and external traffic policies; empty
	// leaves them to the API server's defaults.
	ITP corev1.ServiceInternalTrafficPolicy
	ETP corev1.ServiceExternalTrafficPolicy
	// TrafficDistribution is spec.trafficDistribution ("" unset): the
	// EndpointSlice controller's input; proxies follow the slices' hints.
	TrafficDistribution string
	// Affinity sets sessionAffinity ClientIP (with the default timeout).
	Affinity bool
	// PublishNotReady sets publishNotReadyAddresses.
	PublishNotReady bool
	// Labels are added to the Service's.
	Labels map[string]string
	// ExternalIPs and LBIngress name VIPs of the scenario.
	ExternalIPs []string
	LBIngress   []Ingress
	// SourceRanges are loadBalancerSourceRanges: client names (their /32)
	// or CIDRs.
	SourceRanges []string
	// DualStack makes the Service RequireDualStack: a ClusterIP of each
	// family, each served by the EndpointSlices of its family.
	DualStack bool
	// PreferDualStack, with DualStack, makes its policy PreferDualStack:
	// the API server gives it both ClusterIPs all the same on this
	// dual-stack cluster.
	PreferDualStack bool
}

// Ingress is a status.loadBalancer.ingress entry.
type Ingress struct {
	// VIP names one of the scenario's VIPs.
	VIP string
	// Proxy sets ipMode Proxy: a load balancer that proxies, whose IP
	// kube-proxy must not capture.
	Proxy bool
}

// Port is a ServicePort.
type Port struct {
	Name  string
	Proto corev1.Protocol
	Port  int32
	// Target is the targetPort, a number or a name.
	Target intstr.IntOrString
}

// Slice describes an EndpointSlice of a Service, written as the EndpointSlice
// controller would (there is none in the test cluster).
type Slice struct {
	// Name is unique in the scenario.
	Name string
	// Service names the Svc the slice belongs to.
	Service string
	// IPv6 makes it an IPv6 slice in an IPv4 scenario (of a DualStack
	// Service).
	IPv6 bool
	// Labels are added to the slice's.
	Labels map[string]string
	Ports  []SlicePort
	Eps    []Ep
}

// SlicePort is an EndpointSlice port.
type SlicePort struct {
	Name  string
	Proto corev1.Protocol
	Port  int32
}

// Ep is an endpoint: a pod of the testbed, on its node and in its zone.
type Ep struct {
	// Pod is a pod of the testbed.
	Pod string
	// Ready, Serving and Terminating are the conditions; nil leaves one
	// unset.
	Ready, Serving, Terminating *bool
	// ZoneHints and NodeHints are the endpoint's hints.
	ZoneHints, NodeHints []string
}

// DestKind says what a probe connects to.
type DestKind int

// Destinations.
const (
	// ClusterIP is the Service's ClusterIP and port.
	ClusterIP DestKind = iota
	// NodePort is a node's IP and the port's NodePort.
	NodePort
	// VIP is one of the scenario's ExternalIPs or LoadBalancer IPs.
	VIP
	// PodIP is a pod, directly.
	PodIP
	// HealthCheck is a node's IP and the Service's healthCheckNodePort.
	HealthCheck
	// LocalhostNodePort is 127.0.0.1 and the port's NodePort, for probes
	// from a node itself.
	LocalhostNodePort
)

// Dest is a probe's destination.
type Dest struct {
	Kind DestKind
	// Service names a Svc of the scenario.
	Service string
	// Port is the Service port (or the pod port for PodIP).
	Port int32
	// Node is the node whose IP a NodePort or health check probe uses.
	Node string
	// VIP or pod name.
	Name string
	// IPv6 is the destination's IPv6 address in an IPv4 scenario (the
	// IPv6 ClusterIP of a DualStack Service, say).
	IPv6 bool
}

// String describes the destination for reports.
func (d Dest) String() string {
	if d.IPv6 {
		v4 := d
		v4.IPv6 = false
		return v4.String() + " over IPv6"
	}
	switch d.Kind {
	case ClusterIP:
		return fmt.Sprintf("ClusterIP of %s:%d", d.Service, d.Port)
	case NodePort:
		return fmt.Sprintf("NodePort of %s:%d on %s", d.Service, d.Port, d.Node)
	case VIP:
		return fmt.Sprintf("%s:%d", d.Name, d.Port)
	case PodIP:
		return fmt.Sprintf("pod %s:%d", d.Name, d.Port)
	case HealthCheck:
		return fmt.Sprintf("healthCheckNodePort of %s on %s", d.Service, d.Node)
	case LocalhostNodePort:
		return fmt.Sprintf("NodePort of %s:%d on 127.0.0.1", d.Service, d.Port)
	}
	return "?"
}

// withIPv6Twins returns scs followed by the IPv6 twin of every scenario
// that applies in IPv6: the same steps and probes with IPv6 addresses,
// named "<name> [IPv6]". NodePorts on 127.0.0.1 have no IPv6 twin:
// kube-proxy never serves NodePorts on ::1.
func withIPv6Twins(scs []Scenario) []Scenario {
	out := slices.Clone(scs)
	for _, sc := range scs {
		if !appliesInIPv6(sc) {
			continue
		}
		tw := sc
		tw.Name = sc.Name + " [IPv6]"
		tw.IPv6 = true
		tw.Needs = append(slices.Clone(sc.Needs), FeatureIPv6)
		if slices.Contains(sc.Needs, FeatureExternalTraffic) {
			tw.Needs = append(tw.Needs, FeatureIPv6External)
		}
		out = append(out, tw)
	}
	return out
}

// usesIPv6 reports whether the scenario has IPv6 Services.
func (sc Scenario) usesIPv6() bool {
	return sc.IPv6 || slices.ContainsFunc(sc.Steps, func(st Step) bool {
		return slices.ContainsFunc(st.Services, func(s Svc) bool { return s.DualStack })
	})
}

// usesSCTP reports whether the scenario has SCTP probes: it runs only
// where the kernel has SCTP (sctpUnavailable).
func (sc Scenario) usesSCTP() bool {
	return slices.ContainsFunc(sc.Steps, func(st Step) bool {
		return slices.ContainsFunc(st.Probes, func(p Probe) bool { return p.Proto == sctp })
	})
}

func appliesInIPv6(sc Scenario) bool {
	for _, st := range sc.Steps {
		for _, s := range st.Services {
			if s.DualStack {
				return false // already both families
			}
		}
		for _, p := range st.Probes {
			if p.To.Kind == LocalhostNodePort {
				return false
			}
		}
	}
	return true
}

// Probe is traffic from one client to one destination.
type Probe struct {
	// From is a client: see the client constants, or "pod:<name>".
	From string
	// To is where it connects.
	To Dest
	// Proto is TCP (connect, read the answer), UDP (a connected socket,
	// send and receive) or SCTP (an association, read the answer; only
	// where the kernel has SCTP: usesSCTP).
	Proto corev1.Protocol
	// Sticky probes expect session affinity: their verdict says whether
	// every attempt reached the same endpoint instead of listing it.
	Sticky bool
	// Hold names a TCP connection the scenario keeps open across its
	// steps: the first probe with the name opens it (one attempt) and
	// later ones, whatever their To, send a line on it and ask the socket
	// its peer (getpeername), as a long-lived client would after the
	// steps' changes. For UDP it names a flow: the first probe sends one
	// datagram from a connected socket, and later ones, whatever their To,
	// one more each from the same source port to the same address, as a
	// sender that keeps its socket (statsd, a resolver) does: one
	// conntrack entry, which the flush between steps spares, as it spares
	// the held TCP connections.
	Hold string
	// Mesh, for a TCP probe from meshPod, has the pod's outbound TCP
	// redirected to a sidecar proxy in the pod, as a service mesh's init
	// container does; the proxy asks where each connection was going
	// (SO_ORIGINAL_DST) and connects there. The verdict says what it was
	// told.
	Mesh bool
	// Then, for a UDP probe, connects the probe's socket again, to Then,
	// after its exchange with To, and exchanges again on it: one attempt,
	// whose verdict is To's, " THEN ", and Then's
	// (sandbox.Client.UDPReconnects).
	Then *Dest
}

// String describes the probe for reports.
func (p Probe) String() string {
	s := fmt.Sprintf("%s → %s/%s", p.From, p.To, p.Proto)
	if p.To.Kind == HealthCheck {
		s = fmt.Sprintf("%s → %s (HTTP)", p.From, p.To)
	}
	if p.Sticky {
		s += " (same client each time)"
	}
	if p.Hold != "" {
		s += " (held as " + p.Hold + ")"
	}
	if p.Then != nil {
		s += ", then the same socket → " + p.Then.String()
	}
	return s
}

// Clients of the testbed.
const (
	clientA = "node-a-client" // a pod on node-a
	clientB = "node-b-client" // a pod on node-b
	selfA   = "node-a"        // node-a itself
	selfB   = "node-b"        // node-b itself
	ext     = "ext"           // outside the cluster, 198.18.0.10
	ext2    = "ext2"          // outside the cluster, 198.18.0.11
)

const (
	tcp  = corev1.ProtocolTCP
	udp  = corev1.ProtocolUDP
	sctp = corev1.ProtocolSCTP
)

// Builders, to keep the table readable.

func yes() *bool { t := true; return &t }
func no() *bool  { f := false; return &f }

// ready is an endpoint of a ready pod, as the controller writes it.
func ready(pod string) Ep { return Ep{Pod: pod, Ready: yes(), Serving: yes(), Terminating: no()} }

// unset is an endpoint without conditions (ready by default).
func unset(pod string) Ep { return Ep{Pod: pod} }

// notReady is a running pod that fails its readiness probe.
func notReady(pod string) Ep { return Ep{Pod: pod, Ready: no(), Serving: no(), Terminating: no()} }

// servingTerminating is a terminating pod that still passes readiness.
func servingTerminating(pod string) Ep {
	return Ep{Pod: pod, Ready: no(), Serving: yes(), Terminating: yes()}
}

// terminating is a terminating pod that no longer passes readiness.
func terminating(pod string) Ep { return Ep{Pod: pod, Ready: no(), Serving: no(), Terminating: yes()} }

func (e Ep) zones(z ...string) Ep { e.ZoneHints = z; return e }
func (e Ep) nodes(n ...string) Ep { e.NodeHints = n; return e }

func port(name string, proto corev1.Protocol, p int32, target any) Port {
	var t intstr.IntOrString
	switch v := target.(type) {
	case int:
		t = intstr.FromInt32(int32(v))
	case string:
		t = intstr.FromString(v)
	default:
		panic(fmt.Sprintf("target port %v", target))
	}
	return Port{Name: name, Proto: proto, Port: p, Target: t}
}

func sport(name string, proto corev1.Protocol, p int32) SlicePort {
	return SlicePort{Name: name, Proto: proto, Port: p}
}

// web is the usual Service: port 80/TCP ("http") to 8080.
func web(opts ...func(*Svc)) Svc {
	s := Svc{Name: "web", Ports: []Port{port("http", tcp, 80, 8080)}}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// dual gives s port 80 over both TCP ("http") and UDP ("dns"), to 8080.
func dual(s Svc) Svc {
	s.Ports = []Port{port("http", tcp, 80, 8080), port("dns", udp, 80, 8080)}
	return s
}

// dualSlice is the slice of a dual web.
func dualSlice(eps ...Ep) Slice {
	return Slice{Name: "web-1", Service: "web", Ports: []SlicePort{sport("http", tcp, 8080), sport("dns", udp, 8080)}, Eps: eps}
}

// webSlice is the usual slice of web: port "http" 8080/TCP.
func webSlice(eps ...Ep) Slice {
	return Slice{Name: "web-1", Service: "web", Ports: []SlicePort{sport("http", tcp, 8080)}, Eps: eps}
}

func withType(t corev1.ServiceType) func(*Svc) { return func(s *Svc) { s.Type = t } }
func withITP(p corev1.ServiceInternalTrafficPolicy) func(*Svc) {
	return func(s *Svc) { s.ITP = p }
}
func withETP(p corev1.ServiceExternalTrafficPolicy) func(*Svc) {
	return func(s *Svc) { s.ETP = p }
}
func withLabels(kv ...string) func(*Svc) {
	return func(s *Svc) { s.Labels = pairs(kv) }
}
func withPorts(ps ...Port) func(*Svc) { return func(s *Svc) { s.Ports = ps } }
func withExternalIPs(vips ...string) func(*Svc) {
	return func(s *Svc) { s.ExternalIPs = vips }
}
func withIngress(in ...Ingress) func(*Svc) { return func(s *Svc) { s.LBIngress = in } }
func withAffinity(s *Svc)                  { s.Affinity = true }

// withTrafficDistribution sets spec.trafficDistribution.
func withTrafficDistribution(td string) func(*Svc) {
	return func(s *Svc) { s.TrafficDistribution = td }
}
func withPublishNotReady(s *Svc) { s.PublishNotReady = true }

func pairs(kv []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func (s Slice) labeled(kv ...string) Slice { s.Labels = pairs(kv); return s }

func cip(svc string, p int32) Dest { return Dest{Kind: ClusterIP, Service: svc, Port: p} }

// over6 is d's IPv6 address.
func over6(d Dest) Dest { d.IPv6 = true; return d }
func np(svc string, p int32, node string) Dest {
	return Dest{Kind: NodePort, Service: svc, Port: p, Node: node}
}
func vip(name string, p int32) Dest { return Dest{Kind: VIP, Name: name, Port: p} }
func pod(name string, p int32) Dest { return Dest{Kind: PodIP, Name: name, Port: p} }
func hcnp(svc, node string) Dest    { return Dest{Kind: HealthCheck, Service: svc, Node: node} }
func probe(proto corev1.Protocol, from string, to Dest) []Probe {
	return []Probe{{From: from, To: to, Proto: proto}}
}
func sticky(from string, to Dest) []Probe { return stickyOver(tcp, from, to) }
func stickyOver(proto corev1.Protocol, from string, to Dest) []Probe {
	return []Probe{{From: from, To: to, Proto: proto, Sticky: true}}
}
func httpGet(from string, to Dest) []Probe { return []Probe{{From: from, To: to, Proto: tcp}} }

// inCluster probes dst from a pod and from the node itself, on both nodes.
func inCluster(proto corev1.Protocol, to Dest) []Probe {
	var out []Probe
	for _, from := range []string{clientA, selfA, clientB, selfB} {
		out = append(out, probe(proto, from, to)...)
	}
	return out
}

// from probes dst from each client in froms.
func from(proto corev1.Protocol, to Dest, froms ...string) []Probe {
	var out []Probe
	for _, f := range froms {
		out = append(out, probe(proto, f, to)...)
	}
	return out
}

func ps(groups ...[]Probe) []Probe { return slices.Concat(groups...) }

// meshed is a TCP probe to d from the meshed pod, through its sidecar.
func meshed(d Dest) []Probe { return []Probe{{From: "pod:" + meshPod, To: d, Proto: tcp, Mesh: true}} }

// missing returns the features of needs that have lacks.
func missing(needs []Feature, have map[Feature]bool) []string {
	var out []string
	for _, f := range needs {
		if !have[f] {
			out = append(out, string(f))
		}
	}
	return out
}

// check validates a scenario table: names unique, every step probing
// something, probes naming known clients.
func check(scenarios []Scenario) error {
	seen := map[string]bool{}
	for _, sc := range scenarios {
		if seen[sc.Name] {
			return fmt.Errorf("scenario %q twice", sc.Name)
		}
		seen[sc.Name] = true
		if len(sc.Steps) == 0 {
			return fmt.Errorf("scenario %q has no steps", sc.Name)
		}
		for i, st := range sc.Steps {
			if len(st.Probes) == 0 {
				return fmt.Errorf("scenario %q step %d (%s) probes nothing", sc.Name, i+1, st.Name)
			}
			for _, p := range st.Probes {
				if p.Mesh && (p.From != "pod:"+meshPod || p.Proto == udp || p.Hold != "" || p.Then != nil) {
					return fmt.Errorf("scenario %q step %d: a mesh probe is a plain TCP probe from pod:%s", sc.Name, i+1, meshPod)
				}
				if !p.Mesh && p.From == "pod:"+meshPod {
					return fmt.Errorf("scenario %q step %d: pod:%s is the meshed pod: its probes are mesh probes", sc.Name, i+1, meshPod)
				}
				if p.Proto == sctp && (p.Hold != "" || p.Then != nil || p.Mesh || p.To.Kind == HealthCheck) {
					return fmt.Errorf("scenario %q step %d: an SCTP probe is a plain or sticky one", sc.Name, i+1)
				}
				switch {
				case p.From == clientA, p.From == clientB, p.From == selfA, p.From == selfB, p.From == ext, p.From == ext2,
					strings.HasPrefix(p.From, "pod:"):
				default:
					return fmt.Errorf("scenario %q step %d: unknown client %q", sc.Name, i+1, p.From)
				}
			}
		}
	}
	return nil
}
