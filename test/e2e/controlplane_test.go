package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
)

// TestControlPlane proves the harness the other end-to-end tests stand on:
// objects written through the API are what a proxy reads with upstream
// kube-proxy's identity and rights, the API server can be restarted under a
// client, and nothing is left running afterwards.
func TestControlPlane(t *testing.T) {
	c := cluster.StartT(t, cluster.Options{})
	ctx := t.Context()
	admin := c.Clientset()

	version, err := admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if version.GitVersion != cluster.KubernetesVersion {
		t.Errorf("API server reports version %q, want %q (version ldflags of build-binaries.sh)", version.GitVersion, cluster.KubernetesVersion)
	}

	if _, err := c.CreateNode(ctx, cluster.Node{
		Name:        "node-a",
		InternalIPs: []string{"192.168.77.10"},
		Labels:      map[string]string{cluster.ZoneLabel: "zone-a"},
	}); err != nil {
		t.Fatal(err)
	}
	svc, err := admin.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"),
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !netip.MustParsePrefix(cluster.ServiceCIDR).Contains(ip) {
		t.Errorf("ClusterIP %q is not in %s", svc.Spec.ClusterIP, cluster.ServiceCIDR)
	}
	if _, err := admin.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "web-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.244.1.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To("node-a"),
			Zone:       ptr.To("zone-a"),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Upstream kube-proxy will run with this file, so read it as a file.
	proxyConfig, err := clientcmd.BuildConfigFromFlags("", c.KubeProxyKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := kubernetes.NewForConfig(proxyConfig)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("kube-proxy identity", func(t *testing.T) {
		checkProxyRights(t, proxy, svc.Spec.ClusterIP)
	})

	t.Run("kubectl with the admin kubeconfig", func(t *testing.T) {
		out, err := exec.Command(c.Binaries().Kubectl, "--kubeconfig", c.AdminKubeconfig(), "--cache-dir", t.TempDir(),
			"get", "service", "web", "--namespace=default", "--output=jsonpath={.spec.clusterIP}").CombinedOutput()
		if err != nil || string(out) != svc.Spec.ClusterIP {
			t.Errorf("kubectl get service web: %v: %q, want %q", err, out, svc.Spec.ClusterIP)
		}
	})

	oldAPIServer := c.APIServerPID()
	t.Run("API server restart", func(t *testing.T) {
		c.StopAPIServer()
		if cluster.ProcessRunning(oldAPIServer) {
			t.Fatalf("kube-apiserver %d still runs after StopAPIServer", oldAPIServer)
		}
		if _, err := admin.Discovery().ServerVersion(); err == nil {
			t.Fatal("the API server answered while stopped")
		}
		if err := c.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		if pid := c.APIServerPID(); pid == oldAPIServer || pid == 0 {
			t.Errorf("kube-apiserver PID after restart: %d, before: %d", pid, oldAPIServer)
		}
		// The same clientsets, unchanged, and the objects kept in etcd.
		got, err := admin.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.ClusterIP != svc.Spec.ClusterIP || got.UID != svc.UID {
			t.Errorf("service after restart: ClusterIP %s UID %s, before: %s %s", got.Spec.ClusterIP, got.UID, svc.Spec.ClusterIP, svc.UID)
		}
		checkProxyRights(t, proxy, svc.Spec.ClusterIP)
	})

	t.Run("teardown", func(t *testing.T) {
		pids := []int{c.EtcdPID(), c.APIServerPID(), oldAPIServer}
		dir := c.Dir()
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if cluster.ProcessRunning(pid) {
				t.Errorf("process %d still runs after Stop", pid)
			}
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("cluster directory %s: stat error %v, want it removed", dir, err)
		}
		if conn, err := net.Dial("tcp", strings.TrimPrefix(c.URL(), "https://")); err == nil {
			conn.Close()
			t.Errorf("%s still accepts connections after Stop", c.URL())
		}
	})
}

// checkProxyRights checks what the system:node-proxier role allows and
// forbids, through the API, as kube-proxy sees it.
func checkProxyRights(t *testing.T, proxy kubernetes.Interface, clusterIP string) {
	t.Helper()
	ctx := t.Context()
	allowed := []struct {
		name  string
		check func() error
	}{
		{"list services: sees web with its ClusterIP", func() error {
			l, err := proxy.CoreV1().Services("").List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(l.Items, func(s corev1.Service) bool {
				return s.Namespace == "default" && s.Name == "web" && s.Spec.ClusterIP == clusterIP
			}) {
				return fmt.Errorf("web with ClusterIP %s not among %d services", clusterIP, len(l.Items))
			}
			return nil
		}},
		{"list endpointslices: sees web-1 with its endpoint", func() error {
			l, err := proxy.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
			if err != nil {
				return err
			}
			if len(l.Items) != 1 || len(l.Items[0].Endpoints) != 1 || l.Items[0].Endpoints[0].Addresses[0] != "10.244.1.5" {
				return fmt.Errorf("got %d slices, want web-1 with endpoint 10.244.1.5: %+v", len(l.Items), l.Items)
			}
			return nil
		}},
		{"get node: sees its InternalIP and zone", func() error {
			n, err := proxy.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !slices.Contains(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.77.10"}) ||
				n.Labels[cluster.ZoneLabel] != "zone-a" {
				return fmt.Errorf("node-a: addresses %v, labels %v", n.Status.Addresses, n.Labels)
			}
			return nil
		}},
	}
	for _, a := range allowed {
		if err := a.check(); err != nil {
			t.Errorf("%s: %v", a.name, err)
		}
	}

	forbidden := []struct {
		name string
		do   func() error
	}{
		{"create service", func() error {
			_, err := proxy.CoreV1().Services("default").Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "not-allowed"},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
			}, metav1.CreateOptions{})
			return err
		}},
		{"delete endpointslice", func() error {
			return proxy.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-1", metav1.DeleteOptions{})
		}},
		{"update node", func() error {
			n, err := proxy.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Labels["changed"] = "true"
			_, err = proxy.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}},
		{"list secrets", func() error {
			_, err := proxy.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
	}
	for _, f := range forbidden {
		if err := f.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s as %s: got %v, want Forbidden", f.name, cluster.KubeProxyUser, err)
		}
	}
}
