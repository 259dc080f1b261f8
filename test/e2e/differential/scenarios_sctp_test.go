package differential

import (
	corev1 "k8s.io/api/core/v1"
)

// assoc is the SCTP Service of sctpScenarios: port 7777 ("sctp") to the
// pods' SCTP port 7070.
func assoc(opts ...func(*Svc)) Svc {
	s := Svc{Name: "assoc", Ports: []Port{port("sctp", sctp, 7777, 7070)}}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// assocSlice is assoc's slice.
func assocSlice(eps ...Ep) Slice {
	return Slice{Name: "assoc-1", Service: "assoc", Ports: []SlicePort{sport("sctp", sctp, 7070)}, Eps: eps}
}

// sctpScenarios compare how SCTP Services are served. They run where the
// kernel has SCTP: in the 6.1 and 6.12 guests (make differential-sctp),
// not on this machine's kernel, which lacks the module. ebpf-proxy's BPF
// mode serves SCTP beside its programs, through netfilter (docs/
// architecture/differences.md): these scenarios are what says it serves it
// as kube-proxy does, each with its IPv6 twin. Each has at most two steps:
// a step costs the guests' run about half a minute per kind.
var sctpScenarios = []Scenario{
	{
		Name: "sctp: ClusterIP from pods and nodes; endpoints replaced",
		Steps: []Step{
			{Name: "a1 and b1 ready", Services: []Svc{assoc()}, Slices: []Slice{assocSlice(ready("a1"), ready("b1"))},
				Probes: inCluster(sctp, cip("assoc", 7777))},
			{Name: "replaced by a2", Services: []Svc{assoc()}, Slices: []Slice{assocSlice(ready("a2"))},
				Probes: inCluster(sctp, cip("assoc", 7777))},
		},
	},
	{
		Name:  "sctp: no endpoints, through the ClusterIP and the NodePort",
		Needs: []Feature{FeatureNodePort, FeatureExternalTraffic},
		Steps: []Step{{
			Name: "an EndpointSlice without endpoints", Services: []Svc{assoc(withType(corev1.ServiceTypeNodePort))}, Slices: []Slice{assocSlice()},
			Probes: ps(from(sctp, cip("assoc", 7777), clientA, selfB), from(sctp, np("assoc", 7777, selfA), ext)),
		}},
	},
	{
		// One port number over the three protocols: each is its own
		// ServicePort, and an SCTP association is never taken for a
		// TCP connection (nor the reverse) by a proxy that keys its
		// Services by protocol.
		Name: "sctp: an SCTP port beside TCP and UDP ports of the same number",
		Steps: func() []Step {
			svc := Svc{Name: "multi", Ports: []Port{port("tcp", tcp, 80, 8080), port("udp", udp, 80, 8080), port("sctp", sctp, 80, 7070)}}
			slice := func(eps ...Ep) Slice {
				return Slice{Name: "multi-1", Service: "multi", Ports: []SlicePort{sport("tcp", tcp, 8080), sport("udp", udp, 8080),
					sport("sctp", sctp, 7070)}, Eps: eps}
			}
			probes := ps(from(tcp, cip("multi", 80), clientA, selfB), from(udp, cip("multi", 80), clientA),
				from(sctp, cip("multi", 80), clientA, selfB))
			return []Step{
				{Name: "b1 serves all three", Services: []Svc{svc}, Slices: []Slice{slice(ready("b1"))}, Probes: probes},
				{Name: "the SCTP port removed from the Service", Services: []Svc{{Name: "multi", Ports: svc.Ports[:2]}},
					Slices: []Slice{slice(ready("b1"))}, Probes: probes},
			}
		}(),
	},
	{
		Name:  "sctp: NodePort from outside and from a pod through both nodes, externalTrafficPolicy Cluster",
		Needs: []Feature{FeatureNodePort, FeatureExternalTraffic},
		Steps: []Step{{
			Name: "a1 on node-a", Services: []Svc{assoc(withType(corev1.ServiceTypeNodePort))}, Slices: []Slice{assocSlice(ready("a1"))},
			Probes: ps(from(sctp, np("assoc", 7777, selfA), ext), from(sctp, np("assoc", 7777, selfB), ext),
				from(sctp, np("assoc", 7777, selfB), clientA)),
		}},
	},
	{
		Name:  "sctp: NodePort from outside and from a pod through both nodes, externalTrafficPolicy Local",
		Needs: []Feature{FeatureNodePort, FeatureExternalTraffic},
		Steps: []Step{{
			Name:     "a1 on node-a",
			Services: []Svc{assoc(withType(corev1.ServiceTypeNodePort), withETP(corev1.ServiceExternalTrafficPolicyLocal))},
			Slices:   []Slice{assocSlice(ready("a1"))},
			Probes: ps(from(sctp, np("assoc", 7777, selfA), ext), from(sctp, np("assoc", 7777, selfB), ext),
				from(sctp, np("assoc", 7777, selfB), clientA)),
		}},
	},
	{
		Name:  "sctp: LoadBalancer IP from outside and from the cluster",
		Needs: []Feature{FeatureLoadBalancer, FeatureExternalTraffic},
		VIPs:  map[string]string{"l1": selfA},
		Steps: []Step{{
			Name:     "a1 and b1 ready",
			Services: []Svc{assoc(withType(corev1.ServiceTypeLoadBalancer), withIngress(Ingress{VIP: "l1"}))},
			Slices:   []Slice{assocSlice(ready("a1"), ready("b1"))},
			Probes:   ps(from(sctp, vip("l1", 7777), ext, clientB, selfB)),
		}},
	},
	{
		Name:  "sctp: ClientIP session affinity",
		Needs: []Feature{FeatureAffinity},
		Steps: []Step{{
			Name:     "a1, a2, b1 and b2 ready",
			Services: []Svc{assoc(withAffinity)},
			Slices:   []Slice{assocSlice(ready("a1"), ready("a2"), ready("b1"), ready("b2"))},
			Probes:   ps(stickyOver(sctp, clientA, cip("assoc", 7777)), stickyOver(sctp, selfB, cip("assoc", 7777))),
		}},
	},
}
