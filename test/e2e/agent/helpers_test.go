package agent

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

const (
	namespace = "agent-e2e"
	podPort   = 8080
)

// oneNode is the testbed of these tests: node-a with pods a1 and a2.
func oneNode() testbed.Options {
	return testbed.Options{
		Nodes:    []testbed.NodeSpec{{Name: "node-a", Pods: []string{"a1", "a2"}}},
		TCPPorts: []uint16{podPort},
	}
}

func ensureNamespace(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	if err := builders.CreateNamespace(t.Context(), cs, namespace); err != nil {
		t.Fatal(err)
	}
}

// createService creates Service name with a fixed ClusterIP, port 80 to
// podPort.
func createService(ctx context.Context, cs kubernetes.Interface, name string, ip netip.Addr) error {
	svc := builders.Service(namespace, name, builders.ClusterIP(ip.String()),
		builders.Ports(builders.Port("http", 80, corev1.ProtocolTCP, intstr.FromInt32(podPort))))
	_, err := builders.CreateService(ctx, cs, svc)
	return err
}

// slice renders the EndpointSlice of Service svc with pods as ready
// endpoints on node-a; annotations as given.
func slice(svc string, annotations map[string]string, pods ...*sandbox.Pod) *discoveryv1.EndpointSlice {
	var eps []discoveryv1.Endpoint
	for _, p := range pods {
		eps = append(eps, builders.Endpoint(p.IP.String(), "node-a"))
	}
	return builders.EndpointSlice(namespace, svc+"-1", svc, eps, builders.SliceAnnotations(annotations),
		builders.SlicePorts(builders.SlicePort("http", podPort, corev1.ProtocolTCP)))
}

// Bounds of the waits below; they are not speed assertions.
const (
	waitBound = 60 * time.Second
)

// waitAnswer waits, bounded, until server answers on dst from c.
func waitAnswer(ctx context.Context, c *sandbox.Client, dst netip.AddrPort, server string) error {
	return c.AwaitServer(ctx, dst, sandbox.WaitOptions{Server: server, Timeout: time.Second, Interval: 5 * time.Millisecond,
		MaxDuration: waitBound})
}
