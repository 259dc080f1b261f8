package socklb_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// Where the agent's servers listen inside the node's namespace, when a
// test asks for them.
const (
	healthzAddr = "127.0.0.1:10256"
	metricsAddr = "127.0.0.1:10249"
	// probeAddr is --probe-bind-address's default, where the DaemonSet's
	// HTTP probes ask.
	probeAddr = "127.0.0.1:10266"
)

// startAgent runs the real agent in the node's namespace against the
// sandbox's cgroup and bpffs, reading Services from dir, with its API
// socket in a directory of the test (never the host's /run), and waits for
// its first sync. Extra flags follow the defaults.
func (e *env) startAgent(t *testing.T, dir string, extra ...string) *agent.Process {
	t.Helper()
	args := append([]string{"--manifests", dir, "--cgroup-path", e.sb.Cgroup.Path(),
		"--bpffs-path", e.bpffs, "--hostname-override", nodeName, "--api-socket", filepath.Join(t.TempDir(), "agent.sock"),
		"--healthz-bind-address", "", "--metrics-bind-address", "", "--probe-bind-address", "", "-v", "2"}, extra...)
	a := agent.Run(t, agent.Options{Args: args, Netns: e.node.NS.Path()})
	if err := a.WaitLog(2*time.Minute, []string{"first sync done in every IP family"}); err != nil {
		t.Fatalf("agent did not sync: %v\n%s", err, a.Logs())
	}
	return a
}

func (e *env) dump(t *testing.T) string {
	t.Helper()
	out, err := agent.Dump(e.bpffs)
	if err != nil {
		t.Fatalf("dump: %v\n%s", err, out)
	}
	return out
}

// attachedPrograms counts the programs attached to the sandbox's cgroup for
// connect().
func (e *env) attachedPrograms(t *testing.T) int {
	t.Helper()
	fd, err := unix.Open(e.sb.Cgroup.Path(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupInet4Connect})
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Programs)
}

// writeManifests writes web, a Service whose named target port the pods
// serve on 8080, with the pods as its endpoints.
func writeManifests(t *testing.T, dir string, pods ...*sandbox.Pod) {
	t.Helper()
	web := builders.Service("default", "web", builders.ClusterIP("10.96.0.80"),
		builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http"))))
	if err := builders.WriteManifest(dir, "web.yaml", web, builders.EndpointSlice("default", "web-1", "web", podEndpoints(pods))); err != nil {
		t.Fatal(err)
	}
}

// podEndpoints are ready endpoints for pods, all on the node.
func podEndpoints(pods []*sandbox.Pod) []discoveryv1.Endpoint {
	var eps []discoveryv1.Endpoint
	for _, p := range pods {
		eps = append(eps, builders.Endpoint(p.IP.String(), nodeName))
	}
	return eps
}

func TestAgentRestartKeepsTrafficAndIDs(t *testing.T) {
	e := newSandbox(t, 2)
	dir := t.TempDir()
	writeManifests(t, dir, e.pods[0], e.pods[1])

	first := e.startAgent(t, dir)
	before := e.dump(t)
	if !strings.Contains(before, "service 10.96.0.80:80/TCP count=2") {
		t.Fatalf("agent did not program the Service:\n%s", before)
	}
	loop, err := e.client.StartLoop(e.ctx(), webVIP, sandbox.LoopOptions{Interval: 5 * time.Millisecond, MaxDuration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// SIGKILL: no chance to clean up. The pinned programs keep serving.
	first.SignalAndWait(t, syscall.SIGKILL, 15*time.Second)
	time.Sleep(300 * time.Millisecond)

	second := e.startAgent(t, dir)
	if after := e.dump(t); after != before {
		t.Errorf("maps changed across the restart (ids must be adopted, not renumbered):\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := e.attachedPrograms(t); n != 1 {
		t.Errorf("%d connect4 programs attached after the restart, want 1 (adopted in place)", n)
	}
	time.Sleep(300 * time.Millisecond)

	// SIGTERM also leaves the programs in place.
	if err := second.SignalAndWait(t, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Errorf("agent exit on SIGTERM: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	res := loop.StopUnbroken(t, "across the restarts")
	if len(res.Servers) != 2 {
		t.Errorf("connections reached %v, want both pods", res.Servers)
	}

	// --cleanup detaches everything.
	if _, err := agent.Cleanup(e.ctx(), e.node.NS.Path(), e.bpffs); err != nil {
		t.Fatal(err)
	}
	if n := e.attachedPrograms(t); n != 0 {
		t.Errorf("%d programs still attached after --cleanup", n)
	}
	if entries, _ := os.ReadDir(e.bpffs); len(entries) != 0 {
		t.Errorf("pins left after --cleanup: %v", entries)
	}
}

func TestAgentFollowsManifestChanges(t *testing.T) {
	e := newSandbox(t, 2)
	dir := t.TempDir()
	writeManifests(t, dir, e.pods[0])
	a := e.startAgent(t, dir, "--healthz-bind-address", healthzAddr, "--metrics-bind-address", metricsAddr, "--probe-bind-address", probeAddr)

	t.Run("health and metrics servers answer as kube-proxy's", func(t *testing.T) {
		for _, addr := range []string{healthzAddr, probeAddr} {
			for _, path := range []string{"/healthz", "/livez"} {
				code, body := a.MustGet(t, "http://"+addr+path)
				if code != 200 || !strings.Contains(body, `"healthy":true`) || !strings.Contains(body, `"lastUpdated"`) {
					t.Errorf("%s%s: %d %s", addr, path, code, body)
				}
			}
		}
		if code, body := a.MustGet(t, "http://"+metricsAddr+"/proxyMode"); code != 200 || strings.TrimSpace(body) != "ebpf" {
			t.Errorf("/proxyMode: %d %q", code, body)
		}
		_, body := a.MustGet(t, "http://"+metricsAddr+"/metrics")
		for _, m := range []string{
			"kubeproxy_sync_proxy_rules_duration_seconds_bucket",
			"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			"kubeproxy_network_programming_duration_seconds_bucket",
			`ebpfproxy_bpf_events_total{event="translated_tcp"}`,
		} {
			if !strings.Contains(body, m) {
				t.Errorf("/metrics lacks %s", m)
			}
		}
	})

	reached := func() map[string]int {
		rep, err := e.client.TCP(e.ctx(), webVIP, 30)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, r := range rep.Results {
			got[r.Server+r.Err]++
		}
		return got
	}
	if got := reached(); got[e.pods[0].Name] != 30 {
		t.Fatalf("before the change: %v, want all on %s", got, e.pods[0].Name)
	}
	writeManifests(t, dir, e.pods[1])
	if err := testbed.Poll(e.ctx(), "the agent follows the changed EndpointSlice", 15*time.Second, func() (bool, error) {
		got := reached()
		return got[e.pods[1].Name] == 30, fmt.Errorf("%v", got)
	}); err != nil {
		t.Fatal(err)
	}
}
