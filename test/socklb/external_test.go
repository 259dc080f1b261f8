package socklb_test

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

const nodePort = 30080

var (
	externalIP = netip.MustParseAddr("198.19.0.7")
	lbIP       = netip.MustParseAddr("198.19.0.8")
)

// exposed makes web a LoadBalancer Service with a NodePort, an ExternalIP
// and an ingress IP.
func exposed(svc *v1.Service) {
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.Ports[0].NodePort = nodePort
	svc.Spec.ExternalIPs = []string{externalIP.String()}
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: lbIP.String()}}
}

func (e *env) addExposedWeb(opts []func(*v1.Service), eps ...ep) {
	e.setNodeAddrs(e.node.IP)
	e.setService(makeService("web", webVIP.Addr().String(), int32(webVIP.Port()), v1.ProtocolTCP, intstr.FromString("http"), append([]func(*v1.Service){exposed}, opts...)...))
	e.setSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, eps...))
	e.sync()
}

// reach connects n times from c to addr and returns who answered, failing
// the test on any error and checking what getpeername() shows (any source
// address will do).
func (e *env) reach(t *testing.T, c *sandbox.Client, addr netip.AddrPort, n int) map[string]int {
	t.Helper()
	return e.tcpServers(t, c, addr, netip.Addr{}, n)
}

func TestNodeLocalClientsReachExternalFrontends(t *testing.T) {
	e := newEnv(t, 2)
	// One endpoint is "on another node": the sandbox pods all live on
	// node-a, so the EndpointSlice says where they run.
	remote := makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, e.podEPs(0, 1)...)
	remote.Endpoints[1].NodeName = ptr.To("node-b")
	e.addExposedWeb(nil)
	e.setSlice(remote)
	e.sync()

	nodeClient := e.sb.ClientAt(e.node.Host)
	frontends := []struct {
		name string
		addr netip.AddrPort
	}{
		{"NodePort on the node's address", netip.AddrPortFrom(e.node.IP, nodePort)},
		{"ExternalIP", netip.AddrPortFrom(externalIP, 80)},
		{"LoadBalancer IP", netip.AddrPortFrom(lbIP, 80)},
	}
	for _, c := range []*sandbox.Client{e.client, nodeClient} {
		for _, fe := range frontends {
			t.Run(c.Name+" to "+fe.name, func(t *testing.T) {
				if got := e.reach(t, c, fe.addr, 40); len(got) != 2 {
					t.Errorf("reached %v, want both endpoints", got)
				}
			})
		}
	}

	t.Run("externalTrafficPolicy=Local short-circuits clients on the node", func(t *testing.T) {
		// pod-0 is local, pod-1 remote. Outside clients would get pod-0
		// only; kube-proxy sends pods and the node to every endpoint.
		e.addExposedWeb([]func(*v1.Service){func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000 // allocated by the API server
		}})
		e.setSlice(remote)
		e.sync()
		for _, c := range []*sandbox.Client{e.client, nodeClient} {
			if got := e.reach(t, c, netip.AddrPortFrom(e.node.IP, nodePort), 40); len(got) != 2 {
				t.Errorf("%s to the NodePort reached %v, want both endpoints", c.Name, got)
			}
		}
	})
}

func TestAffinityIsSharedByAServicePortsFrontends(t *testing.T) {
	e := newEnv(t, 3)
	e.addExposedWeb([]func(*v1.Service){clientIP(3600)}, e.podEPs(0, 1, 2)...)
	got := e.reach(t, e.client, webVIP, 10)
	first, ok := only(got)
	if !ok {
		t.Fatalf("ClusterIP with affinity reached %v", got)
	}
	for _, fe := range []netip.AddrPort{netip.AddrPortFrom(e.node.IP, nodePort), netip.AddrPortFrom(externalIP, 80), netip.AddrPortFrom(lbIP, 80)} {
		if b, ok := only(e.reach(t, e.client, fe, 10)); !ok || b != first {
			t.Errorf("%s: went to %s, want %s as through the ClusterIP", fe, b, first)
		}
	}
}
