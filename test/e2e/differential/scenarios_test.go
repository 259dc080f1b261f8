package differential

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

const (
	labelProxyName = "service.kubernetes.io/service-proxy-name"
	labelHeadless  = "service.kubernetes.io/headless"
)

// The testbed of every scenario: node-a (zone-a) runs pods a1 and a2,
// node-b (zone-b) runs b1 and b2; every pod serves TCP 8080, 8081, 9090,
// UDP 8080, 9090 and, where the kernel has SCTP, SCTP 7070, answering
// "<pod>:<port>". Each node also has a client
// pod (node-x-client); ext and ext2 are outside the cluster.
var (
	podTCPPorts  = []uint16{8080, 8081, 9090}
	podUDPPorts  = []uint16{8080, 9090}
	podSCTPPorts = []uint16{7070}
)

// scenarios is the table, followed by the IPv6 twins of its scenarios.
// Each step states the whole world of the scenario; the verdicts come from
// traffic only.
var scenarios = withIPv6Twins(slices.Concat(table, sctpScenarios))

// table holds the scenarios of TCP and UDP; sctpScenarios those of SCTP.
var table = []Scenario{
	// ---- ClusterIP: endpoint selection ----
	{
		Name: "clusterip: ready endpoints on both nodes; replaced, renumbered, removed",
		Steps: []Step{
			{
				Name:     "a1 and b1 ready",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "endpoints replaced by a2 and b2",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(ready("a2"), ready("b2"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "endpoint port changed to 9090",
				Services: []Svc{web()},
				Slices: []Slice{{Name: "web-1", Service: "web", Ports: []SlicePort{sport("http", tcp, 9090)},
					Eps: []Ep{ready("a2"), ready("b2")}}},
				Probes: inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "EndpointSlice deleted",
				Services: []Svc{web()},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
		},
	},
	{
		// A long-lived client: kube-proxy's conntrack entry keeps
		// translating its connection after the rules change, and the
		// socket's peer is the address it connected to.
		Name: "clusterip: a held connection goes on when its port is renumbered, its peer still the port it connected to",
		Steps: func() []Step {
			held := func(to Dest) []Probe { return []Probe{{From: clientA, To: to, Proto: tcp, Hold: "web"}} }
			svc := func(p int32) []Svc { return []Svc{{Name: "web", Ports: []Port{port("http", tcp, p, 8080)}}} }
			slices := []Slice{webSlice(ready("b1"))}
			return []Step{
				{Name: "port 80 to b1, a connection held", Services: svc(80), Slices: slices, Probes: held(cip("web", 80))},
				{Name: "port renumbered to 81", Services: svc(81), Slices: slices,
					Probes: ps(held(cip("web", 80)), from(tcp, cip("web", 81), clientA))},
			}
		}(),
	},
	{
		// A rolling update's graceful drain: an endpoint that fails
		// readiness or is terminating takes no new connection, and the
		// ones it has go on. The scenarios share the pods, so b1:8080
		// stays a backend of other Services meanwhile: that ebpf-proxy
		// keeps the backends the slices still list (internal/maps
		// held.go, TestWriterKeepsTerminatingEndpointsUntilRemoved) and
		// ends the sockets of one they all dropped (test/socklb
		// TestRemovedBackendsSocketsAreEnded) is tested there.
		Name: "clusterip: a held connection outlives its endpoint turning not ready, then terminating",
		Steps: func() []Step {
			held := []Probe{{From: clientA, To: cip("web", 80), Proto: tcp, Hold: "web"}}
			probes := ps(held, from(tcp, cip("web", 80), clientA))
			return []Step{
				{Name: "b1 ready, a connection held", Services: []Svc{web()}, Slices: []Slice{webSlice(ready("b1"))}, Probes: held},
				{Name: "b1 not ready, b2 ready", Services: []Svc{web()}, Slices: []Slice{webSlice(notReady("b1"), ready("b2"))}, Probes: probes},
				{Name: "b1 terminating", Services: []Svc{web()}, Slices: []Slice{webSlice(terminating("b1"), ready("b2"))}, Probes: probes},
			}
		}(),
	},
	{
		// A UDP client that keeps its socket and connects it elsewhere:
		// first through the ClusterIP, then straight to the pod it got,
		// then through the ClusterIP again. With kube-proxy the direct
		// datagrams are the pod's own (their conntrack entry is new), so
		// the socket sees the pod.
		Name: "clusterip: a UDP socket connected through the ClusterIP, then straight to its pod, sees the pod",
		Steps: func() []Step {
			svc := Svc{Name: "dns", Ports: []Port{port("udp", udp, 53, 8080)}}
			slice := []Slice{{Name: "dns-1", Service: "dns", Ports: []SlicePort{sport("udp", udp, 8080)}, Eps: []Ep{ready("b1")}}}
			direct, again := pod("b1", 8080), cip("dns", 53)
			return []Step{{Name: "b1 behind the ClusterIP", Services: []Svc{svc}, Slices: slice, Probes: []Probe{
				{From: clientA, To: cip("dns", 53), Proto: udp, Then: &direct},
				{From: clientA, To: pod("b1", 8080), Proto: udp, Then: &again},
			}}}
		}(),
	},
	{
		Name: "clusterip: no endpoints rejects TCP and UDP; endpoints appear and disappear",
		Steps: func() []Step {
			svc := Svc{Name: "dns", Ports: []Port{port("tcp", tcp, 53, 8080), port("udp", udp, 53, 8080)}}
			slice := func(eps ...Ep) []Slice {
				return []Slice{{Name: "dns-1", Service: "dns", Ports: []SlicePort{sport("tcp", tcp, 8080), sport("udp", udp, 8080)}, Eps: eps}}
			}
			// UDP from the nodes themselves: see the pending scenario below.
			probes := ps(inCluster(tcp, cip("dns", 53)), from(udp, cip("dns", 53), clientA, clientB))
			return []Step{
				{Name: "no EndpointSlice", Services: []Svc{svc}, Probes: probes},
				{Name: "an EndpointSlice without endpoints", Services: []Svc{svc}, Slices: slice(), Probes: probes},
				{Name: "b1 appears", Services: []Svc{svc}, Slices: slice(ready("b1")), Probes: probes},
				{Name: "b1 disappears", Services: []Svc{svc}, Slices: slice(), Probes: probes},
			}
		}(),
	},
	{
		// A sender that keeps its UDP socket (statsd, a resolver): its
		// conntrack entry outlives each change, and only its removal
		// sends the next datagram to the Service's new state. kube-proxy
		// removes the entries of endpoints no longer serving, and since
		// 1.37 also when none is left (kubernetes#139629): before it,
		// the flow kept reaching the deleted endpoint (here b2, still
		// running) instead of the rejection.
		Name: "clusterip: a UDP flow that keeps its source port follows its Service to a new endpoint, to none, and back",
		Steps: func() []Step {
			svc := []Svc{{Name: "statsd", Ports: []Port{port("udp", udp, 8125, 8080)}}}
			slice := func(eps ...Ep) []Slice {
				return []Slice{{Name: "statsd-1", Service: "statsd", Ports: []SlicePort{sport("udp", udp, 8080)}, Eps: eps}}
			}
			flows := []Probe{
				{From: clientA, To: cip("statsd", 8125), Proto: udp, Hold: "statsd-a"},
				{From: clientB, To: cip("statsd", 8125), Proto: udp, Hold: "statsd-b"},
			}
			return []Step{
				{Name: "b1 behind the ClusterIP, a flow from each node's pod", Services: svc, Slices: slice(ready("b1")), Probes: flows},
				{Name: "b2 in place of b1", Services: svc, Slices: slice(ready("b2")), Probes: flows},
				{Name: "no endpoint left", Services: svc, Slices: slice(), Probes: flows},
				{Name: "b1 back", Services: svc, Slices: slice(ready("b1")), Probes: flows},
			}
		}(),
	},
	{
		Name: "clusterip: TCP and UDP on the same port number",
		Steps: func() []Step {
			tcpPort, udpPort := port("tcp", tcp, 80, 8080), port("udp", udp, 80, 8080)
			slice := func(ports ...SlicePort) []Slice {
				return []Slice{{Name: "both-1", Service: "both", Ports: ports, Eps: []Ep{ready("a1"), ready("b1")}}}
			}
			probes := ps(from(tcp, cip("both", 80), clientA, selfB), from(udp, cip("both", 80), clientA, selfB))
			return []Step{
				{Name: "TCP and UDP", Services: []Svc{{Name: "both", Ports: []Port{tcpPort, udpPort}}},
					Slices: slice(sport("tcp", tcp, 8080), sport("udp", udp, 8080)), Probes: probes},
				{Name: "UDP port removed", Services: []Svc{{Name: "both", Ports: []Port{tcpPort}}},
					Slices: slice(sport("tcp", tcp, 8080)), Probes: probes},
				{Name: "UDP back, TCP removed", Services: []Svc{{Name: "both", Ports: []Port{udpPort}}},
					Slices: slice(sport("udp", udp, 8080)), Probes: probes},
			}
		}(),
	},
	{
		Name: "clusterip: ready, then serving-terminating fallback (internalTrafficPolicy=Cluster)",
		Steps: []Step{
			{
				Name:     "a1 ready, b1 serving-terminating, b2 terminating",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(ready("a1"), servingTerminating("b1"), terminating("b2"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "a1 gone: only serving-terminating b1",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(servingTerminating("b1"), terminating("b2"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "b1 stops serving too",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(terminating("b1"), terminating("b2"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
		},
	},
	{
		Name: "clusterip: not-ready endpoints are not used; unset conditions mean ready",
		Steps: []Step{
			{
				Name:     "a1 without conditions, b1 not ready",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(unset("a1"), notReady("b1"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "both not ready",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(notReady("a1"), notReady("b1"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
		},
	},
	{
		Name: "clusterip: publishNotReadyAddresses",
		Steps: []Step{
			{
				// The controller marks every endpoint ready when the
				// Service publishes not-ready addresses.
				Name:     "unready a1 and terminating b1 published",
				Services: []Svc{web(withPublishNotReady)},
				Slices: []Slice{webSlice(Ep{Pod: "a1", Ready: yes(), Serving: no(), Terminating: no()},
					Ep{Pod: "b1", Ready: yes(), Serving: no(), Terminating: yes()})},
				Probes: inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "publishNotReadyAddresses off",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(notReady("a1"), terminating("b1"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
		},
	},
	{
		Name: "clusterip: internalTrafficPolicy=Local",
		Steps: []Step{
			{
				Name:     "a1 on node-a, b1 on node-b",
				Services: []Svc{dual(web(withITP(corev1.ServiceInternalTrafficPolicyLocal)))},
				Slices:   []Slice{dualSlice(ready("a1"), ready("b1"))},
				Probes:   ps(inCluster(tcp, cip("web", 80)), inCluster(udp, cip("web", 80))),
			},
			{
				// UDP from node-b itself: see the pending scenario below.
				Name:     "only a1: node-b has no local endpoint",
				Services: []Svc{dual(web(withITP(corev1.ServiceInternalTrafficPolicyLocal)))},
				Slices:   []Slice{dualSlice(ready("a1"))},
				Probes:   ps(inCluster(tcp, cip("web", 80)), from(udp, cip("web", 80), clientA, selfA, clientB)),
			},
			{
				Name:     "a1 serving-terminating, b1 ready: local fallback",
				Services: []Svc{dual(web(withITP(corev1.ServiceInternalTrafficPolicyLocal)))},
				Slices:   []Slice{dualSlice(servingTerminating("a1"), ready("b1"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "policy back to Cluster",
				Services: []Svc{dual(web(withITP(corev1.ServiceInternalTrafficPolicyCluster)))},
				Slices:   []Slice{dualSlice(servingTerminating("a1"), ready("b1"))},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
			{
				Name:     "Local without any endpoint",
				Services: []Svc{dual(web(withITP(corev1.ServiceInternalTrafficPolicyLocal)))},
				Slices:   []Slice{dualSlice()},
				Probes:   inCluster(tcp, cip("web", 80)),
			},
		},
	},
	{
		Name: "clusterip: several EndpointSlices and ports per Service",
		Steps: func() []Step {
			svc := web(withPorts(port("http", tcp, 80, 8080), port("alt", tcp, 81, 9090)))
			http := func(name string, eps ...Ep) Slice {
				return Slice{Name: name, Service: "web", Ports: []SlicePort{sport("http", tcp, 8080)}, Eps: eps}
			}
			alt := Slice{Name: "web-alt", Service: "web", Ports: []SlicePort{sport("alt", tcp, 9090)}, Eps: []Ep{ready("b1")}}
			probes := ps(inCluster(tcp, cip("web", 80)), inCluster(tcp, cip("web", 81)))
			return []Step{
				{Name: "http in two slices, alt in a third", Services: []Svc{svc},
					Slices: []Slice{http("web-1", ready("a1")), alt, http("web-3", ready("a2"))}, Probes: probes},
				{Name: "one http slice deleted", Services: []Svc{svc},
					Slices: []Slice{http("web-1", ready("a1")), alt}, Probes: probes},
				{Name: "the other http slice moved to b2", Services: []Svc{svc},
					Slices: []Slice{http("web-1", ready("b2")), alt}, Probes: probes},
			}
		}(),
	},
	{
		Name: "clusterip: duplicate endpoints across slices",
		Steps: []Step{
			{
				Name:     "a1 in two slices",
				Services: []Svc{web()},
				Slices: []Slice{webSlice(ready("a1"), ready("b1")),
					{Name: "web-2", Service: "web", Ports: []SlicePort{sport("http", tcp, 8080)}, Eps: []Ep{ready("a1")}}},
				Probes: inCluster(tcp, cip("web", 80)),
			},
			// A duplicate whose copies differ in their conditions is not
			// compared: kube-proxy 1.33 keeps whichever copy it meets first
			// in a map, so its choice varies from node to node and from
			// sync to sync; 1.36 prefers the non-terminating copy
			// (kubernetes#135593).
		},
	},
	{
		Name: "clusterip: named target ports follow the EndpointSlice port names",
		Steps: []Step{{
			Name: "web by name to 8081, metrics by number, a port the slice lacks",
			Services: []Svc{web(withPorts(port("web", tcp, 80, "http-alt"), port("metrics", tcp, 81, 9090),
				port("missing", tcp, 82, 8080)))},
			Slices: []Slice{{Name: "web-1", Service: "web", Ports: []SlicePort{sport("web", tcp, 8081), sport("metrics", tcp, 9090)},
				Eps: []Ep{ready("a1"), ready("b2")}}},
			Probes: ps(inCluster(tcp, cip("web", 80)), from(tcp, cip("web", 81), clientA, selfB), from(tcp, cip("web", 82), clientA, selfB)),
		}},
	},
	{
		Name: "clusterip: Service ports added, renumbered, removed",
		Steps: func() []Step {
			slice := Slice{Name: "web-1", Service: "web", Ports: []SlicePort{sport("http", tcp, 8080), sport("alt", tcp, 9090)},
				Eps: []Ep{ready("a1"), ready("b1")}}
			probes := func(ports ...int32) []Probe {
				var out []Probe
				for _, p := range ports {
					out = append(out, from(tcp, cip("web", p), clientA, selfB)...)
				}
				return out
			}
			return []Step{
				{Name: "port 80 only", Services: []Svc{web()}, Slices: []Slice{slice}, Probes: probes(80, 81)},
				{Name: "port 81 added", Services: []Svc{web(withPorts(port("http", tcp, 80, 8080), port("alt", tcp, 81, 9090)))},
					Slices: []Slice{slice}, Probes: probes(80, 81)},
				{Name: "port 80 renumbered to 8000", Services: []Svc{web(withPorts(port("http", tcp, 8000, 8080), port("alt", tcp, 81, 9090)))},
					Slices: []Slice{slice}, Probes: probes(80, 8000, 81)},
				{Name: "port 81 removed", Services: []Svc{web(withPorts(port("http", tcp, 8000, 8080)))},
					Slices: []Slice{slice}, Probes: probes(8000, 81)},
			}
		}(),
	},
	{
		Name: "clusterip: Service deleted and recreated",
		Steps: []Step{
			{Name: "serving", Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "Service deleted, its slice kept", Slices: []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "recreated with the same ClusterIP", Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes: inCluster(tcp, cip("web", 80))},
		},
	},
	{
		Name: "clusterip: type changed to ExternalName and back",
		Steps: []Step{
			{Name: "ClusterIP", Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "ExternalName (the old ClusterIP is released)",
				Services: []Svc{web(withType(corev1.ServiceTypeExternalName), func(s *Svc) { s.ExternalName = "web.example.com" })},
				Slices:   []Slice{webSlice(ready("a1"))}, Probes: inCluster(tcp, cip("web", 80))},
			{Name: "ClusterIP again", Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"))},
				Probes: inCluster(tcp, cip("web", 80))},
		},
	},
	{
		Name: "clusterip: service.kubernetes.io/service-proxy-name is left to another proxy",
		Steps: []Step{
			{Name: "Service and slice labelled, as the controller copies the label",
				Services: []Svc{web(withLabels(labelProxyName, "other-proxy"))},
				Slices:   []Slice{webSlice(ready("a1"), ready("b1")).labeled(labelProxyName, "other-proxy")},
				Probes:   inCluster(tcp, cip("web", 80))},
			{Name: "label removed", Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "label only on the slice: the Service has no endpoints",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(ready("a1"), ready("b1")).labeled(labelProxyName, "other-proxy")},
				Probes:   inCluster(tcp, cip("web", 80))},
		},
	},
	{
		Name: "clusterip: service.kubernetes.io/headless on a Service with a ClusterIP",
		Steps: []Step{
			{Name: "labelled headless", Services: []Svc{web(withLabels(labelHeadless, ""))},
				Slices: []Slice{webSlice(ready("a1"), ready("b1")).labeled(labelHeadless, "")},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "label removed", Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes: inCluster(tcp, cip("web", 80))},
		},
	},
	{
		Name: "headless Service: nothing is proxied, pods are reached directly",
		Steps: []Step{{
			Name:     "clusterIP None",
			Services: []Svc{web(func(s *Svc) { s.Headless = true })},
			Slices:   []Slice{webSlice(ready("a1"), ready("b1")).labeled(labelHeadless, "")},
			Probes:   ps(from(tcp, pod("a1", 8080), clientA, clientB, selfA, selfB), from(udp, pod("b1", 8080), clientA, selfB)),
		}},
	},
	{
		Name: "clusterip: topology-aware routing by zone hints",
		Steps: []Step{
			{Name: "a1 hinted for zone-a, b1 for zone-b", Services: []Svc{web()},
				Slices: []Slice{webSlice(ready("a1").zones("zone-a"), ready("b1").zones("zone-b"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "b1 without hints: hints are ignored", Services: []Svc{web()},
				Slices: []Slice{webSlice(ready("a1").zones("zone-a"), ready("b1"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "both hinted for zone-a: zone-b has none and uses all", Services: []Svc{web()},
				Slices: []Slice{webSlice(ready("a1").zones("zone-a"), ready("b1").zones("zone-a"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "hints on a not-ready endpoint do not count", Services: []Svc{web()},
				Slices: []Slice{webSlice(ready("a1").zones("zone-a"), ready("b1").zones("zone-b"), notReady("a2"))},
				Probes: inCluster(tcp, cip("web", 80))},
		},
	},
	{
		Name: "clusterip: node hints (PreferSameNode) before zone hints",
		Steps: []Step{{
			// a2 runs on node-a but is hinted for node-b: node hints and
			// zone hints select different sets.
			Name:     "a1 for node-a, a2 and b1 for node-b",
			Services: []Svc{web()},
			Slices: []Slice{webSlice(ready("a1").zones("zone-a").nodes("node-a"), ready("a2").zones("zone-a").nodes("node-b"),
				ready("b1").zones("zone-b").nodes("node-b"))},
			Probes: inCluster(tcp, cip("web", 80)),
		}},
	},
	// trafficDistribution as 1.34 to 1.37 have it: PreferSameZone (the
	// new name of PreferClose) and PreferSameNode, GA and always on since
	// 1.35. The EndpointSlice controller writes hints from the field;
	// proxies read only the hints, so the slices here carry the hints
	// the controller would write.
	{
		Name: "clusterip: trafficDistribution PreferSameZone follows zone hints",
		Steps: []Step{
			{Name: "a1 and a2 hinted for zone-a, b1 for zone-b",
				Services: []Svc{web(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameZone))},
				Slices:   []Slice{webSlice(ready("a1").zones("zone-a"), ready("a2").zones("zone-a"), ready("b1").zones("zone-b"))},
				Probes:   inCluster(tcp, cip("web", 80))},
			{Name: "the field removed, the hints kept: the hints still decide",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(ready("a1").zones("zone-a"), ready("a2").zones("zone-a"), ready("b1").zones("zone-b"))},
				Probes:   inCluster(tcp, cip("web", 80))},
			{Name: "PreferClose, its older name, with zone-b's only endpoint terminating: zone-b uses every ready endpoint",
				Services: []Svc{web(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferClose))},
				Slices:   []Slice{webSlice(ready("a1").zones("zone-a"), ready("a2").zones("zone-a"), servingTerminating("b1").zones("zone-b"))},
				Probes:   inCluster(tcp, cip("web", 80))},
		},
	},
	{
		Name: "clusterip: trafficDistribution PreferSameNode, node hints all or nothing",
		Steps: []Step{
			{Name: "each endpoint hinted for its node, zone hints beside",
				Services: []Svc{web(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode))},
				Slices: []Slice{webSlice(ready("a1").zones("zone-a").nodes("node-a"), ready("a2").zones("zone-a").nodes("node-a"),
					ready("b1").zones("zone-b").nodes("node-b"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "one endpoint without a node hint: node hints are ignored, zone hints decide",
				Services: []Svc{web(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode))},
				Slices: []Slice{webSlice(ready("a1").zones("zone-a").nodes("node-a"), ready("a2").zones("zone-a"),
					ready("b1").zones("zone-b").nodes("node-b"))},
				Probes: inCluster(tcp, cip("web", 80))},
			{Name: "no endpoint hinted for node-b: node-b falls back to zone hints",
				Services: []Svc{web(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode))},
				Slices: []Slice{webSlice(ready("a1").zones("zone-a").nodes("node-a"), ready("a2").zones("zone-b").nodes("node-a"),
					ready("b1").zones("zone-b").nodes("node-a"))},
				Probes: inCluster(tcp, cip("web", 80))},
		},
	},
	{
		Name:  "clusterip: session affinity ClientIP, switched off and on",
		Needs: []Feature{FeatureAffinity},
		Steps: func() []Step {
			slice := []Slice{webSlice(ready("a1"), ready("a2"), ready("b1"), ready("b2"))}
			probes := func(st bool) []Probe {
				if st {
					return ps(sticky(clientA, cip("web", 80)), sticky(clientB, cip("web", 80)), sticky(selfA, cip("web", 80)))
				}
				return from(tcp, cip("web", 80), clientA, clientB)
			}
			return []Step{
				{Name: "ClientIP", Services: []Svc{web(withAffinity)}, Slices: slice, Probes: probes(true)},
				{Name: "None", Services: []Svc{web()}, Slices: slice, Probes: probes(false)},
				{Name: "ClientIP again", Services: []Svc{web(withAffinity)}, Slices: slice, Probes: probes(true)},
			}
		}(),
	},

	// ---- NodePort, ExternalIPs, LoadBalancer IPs ----
	//
	// Each comes twice: from clients on the node that owns the address (a
	// pod or the node itself reaching its own NodePort; any in-cluster
	// client reaching an ExternalIP or LoadBalancer IP, which its own node
	// translates), and from outside: external clients, and clients reaching
	// another node's NodePort, whose traffic enters that node from the
	// network.
	{
		Name:  "nodeport from the node: externalTrafficPolicy=Cluster; type changes",
		Needs: []Feature{FeatureNodePort},
		Steps: func() []Step {
			slice := []Slice{webSlice(ready("a1"), ready("b1"))}
			// Pods as clients: see the pending scenario below.
			probes := ps(from(tcp, np("web", 80, selfA), selfA), from(tcp, np("web", 80, selfB), selfB),
				from(tcp, cip("web", 80), clientA))
			return []Step{
				{Name: "ClusterIP: no NodePort yet", Services: []Svc{web()}, Slices: slice, Probes: probes},
				{Name: "type NodePort", Services: []Svc{web(withType(corev1.ServiceTypeNodePort))}, Slices: slice, Probes: probes},
				{Name: "no endpoints", Services: []Svc{web(withType(corev1.ServiceTypeNodePort))}, Probes: probes},
				{Name: "type ClusterIP again", Services: []Svc{web()}, Slices: slice, Probes: probes},
			}
		}(),
	},
	{
		// kube-proxy's iptables mode serves NodePorts on 127.0.0.1 to the
		// node's own processes (localhostNodePorts, on by default); its
		// nftables mode does not.
		Name:  "nodeport on 127.0.0.1 from the node itself (localhost NodePorts)",
		Needs: []Feature{FeatureNodePort},
		Steps: func() []Step {
			lh := Dest{Kind: LocalhostNodePort, Service: "web", Port: 80}
			// And the node's own address, for UDP: kube-proxy refuses
			// a NodePort's datagrams in INPUT, a ClusterIP's in OUTPUT.
			probes := ps(from(tcp, lh, selfA, selfB), from(udp, lh, selfA), from(udp, np("web", 80, selfA), selfA))
			svc := dual(web(withType(corev1.ServiceTypeNodePort)))
			local := dual(web(withType(corev1.ServiceTypeNodePort), withETP(corev1.ServiceExternalTrafficPolicyLocal)))
			return []Step{
				{Name: "a1 and b1", Services: []Svc{svc}, Slices: []Slice{dualSlice(ready("a1"), ready("b1"))}, Probes: probes},
				{Name: "externalTrafficPolicy=Local: the node's own traffic goes to every endpoint",
					Services: []Svc{local}, Slices: []Slice{dualSlice(ready("b1"))}, Probes: probes},
				{Name: "no endpoints", Services: []Svc{svc}, Slices: []Slice{dualSlice()}, Probes: probes},
			}
		}(),
	},
	{
		Name:  "nodeport from outside: externalTrafficPolicy=Cluster",
		Needs: []Feature{FeatureNodePort, FeatureExternalTraffic},
		Steps: func() []Step {
			probes := ps(from(tcp, np("web", 80, selfA), ext, clientB, selfB), from(tcp, np("web", 80, selfB), ext))
			return []Step{
				{Name: "a1 and b1", Services: []Svc{web(withType(corev1.ServiceTypeNodePort))},
					Slices: []Slice{webSlice(ready("a1"), ready("b1"))}, Probes: probes},
				{Name: "no endpoints", Services: []Svc{web(withType(corev1.ServiceTypeNodePort))}, Probes: probes},
			}
		}(),
	},
	{
		Name:  "nodeport from the node: externalTrafficPolicy=Local short-circuits",
		Needs: []Feature{FeatureNodePort},
		Steps: func() []Step {
			svc := dual(web(withType(corev1.ServiceTypeNodePort), withETP(corev1.ServiceExternalTrafficPolicyLocal)))
			probes := ps(from(tcp, np("web", 80, selfB), clientB, selfB), from(udp, np("web", 80, selfB), clientB),
				from(tcp, np("web", 80, selfA), clientA))
			return []Step{
				{Name: "only a1, on node-a", Services: []Svc{svc}, Slices: []Slice{dualSlice(ready("a1"))}, Probes: probes},
				{Name: "a1 serving-terminating", Services: []Svc{svc}, Slices: []Slice{dualSlice(servingTerminating("a1"))}, Probes: probes},
				{Name: "no endpoints", Services: []Svc{svc}, Slices: []Slice{dualSlice()}, Probes: probes},
			}
		}(),
	},
	{
		Name:  "nodeport from outside: externalTrafficPolicy=Local",
		Needs: []Feature{FeatureNodePort, FeatureExternalTraffic},
		Steps: func() []Step {
			svc := dual(web(withType(corev1.ServiceTypeNodePort), withETP(corev1.ServiceExternalTrafficPolicyLocal)))
			probes := ps(
				from(tcp, np("web", 80, selfA), ext, clientB),
				from(tcp, np("web", 80, selfB), ext, clientA),
				from(udp, np("web", 80, selfB), ext),
			)
			return []Step{
				{Name: "only a1, on node-a", Services: []Svc{svc}, Slices: []Slice{dualSlice(ready("a1"))}, Probes: probes},
				{Name: "a1 serving-terminating: local fallback", Services: []Svc{svc},
					Slices: []Slice{dualSlice(servingTerminating("a1"))}, Probes: probes},
				{Name: "no endpoints", Services: []Svc{svc}, Slices: []Slice{dualSlice()}, Probes: probes},
			}
		}(),
	},
	{
		Name:  "nodeport: TCP and UDP on the same NodePort number",
		Needs: []Feature{FeatureNodePort},
		Steps: []Step{{
			Name: "both protocols",
			Services: []Svc{{Name: "both", Type: corev1.ServiceTypeNodePort,
				Ports: []Port{port("tcp", tcp, 80, 8080), port("udp", udp, 80, 9090)}}},
			Slices: []Slice{{Name: "both-1", Service: "both", Ports: []SlicePort{sport("tcp", tcp, 8080), sport("udp", udp, 9090)},
				Eps: []Ep{ready("b1")}}},
			Probes: ps(from(tcp, np("both", 80, selfA), selfA), from(udp, np("both", 80, selfA), selfA)),
		}},
	},
	{
		Name:  "nodeport from outside: TCP and UDP on the same NodePort number",
		Needs: []Feature{FeatureNodePort, FeatureExternalTraffic},
		Steps: []Step{{
			Name: "both protocols",
			Services: []Svc{{Name: "both", Type: corev1.ServiceTypeNodePort,
				Ports: []Port{port("tcp", tcp, 80, 8080), port("udp", udp, 80, 9090)}}},
			Slices: []Slice{{Name: "both-1", Service: "both", Ports: []SlicePort{sport("tcp", tcp, 8080), sport("udp", udp, 9090)},
				Eps: []Ep{ready("b1")}}},
			Probes: ps(from(tcp, np("both", 80, selfA), ext), from(udp, np("both", 80, selfA), ext)),
		}},
	},
	{
		Name:  "externalIPs from the cluster: externalTrafficPolicy=Cluster",
		Needs: []Feature{FeatureExternalIP},
		VIPs:  map[string]string{"x1": selfA, "x2": selfB},
		Steps: []Step{
			{Name: "a1 only", Services: []Svc{web(withExternalIPs("x1", "x2"))}, Slices: []Slice{webSlice(ready("a1"))},
				Probes: ps(from(tcp, vip("x1", 80), selfA, selfB), from(tcp, vip("x2", 80), selfA))},
			{Name: "no endpoints", Services: []Svc{web(withExternalIPs("x1", "x2"))},
				Probes: ps(from(tcp, vip("x1", 80), clientB, selfA))},
		},
	},
	{
		Name:  "externalIPs from outside: externalTrafficPolicy=Cluster",
		Needs: []Feature{FeatureExternalIP, FeatureExternalTraffic},
		VIPs:  map[string]string{"x1": selfA, "x2": selfB},
		Steps: []Step{
			{Name: "a1 only", Services: []Svc{web(withExternalIPs("x1", "x2"))}, Slices: []Slice{webSlice(ready("a1"))},
				Probes: ps(from(tcp, vip("x1", 80), ext), from(tcp, vip("x2", 80), ext))},
			{Name: "no endpoints", Services: []Svc{web(withExternalIPs("x1", "x2"))}, Probes: from(tcp, vip("x1", 80), ext)},
		},
	},
	{
		Name:  "externalIPs from the cluster: externalTrafficPolicy=Local short-circuits",
		Needs: []Feature{FeatureExternalIP},
		VIPs:  map[string]string{"x1": selfA, "x2": selfB},
		Steps: []Step{{
			Name:     "a1 only, on node-a",
			Services: []Svc{web(withExternalIPs("x1", "x2"), withETP(corev1.ServiceExternalTrafficPolicyLocal))},
			Slices:   []Slice{webSlice(ready("a1"))},
			Probes:   from(tcp, vip("x2", 80), clientB, selfB),
		}},
	},
	{
		Name:  "externalIPs from outside: externalTrafficPolicy=Local",
		Needs: []Feature{FeatureExternalIP, FeatureExternalTraffic},
		VIPs:  map[string]string{"x1": selfA, "x2": selfB},
		Steps: []Step{{
			Name:     "a1 only, on node-a",
			Services: []Svc{web(withExternalIPs("x1", "x2"), withETP(corev1.ServiceExternalTrafficPolicyLocal))},
			Slices:   []Slice{webSlice(ready("a1"))},
			Probes:   ps(from(tcp, vip("x1", 80), ext), from(tcp, vip("x2", 80), ext)),
		}},
	},
	{
		Name:  "loadbalancer from the cluster: externalTrafficPolicy=Cluster, ipMode Proxy ignored",
		Needs: []Feature{FeatureLoadBalancer},
		VIPs:  map[string]string{"l1": selfA, "l2": selfB},
		Steps: []Step{
			{Name: "VIP ingress l1, Proxy ingress l2",
				Services: []Svc{web(withType(corev1.ServiceTypeLoadBalancer), withIngress(Ingress{VIP: "l1"}, Ingress{VIP: "l2", Proxy: true}))},
				Slices:   []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes:   ps(from(tcp, vip("l1", 80), selfA, selfB), from(tcp, vip("l2", 80), clientA))},
			{Name: "type ClusterIP: the LoadBalancer IP is gone",
				Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes: from(tcp, vip("l1", 80), clientA)},
		},
	},
	{
		Name:  "loadbalancer from outside: externalTrafficPolicy=Cluster, ipMode Proxy ignored",
		Needs: []Feature{FeatureLoadBalancer, FeatureExternalTraffic},
		VIPs:  map[string]string{"l1": selfA, "l2": selfB},
		Steps: []Step{
			{Name: "VIP ingress l1, Proxy ingress l2",
				Services: []Svc{web(withType(corev1.ServiceTypeLoadBalancer), withIngress(Ingress{VIP: "l1"}, Ingress{VIP: "l2", Proxy: true}))},
				Slices:   []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes:   ps(from(tcp, vip("l1", 80), ext), from(tcp, vip("l2", 80), ext))},
			{Name: "type ClusterIP: the LoadBalancer IP is gone",
				Services: []Svc{web()}, Slices: []Slice{webSlice(ready("a1"), ready("b1"))},
				Probes: from(tcp, vip("l1", 80), ext)},
		},
	},
	{
		Name:  "loadbalancer from the cluster: externalTrafficPolicy=Local short-circuits",
		Needs: []Feature{FeatureLoadBalancer},
		VIPs:  map[string]string{"l1": selfA, "l2": selfB},
		Steps: []Step{{
			Name: "a1 on node-a",
			Services: []Svc{web(withType(corev1.ServiceTypeLoadBalancer), withETP(corev1.ServiceExternalTrafficPolicyLocal),
				withIngress(Ingress{VIP: "l1"}, Ingress{VIP: "l2"}))},
			Slices: []Slice{webSlice(ready("a1"))},
			Probes: from(tcp, vip("l2", 80), clientB, selfB),
		}},
	},
	{
		Name:  "loadbalancer from outside: externalTrafficPolicy=Local",
		Needs: []Feature{FeatureLoadBalancer, FeatureExternalTraffic},
		VIPs:  map[string]string{"l1": selfA, "l2": selfB},
		Steps: []Step{
			{Name: "a1 on node-a; l1 routed to node-a, l2 to node-b",
				Services: []Svc{web(withType(corev1.ServiceTypeLoadBalancer), withETP(corev1.ServiceExternalTrafficPolicyLocal),
					withIngress(Ingress{VIP: "l1"}, Ingress{VIP: "l2"}))},
				Slices: []Slice{webSlice(ready("a1"))},
				Probes: ps(from(tcp, vip("l1", 80), ext), from(tcp, vip("l2", 80), ext))},
			{Name: "a1 serving-terminating: traffic falls back",
				Services: []Svc{web(withType(corev1.ServiceTypeLoadBalancer), withETP(corev1.ServiceExternalTrafficPolicyLocal),
					withIngress(Ingress{VIP: "l1"}, Ingress{VIP: "l2"}))},
				Slices: []Slice{webSlice(servingTerminating("a1"))},
				Probes: from(tcp, vip("l1", 80), ext)},
		},
	},
	{
		// The load balancer's view: it probes every node's health check
		// node port from outside and sends traffic only where it gets 200.
		// The probes reach the node's own address, so they need no
		// translation: this is the health server alone.
		Name:  "health check node port of a LoadBalancer with externalTrafficPolicy=Local",
		Needs: []Feature{FeatureHealthCheck},
		VIPs:  map[string]string{"l1": selfA, "l2": selfB},
		Steps: func() []Step {
			svc := []Svc{dual(web(withType(corev1.ServiceTypeLoadBalancer), withETP(corev1.ServiceExternalTrafficPolicyLocal),
				withIngress(Ingress{VIP: "l1"}, Ingress{VIP: "l2"})))}
			probes := ps(httpGet(ext, hcnp("web", selfA)), httpGet(ext, hcnp("web", selfB)),
				httpGet(selfB, hcnp("web", selfA)), httpGet(selfA, hcnp("web", selfA)))
			return []Step{
				{Name: "a1 ready on node-a: node-a passes, node-b fails", Services: svc,
					Slices: []Slice{dualSlice(ready("a1"), notReady("b1"))}, Probes: probes},
				{Name: "a1 and a2 on node-a, b1 on node-b: both pass", Services: svc,
					Slices: []Slice{dualSlice(ready("a1"), ready("a2"), ready("b1"))}, Probes: probes},
				{Name: "a1 serving-terminating, a2 terminating: node-a fails while its pods drain", Services: svc,
					Slices: []Slice{dualSlice(servingTerminating("a1"), terminating("a2"), ready("b1"))}, Probes: probes},
				{Name: "no endpoints: both fail", Services: svc, Slices: []Slice{dualSlice()}, Probes: probes},
				{Name: "a1 ready again, in a slice of its own", Services: svc,
					Slices: []Slice{dualSlice(), {Name: "web-2", Service: "web", Ports: []SlicePort{sport("http", tcp, 8080)}, Eps: []Ep{ready("a1")}}},
					Probes: probes},
			}
		}(),
	},
	{
		Name:  "loadbalancer: loadBalancerSourceRanges",
		Needs: []Feature{FeatureLoadBalancer, FeatureSourceRanges, FeatureExternalTraffic},
		VIPs:  map[string]string{"l1": selfA},
		Steps: []Step{{
			Name: "only ext allowed",
			Services: []Svc{web(withType(corev1.ServiceTypeLoadBalancer), withIngress(Ingress{VIP: "l1"}),
				func(s *Svc) { s.SourceRanges = []string{ext} })},
			Slices: []Slice{webSlice(ready("a1"))},
			// NodePorts are not subject to the ranges.
			Probes: ps(from(tcp, vip("l1", 80), ext, ext2), from(tcp, np("web", 80, selfA), ext2)),
		}},
	},
	{
		// kube-proxy's firewall chain runs before its DNAT in PREROUTING
		// (pods) and OUTPUT (the node), so it holds the node's own
		// clients to the ranges too, with the node admitted when a range
		// holds its address. ebpf-proxy's socket hooks tag the socket and
		// check its packets at egress.
		Name:  "loadbalancer: loadBalancerSourceRanges for pods and nodes reaching the LoadBalancer IP",
		Needs: []Feature{FeatureLoadBalancer, FeatureSourceRanges},
		VIPs:  map[string]string{"l1": selfA},
		KeepsSource: "kube-proxy masquerades a pod's traffic to a LoadBalancer IP with externalTrafficPolicy=Cluster " +
			"(the endpoint sees a node address); ebpf-proxy's socket hooks connect the admitted pod straight to the endpoint",
		Steps: func() []Step {
			probes := ps(from(tcp, vip("l1", 80), clientA, clientB, selfA, selfB),
				from(udp, vip("l1", 80), clientA, clientB, selfA, selfB))
			lb := func(ranges ...string) []Svc {
				return []Svc{dual(web(withType(corev1.ServiceTypeLoadBalancer), withIngress(Ingress{VIP: "l1"}),
					func(s *Svc) { s.SourceRanges = ranges }))}
			}
			return []Step{
				{Name: "only ext allowed: every pod and node dropped", Services: lb(ext),
					Slices: []Slice{dualSlice(ready("a1"))}, Probes: probes},
				{Name: "node-b's pod and node-a allowed too", Services: lb(ext, clientB, selfA),
					Slices: []Slice{dualSlice(ready("a1"))}, Probes: probes},
			}
		}(),
	},

	// ---- Where ebpf-proxy keeps the client's address and upstream masquerades ----
	{
		// kube-proxy refuses these datagrams in the node's OUTPUT path, so
		// send() fails with EPERM; ebpf-proxy fails connect() with EPERM.
		Name: "clusterip: UDP from the node itself to a Service that rejects or drops",
		Steps: []Step{
			{Name: "no endpoints", Services: []Svc{dual(web())}, Slices: []Slice{dualSlice()},
				Probes: from(udp, cip("web", 80), selfA, selfB)},
			{Name: "internalTrafficPolicy=Local, only a1", Services: []Svc{dual(web(withITP(corev1.ServiceInternalTrafficPolicyLocal)))},
				Slices: []Slice{dualSlice(ready("a1"))}, Probes: from(udp, cip("web", 80), selfA, selfB)},
		},
	},
	{
		Name:  "pods reaching a NodePort, ExternalIP or LoadBalancer IP (externalTrafficPolicy=Cluster)",
		Needs: []Feature{FeatureNodePort, FeatureExternalIP, FeatureLoadBalancer},
		VIPs:  map[string]string{"x1": selfA, "l1": selfB},
		KeepsSource: "kube-proxy masquerades a pod's traffic to an external frontend of a Service with " +
			"externalTrafficPolicy=Cluster (the endpoint sees a node address); ebpf-proxy's socket hooks " +
			"connect the pod straight to the endpoint (it sees the pod's address)",
		Steps: []Step{{
			Name: "a1 and b1",
			Services: []Svc{dual(web(withType(corev1.ServiceTypeLoadBalancer), withExternalIPs("x1"),
				withIngress(Ingress{VIP: "l1"})))},
			Slices: []Slice{dualSlice(ready("a1"), ready("b1"))},
			Probes: ps(from(tcp, np("web", 80, selfA), clientA), from(udp, np("web", 80, selfB), clientB),
				from(tcp, vip("x1", 80), clientA, clientB), from(tcp, vip("l1", 80), clientA)),
		}},
	},
	{
		Name: "clusterip: hairpin, an endpoint reaching its own Service",
		KeepsSource: "kube-proxy masquerades hairpin traffic (the pod sees its node's bridge address); " +
			"ebpf-proxy's socket-level translation connects the pod to itself directly (it sees its own address)",
		Steps: []Step{{
			Name:     "a1 is the only endpoint",
			Services: []Svc{web()},
			Slices:   []Slice{webSlice(ready("a1"))},
			Probes:   ps(probe(tcp, "pod:a1", cip("web", 80)), probe(tcp, "pod:a2", cip("web", 80))),
		}},
	},
	// ---- A service mesh's sidecar ----
	{
		// Istio's and Linkerd's sidecars: the pod's outbound TCP is
		// redirected to the proxy in the pod, which asks the kernel where
		// each connection was going and must be told the Service to
		// route it; then it connects there itself, let through by the
		// pod's rules. ebpf-proxy serves it with --socket-lb-scope=node.
		Name:  "mesh: a meshed pod's sidecar is told the ClusterIP, and its own connection reaches an endpoint",
		Needs: []Feature{FeatureMesh},
		Steps: []Step{
			{
				Name:     "a2 and b1 ready",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(ready("a2"), ready("b1"))},
				Probes:   meshed(cip("web", 80)),
			},
			{
				Name:     "endpoints replaced by b2",
				Services: []Svc{web()},
				Slices:   []Slice{webSlice(ready("b2"))},
				Probes:   meshed(cip("web", 80)),
			},
			{
				Name:     "EndpointSlice deleted",
				Services: []Svc{web()},
				Probes:   meshed(cip("web", 80)),
			},
		},
	},
	// ---- Dual-stack ----
	{
		// One Service, both families: each ClusterIP is served by the
		// EndpointSlices of its family alone (kube-proxy's per-family
		// proxiers).
		Name:  "dual-stack: one Service, each family served by its own EndpointSlices",
		Needs: []Feature{FeatureIPv6},
		Steps: func() []Step {
			svc := []Svc{web(func(s *Svc) { s.DualStack = true })}
			v6 := func(eps ...Ep) Slice {
				sl := webSlice(eps...)
				sl.Name, sl.IPv6 = "web-ipv6", true
				return sl
			}
			probes := ps(inCluster(tcp, cip("web", 80)), inCluster(tcp, over6(cip("web", 80))))
			return []Step{
				{Name: "a1 and b1 in both families", Services: svc,
					Slices: []Slice{webSlice(ready("a1"), ready("b1")), v6(ready("a1"), ready("b1"))}, Probes: probes},
				{Name: "the IPv6 slice loses its endpoints", Services: svc,
					Slices: []Slice{webSlice(ready("a1"), ready("b1")), v6()}, Probes: probes},
				{Name: "the IPv4 slice goes; the IPv6 one lists a2", Services: svc,
					Slices: []Slice{v6(ready("a2"))}, Probes: probes},
			}
		}(),
	},
	{
		// A PreferDualStack NodePort Service, probed through node-b, whose
		// Node object lists its IPv4 address alone (testbedOptions): its
		// pods and the node itself reach both ClusterIPs, and clients
		// outside reach the NodePort on both of node-b's addresses, as
		// upstream serves both families whatever the Node lists.
		Name:  "dual-stack: PreferDualStack NodePort Service on a node whose Node lists IPv4 alone",
		Needs: []Feature{FeatureIPv6, FeatureIPv6External},
		Steps: func() []Step {
			svc := []Svc{dual(web(withType(corev1.ServiceTypeNodePort), func(s *Svc) { s.DualStack, s.PreferDualStack = true, true }))}
			v6 := func(eps ...Ep) Slice {
				sl := dualSlice(eps...)
				sl.Name, sl.IPv6 = "web-ipv6", true
				return sl
			}
			probes := ps(from(tcp, cip("web", 80), clientB, selfB), from(tcp, over6(cip("web", 80)), clientB, selfB),
				from(udp, over6(cip("web", 80)), clientB), from(tcp, np("web", 80, selfB), ext), from(tcp, over6(np("web", 80, selfB)), ext),
				from(udp, over6(np("web", 80, selfB)), ext))
			return []Step{
				{Name: "a1 and b1 in both families", Services: svc,
					Slices: []Slice{dualSlice(ready("a1"), ready("b1")), v6(ready("a1"), ready("b1"))}, Probes: probes},
				{Name: "the IPv6 slice lists b2 alone", Services: svc,
					Slices: []Slice{dualSlice(ready("a1"), ready("b1")), v6(ready("b2"))}, Probes: probes},
			}
		}(),
	},
}
