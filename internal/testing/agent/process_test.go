package agent_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
)

// shell runs script with sh in the test binary's namespace.
func shell(t *testing.T, logPath, script string) *agent.Process {
	t.Helper()
	return agent.Run(t, agent.Options{Name: "script", Bin: "sh", Args: []string{"-c", script}, LogPath: logPath})
}

func TestProcessLogsAndStops(t *testing.T) {
	for _, tc := range []struct {
		name    string
		logPath string
	}{
		{"output in memory", ""},
		{"output in a file", filepath.Join(t.TempDir(), "log")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// exec: SIGTERM reaches sleep itself, not a shell waiting on it.
			p := shell(t, tc.logPath, "echo starting; echo ready; exec sleep 60")
			if err := p.WaitLog(10*time.Second, []string{"starting", "ready"}, "failed"); err != nil {
				t.Fatal(err)
			}
			if got := p.LogTail(1); got != "ready" {
				t.Errorf("LogTail(1) = %q, want the last line", got)
			}
			if !p.Running() || p.ExitError() != nil {
				t.Fatalf("not running after it logged: %v", p.ExitError())
			}
			if err := p.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			if err := p.ExitError(); err == nil || !strings.Contains(err.Error(), "script exited") {
				t.Errorf("ExitError after SIGTERM = %v, want the signal", err)
			}
		})
	}
}

func TestWaitLogFailsEarly(t *testing.T) {
	for _, tc := range []struct {
		name, script, want string
	}{
		{"the process exits", "echo bye", "exited before it logged"},
		{"the output holds a failure", "echo failed; exec sleep 60", `logged "failed"`},
		{"time runs out", "exec sleep 60", "did not log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := shell(t, "", tc.script)
			err := p.WaitLog(time.Second, []string{"ready"}, "failed")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("WaitLog: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestWaitReportsAProcessStillRunning(t *testing.T) {
	p := shell(t, "", "exec sleep 60")
	if err := p.Wait(50 * time.Millisecond); !errors.Is(err, agent.ErrRunning) {
		t.Errorf("Wait: %v, want ErrRunning", err)
	}
	p.Kill()
	if p.Running() {
		t.Error("running after Kill")
	}
}

func TestGetAndMetrics(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("# TYPE up gauge\nup 1\n"))
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	p := shell(t, "", "exec sleep 60")
	url := "http://" + l.Addr().String() + "/metrics"
	code, body := p.MustGet(t, url)
	if code != http.StatusOK || !strings.Contains(body, "up 1") {
		t.Errorf("GET: %d %q", code, body)
	}
	fams, err := p.Metrics(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	if v := fams["up"].GetMetric()[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("up = %v, want 1", v)
	}
}
