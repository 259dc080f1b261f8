package modes_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// The IPv6 Service without endpoints of the dual-stack manifests, and the
// health check node port of its LoadBalancer Service.
var emptyIP6 = netip.MustParseAddr("fd00:10:96::81")

const healthCheckNodePort = 32000

// dualStack makes a Service RequireDualStack with v4's IPv6 twin.
func dualStack(v4 netip.Addr) builders.ServiceOption {
	return func(s *v1.Service) {
		builders.ClusterIP(v4.String())(s)
		builders.DualStack(sandbox.IPv6Of(v4).String())(s)
	}
}

// writeDualStackManifests makes web dual-stack (its IPv6 ClusterIP is the
// IPv4 one's twin, and an IPv6 EndpointSlice lists both pods) and adds an
// IPv6-only Service without endpoints and a dual-stack LoadBalancer with
// externalTrafficPolicy Local whose IPv4 slice lists both pods and its
// IPv6 slice one.
func (e *env) writeDualStackManifests() {
	var eps4, eps6 []discoveryv1.Endpoint
	for _, p := range e.pods {
		eps4 = append(eps4, builders.Endpoint(p.IP.String(), nodeName))
		eps6 = append(eps6, builders.Endpoint(p.IP6.String(), nodeName))
	}
	port := builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromInt32(tcpPort)))
	web := builders.Service("default", "web", port, builders.NodePort(nodePort), dualStack(clusterIP))
	web6 := builders.SliceFor(web, eps6...)
	web6.Name, web6.AddressType = "web-ipv6", discoveryv1.AddressTypeIPv6
	lb := builders.Service("default", "lb", port, dualStack(netip.MustParseAddr("10.96.0.82")),
		builders.LoadBalancer(30082, "198.19.0.82"), builders.ExternalLocal(healthCheckNodePort))
	lb6 := builders.SliceFor(lb, eps6[0])
	lb6.Name, lb6.AddressType = "lb-ipv6", discoveryv1.AddressTypeIPv6
	empty := builders.Service("default", "empty6", port, func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = emptyIP6.String(), []string{emptyIP6.String()}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
	})
	if err := builders.WriteManifest(e.manifests, "web.yaml", web, builders.SliceFor(web, eps4...), web6, empty,
		lb, builders.SliceFor(lb, eps4...), lb6); err != nil {
		e.t.Fatal(err)
	}
}

// TestDualStack runs the agent on a dual-stack node (the sandbox's hosts
// have an address of each family, and no Node object says otherwise). In
// iptables mode a dual-stack Service answers on both families, through its
// ClusterIPs and its NodePort, an IPv6 Service without endpoints refuses,
// a health check node port answers on each family with that family's
// local endpoints, and each family's sync loop reports under its
// ip_family. In ebpf mode both ClusterIPs answer the pod, the IPv6
// NodePort the external client, an IPv6 Service without endpoints
// refuses, the log says once what IPv6 lacks yet, and nothing is left of
// the iptables mode's IPv6 rules. On an IPv6-primary node auto picks the
// ebpf mode, which serves both families from inside and outside.
func TestDualStack(t *testing.T) {
	e := newEnv(t)
	for _, h := range []*sandbox.Host{e.pods[0].Host, e.pods[1].Host, e.client.Host} {
		if err := behaviour.RouteIPv6ThroughNode(h, e.node); err != nil {
			t.Fatal(err)
		}
	}
	e.writeDualStackManifests()
	vip4 := netip.AddrPortFrom(clusterIP, 80)
	vip6 := netip.AddrPortFrom(sandbox.IPv6Of(clusterIP), 80)

	a := e.startAgent("iptables")
	e.expectOnly("iptables")
	e.reaches(e.client, vip4, 24)
	e.reaches(e.client, vip6, 24)
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP6, nodePort), 24)
	e.refused(netip.AddrPortFrom(emptyIP6, 80))
	// Each family's health check node port counts its family's local
	// endpoints.
	for _, hc := range []struct {
		addr   netip.Addr
		weight string
	}{{e.node.IP, "2"}, {e.node.IP6, "1"}} {
		rep, err := e.external.HTTP(e.ctx(), netip.AddrPortFrom(hc.addr, healthCheckNodePort), "/", 1)
		if err != nil {
			t.Fatal(err)
		}
		// The body is the health check's JSON, not the test servers' reply
		// (r.Err says so): the status and the weight header tell.
		if r := rep.Results[0]; r.Status != 200 || r.Weight != hc.weight {
			t.Errorf("health check node port on %s: %+v, want 200 with %s local endpoints", hc.addr, r, hc.weight)
		}
	}
	metrics := get(t, a, "/metrics")
	for _, f := range []string{"IPv4", "IPv6"} {
		series := `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="` + f + `"}`
		if !strings.Contains(metrics, series) || strings.Contains(metrics, series+" 0\n") {
			t.Errorf("no sync of the %s loop in the metrics (%s)", f, series)
		}
	}
	own := e.state().iptables
	var v6 bool
	for _, r := range own {
		v6 = v6 || strings.Contains(r.backend, "ip6tables")
	}
	if !v6 {
		t.Errorf("iptables mode wrote no ip6tables chain: %v", own)
	}
	a.Terminate(t, time.Minute)

	a = e.startAgent("ebpf")
	e.expectOnly("ebpf")
	e.reaches(e.client, vip4, 24)
	e.reaches(e.client, vip6, 24)
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP6, nodePort), 24)
	e.refused(netip.AddrPortFrom(emptyIP6, 80))
	if n := strings.Count(a.Logs(), "serving IPv6"); n != 1 {
		t.Errorf("the ebpf mode said %d times what it does not do for IPv6 yet, want once:\n%s", n, a.Logs())
	}
	a.Terminate(t, time.Minute)

	// An IPv6-primary node (--bind-address names its IPv6 address): auto
	// picks the BPF dataplane, whose TC programs find the uplink by the
	// node's addresses of either family.
	a = e.startAgentArgs("auto", append(e.agentArgs("auto"), "--bind-address", e.node.IP6.String()))
	if got := get(t, a, "/proxyMode"); got != "ebpf" {
		t.Errorf("auto on an IPv6-primary node: /proxyMode %q, want ebpf", got)
	}
	e.expectOnly("ebpf")
	e.reaches(e.client, vip6, 24)
	e.reaches(e.client, vip4, 24)
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP6, nodePort), 24)
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP, nodePort), 24)
}

// refused checks that connections from the client pod to dst are refused.
func (e *env) refused(dst netip.AddrPort) {
	e.t.Helper()
	rep, err := e.client.TCP(e.ctx(), dst, 3)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "ECONNREFUSED" {
			e.t.Errorf("%s, a Service without endpoints: %+v, want ECONNREFUSED", dst, r)
		}
	}
}
