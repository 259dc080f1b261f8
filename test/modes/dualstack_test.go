package modes_test

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
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

// dualStackNode routes the pods' and the client's IPv6 through the node
// and writes the dual-stack manifests.
func (e *env) dualStackNode() {
	e.t.Helper()
	for _, h := range []*sandbox.Host{e.pods[0].Host, e.pods[1].Host, e.client.Host} {
		if err := behaviour.RouteIPv6ThroughNode(h, e.node); err != nil {
			e.t.Fatal(err)
		}
	}
	e.writeDualStackManifests()
}

// servesBothFamilies checks what a fallback mode's two dataplanes serve: a
// dual-stack Service answers on both families, through its ClusterIPs and
// its NodePort, an IPv6 Service without endpoints refuses, a health check
// node port answers on each family with that family's local endpoints,
// and each family's sync loop reports under its ip_family.
func (e *env) servesBothFamilies(a *agent.Process) {
	t := e.t
	t.Helper()
	e.reaches(e.client, netip.AddrPortFrom(clusterIP, 80), 24)
	e.reaches(e.client, netip.AddrPortFrom(sandbox.IPv6Of(clusterIP), 80), 24)
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP6, nodePort), 24)
	e.refused(netip.AddrPortFrom(emptyIP6, 80))
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
	var v6 bool
	s := e.state()
	for _, r := range s.iptables {
		v6 = v6 || strings.Contains(r.backend, "ip6tables")
	}
	if get(t, a, "/proxyMode") == "nftables" {
		v6 = slices.Contains(s.nftables, "table ip6 "+nftables.TableName)
	}
	if !v6 {
		t.Errorf("no IPv6 rules of ours on the node (iptables %v, nftables %v)", s.iptables, s.nftables)
	}
}

// TestDualStack runs the agent on a dual-stack node (the sandbox's hosts
// have an address of each family, and no Node object says otherwise). In
// iptables mode both families are served (servesBothFamilies). In ebpf
// mode both ClusterIPs answer the pod, the IPv6 NodePort the external
// client, an IPv6 Service without endpoints refuses, the log says once
// that IPv6 is served, and nothing is left of the iptables mode's IPv6
// rules. On an IPv6-primary node auto picks the ebpf mode, which serves
// both families from inside and outside.
func TestDualStack(t *testing.T) {
	e := newEnv(t)
	e.dualStackNode()
	vip4 := netip.AddrPortFrom(clusterIP, 80)
	vip6 := netip.AddrPortFrom(sandbox.IPv6Of(clusterIP), 80)

	a := e.startAgent("iptables")
	e.expectOnly("iptables")
	e.servesBothFamilies(a)
	a.Terminate(t, time.Minute)

	a = e.startAgent("nftables")
	e.expectOnly("nftables")
	e.servesBothFamilies(a)
	a.Terminate(t, time.Minute)

	a = e.startAgent("ebpf")
	e.expectOnly("ebpf")
	e.reaches(e.client, vip4, 24)
	e.reaches(e.client, vip6, 24)
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP6, nodePort), 24)
	e.refused(netip.AddrPortFrom(emptyIP6, 80))
	if n := strings.Count(a.Logs(), "serving IPv6"); n != 1 {
		t.Errorf("the ebpf mode said %d times that it serves IPv6, want once:\n%s", n, a.Logs())
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

// TestDualStackIPVS runs the agent in ipvs mode on the dual-stack node: it
// starts an IPVS dataplane per family, which serve both families as the
// iptables mode does (servesBothFamilies), with IPv6 virtual servers and
// the EBPFPROXY-6- ipsets beside the IPv4 ones. A restart in iptables mode
// then leaves nothing of either family's IPVS objects.
func TestDualStackIPVS(t *testing.T) {
	e := newEnv(t)
	requireIPVS(t, e.node)
	e.dualStackNode()

	a := e.startAgent("ipvs")
	e.expectOnly("ipvs")
	if got := get(t, a, "/proxyMode"); got != "ipvs" {
		t.Errorf("/proxyMode %q, want ipvs", got)
	}
	e.servesBothFamilies(a)
	ipvsState := strings.Join(e.state().ipvs, "\n")
	for _, want := range []string{
		"virtual server " + sandbox.IPv6Of(clusterIP).String() + ":80/6",
		"virtual server " + e.node.IP6.String() + ":" + strconv.Itoa(nodePort) + "/6",
		"virtual server " + clusterIP.String() + ":80/6",
		"ipset " + xtables.Prefix + "6-CLUSTER-IP",
		"ipset " + xtables.Prefix + "CLUSTER-IP",
	} {
		if !strings.Contains(ipvsState, want) {
			t.Errorf("ipvs mode on a dual-stack node: no %q in\n%s", want, ipvsState)
		}
	}
	a.Terminate(t, time.Minute)

	a = e.startAgent("iptables")
	e.expectOnly("iptables")
	e.servesBothFamilies(a)
	a.Terminate(t, time.Minute)
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
