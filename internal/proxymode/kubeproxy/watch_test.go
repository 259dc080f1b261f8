package kubeproxy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// startFakeKubeProxy runs a copy of sleep named kube-proxy and returns its
// PID; the test kills it by that PID.
func startFakeKubeProxy(t *testing.T) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), ProcessName)
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() //nolint:errcheck // ended already if it fails
			cmd.Wait()         //nolint:errcheck // killed
		}
	})
	return cmd
}

// While a kube-proxy process runs, its rules stay (it would put them back,
// and it may still be serving); once it has exited, the next check removes
// them, and the metrics say so.
func TestWatchWaitsForKubeProxyToExit(t *testing.T) {
	ns := sandbox.TestNetns(t, "kp-watch").Path()
	v4 := runner(t, ns, xtables.BackendLegacy, false)
	load(t, v4, "testdata/node-ipv4.rules")
	before := tableState(t, v4)
	fake := startFakeKubeProxy(t)

	// Only the test's own kube-proxy counts: another one on this machine
	// (a differential test's) must not hold this test up.
	running := func() ([]int, error) {
		pids, err := Running("/proc")
		return slices.DeleteFunc(pids, func(p int) bool { return p != fake.Process.Pid }), err
	}
	if pids, err := running(); err != nil || !slices.Equal(pids, []int{fake.Process.Pid}) {
		t.Fatalf("Running finds %v, %v; want the fake kube-proxy %d", pids, err, fake.Process.Pid)
	}
	present := prometheus.NewGauge(prometheus.GaugeOpts{Name: "present"})
	removed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "removed"}, []string{"kind"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		Watch(ctx, Config{Netns: ns, Interval: 50 * time.Millisecond, Running: running, Present: present, Removed: removed})
		close(done)
	}()

	// The first check reads both iptables back ends, which takes a
	// while in an emulated guest; then a few more checks pass.
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(present) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("leftovers gauge = %v 30 s into kube-proxy's run, want 1", testutil.ToFloat64(present))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // ten more checks
	if got := tableState(t, v4); !slices.Equal(got, before) {
		t.Fatalf("rules changed while kube-proxy runs:\n%s", strings.Join(got, "\n"))
	}
	if v := testutil.ToFloat64(present); v != 1 {
		t.Errorf("leftovers gauge = %v while kube-proxy runs, want 1", v)
	}
	select {
	case <-done:
		t.Fatal("Watch returned while kube-proxy runs")
	default:
	}

	if err := fake.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	fake.Wait() //nolint:errcheck // killed
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return within 10s of kube-proxy's exit")
	}
	if got, want := tableState(t, v4), without(before, removedIPv4); !slices.Equal(got, want) {
		t.Errorf("tables after kube-proxy's exit:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if v := testutil.ToFloat64(present); v != 0 {
		t.Errorf("leftovers gauge = %v after removal, want 0", v)
	}
	if v := testutil.ToFloat64(removed.WithLabelValues("chain")); v != float64(len(removedIPv4)) {
		t.Errorf("chains counted removed = %v, want %d", v, len(removedIPv4))
	}
}

// Where the agent cannot see the node's processes it removes nothing.
func TestWatchRemovesNothingWhenItCannotTell(t *testing.T) {
	ns := sandbox.TestNetns(t, "kp-watch-blind").Path()
	v4 := runner(t, ns, xtables.BackendLegacy, false)
	load(t, v4, "testdata/node-ipv4.rules")
	before := tableState(t, v4)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	Watch(ctx, Config{Netns: ns, Interval: 50 * time.Millisecond, Running: func() ([]int, error) {
		return Running(filepath.Join(t.TempDir(), "no-proc"))
	}})
	if got := tableState(t, v4); !slices.Equal(got, before) {
		t.Errorf("rules changed although /proc was unreadable:\n%s", strings.Join(got, "\n"))
	}
}
