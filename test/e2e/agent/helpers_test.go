package agent

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
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
	_, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// createService creates Service name with a fixed ClusterIP, port 80 to
// podPort.
func createService(ctx context.Context, cs kubernetes.Interface, name string, ip netip.Addr) error {
	_, err := cs.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP: ip.String(),
			Ports:     []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	return nil
}

// slice renders the EndpointSlice of Service svc with pods as ready
// endpoints on node-a; annotations as given.
func slice(svc string, annotations map[string]string, pods ...*sandbox.Pod) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:        svc + "-1",
			Labels:      map[string]string{discoveryv1.LabelServiceName: svc},
			Annotations: annotations,
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr[int32](podPort)}},
	}
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr("node-a"),
		})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// Bounds of the waits below; they are not speed assertions.
const (
	pollInterval = 50 * time.Millisecond
	waitBound    = 60 * time.Second
)

// waitAnswer waits, bounded, until server answers on dst from c.
func waitAnswer(ctx context.Context, c *sandbox.Client, dst netip.AddrPort, server string) error {
	w, err := c.StartWait(ctx, dst, sandbox.WaitOptions{Server: server, Timeout: time.Second, Interval: 5 * time.Millisecond,
		MaxDuration: waitBound})
	if err != nil {
		return err
	}
	res, err := w.Result(ctx)
	if err != nil {
		return err
	}
	if !res.Answered {
		return fmt.Errorf("%s did not answer on %s within %s: %d attempts, errors %v, other servers %v",
			server, dst, waitBound, res.Attempts, res.Errors, res.Servers)
	}
	return nil
}

// waitFor polls cond, bounded.
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(waitBound)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
	return fmt.Errorf("%s: not within %s (last error: %v)", what, waitBound, last)
}
