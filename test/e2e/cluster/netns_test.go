package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/interrupt"
)

// requireRoot fails the test in CI, which runs as root, and skips it, saying
// why, elsewhere.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if InCI() {
			t.Fatal("this test needs root (network namespaces), and CI runs as root")
		}
		t.Skip("needs root (network namespaces); CI=true turns this skip into a failure")
	}
}

// newNetNS creates a named network namespace with nothing but a loopback
// interface, and deletes it when the test ends or is interrupted.
func newNetNS(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("ebpf-proxy-e2e-cluster-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	del := func() { _ = exec.Command("ip", "netns", "delete", name).Run() }
	unregister := interrupt.Register(del)
	t.Cleanup(func() {
		del()
		unregister()
	})
	return name
}

func TestForwardIntoNetNS(t *testing.T) {
	requireRoot(t)
	c := StartT(t, Options{})
	ns := newNetNS(t)
	cacheDir := t.TempDir()

	// kubectl inside the namespace, with the kubeconfig file exactly as the
	// harness wrote it, is what a proxy under test will do.
	kubectl := func() (string, error) {
		out, err := exec.Command("ip", "netns", "exec", ns, c.Binaries().Kubectl,
			"--kubeconfig", c.KubeProxyKubeconfig(), "--cache-dir", cacheDir, "--request-timeout=20s",
			"get", "services", "--namespace=default", "--output=name").CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	wantOK := func(step string) {
		t.Helper()
		out, err := kubectl()
		if err != nil || out != "service/kubernetes" {
			t.Fatalf("%s: kubectl in the namespace: %v: %s; want service/kubernetes", step, err, out)
		}
	}
	wantRefused := func(step string) {
		t.Helper()
		out, err := kubectl()
		if err == nil || !strings.Contains(out, "refused") {
			t.Fatalf("%s: kubectl in the namespace: %v: %s; want the connection refused", step, err, out)
		}
	}

	// With the namespace's loopback up, a refusal shows that 127.0.0.1
	// there is not the root namespace's.
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("set lo up: %v: %s", err, out)
	}
	wantRefused("before forwarding")
	f, err := c.ForwardIntoNetNS("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	wantOK("forwarding")
	c.StopAPIServer()
	wantRefused("API server stopped")
	if err := c.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOK("API server started again")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantRefused("forwarder closed")
}
