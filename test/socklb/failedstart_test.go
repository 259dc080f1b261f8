package socklb_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestAFailedStartLeavesNothingHalfMade: an agent whose start fails after
// it attached its programs (here: a typo in --manifests, found once the
// dataplane is up) exits with a one-line error and leaves the node as it
// found it: on a fresh node, no program attached and nothing pinned; on a
// node a killed agent left serving, the pins and programs it adopted keep
// serving, untouched.
func TestAFailedStartLeavesNothingHalfMade(t *testing.T) {
	e := newSandbox(t, 1)
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	failedStart := func(t *testing.T) string {
		t.Helper()
		args := []string{"--manifests", missing, "--cgroup-path", e.sb.Cgroup.Path(),
			"--bpffs-path", e.bpffs, "--hostname-override", nodeName, "--api-socket", filepath.Join(t.TempDir(), "agent.sock"),
			"--healthz-bind-address", "", "--metrics-bind-address", "", "--probe-bind-address", "", "-v", "2"}
		a := agent.Run(t, agent.Options{Args: args, Netns: e.node.NS.Path()})
		if err := a.ExitWithin(t, time.Minute); err == nil {
			t.Fatalf("the agent exited 0 with a missing --manifests directory:\n%s", a.Logs())
		}
		logs := a.Logs()
		if strings.Contains(logs, "goroutine ") || !strings.Contains(logs, missing) {
			t.Errorf("want one line naming %s, not a stack trace:\n%s", missing, logs)
		}
		return logs
	}

	t.Run("fresh node: nothing attached, nothing pinned", func(t *testing.T) {
		logs := failedStart(t)
		if n := e.attachedPrograms(t); n != 0 {
			t.Errorf("%d programs attached to the cgroup after a failed start:\n%s", n, logs)
		}
		if pins := pinsUnder(t, e.bpffs); len(pins) != 0 {
			t.Errorf("pins left after a failed start: %v\n%s", pins, logs)
		}
	})

	t.Run("a running agent's pins: kept serving", func(t *testing.T) {
		dir := t.TempDir()
		writeManifests(t, dir, e.pods[0])
		first := e.startAgent(t, dir)
		first.SignalAndWait(t, syscall.SIGKILL, 15*time.Second)
		before := pinsUnder(t, e.bpffs)
		logs := failedStart(t)
		if n := e.attachedPrograms(t); n != 1 {
			t.Errorf("%d programs attached after a failed start over a serving node, want the 1 it found:\n%s", n, logs)
		}
		if after := pinsUnder(t, e.bpffs); len(after) != len(before) {
			t.Errorf("pins %v after the failed start, want those it found: %v", after, before)
		}
		if err := e.client.AwaitServer(e.ctx(), webVIP, sandbox.WaitOptions{Server: e.pods[0].Name, Timeout: time.Second,
			Interval: 50 * time.Millisecond, MaxDuration: 5 * time.Second}); err != nil {
			t.Errorf("the Service stopped serving after a failed start: %v", err)
		}
	})
}

// pinsUnder lists the files under dir (pinned maps, programs and links).
func pinsUnder(t *testing.T, dir string) []string {
	t.Helper()
	var pins []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			pins = append(pins, strings.TrimPrefix(path, dir))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pins
}
