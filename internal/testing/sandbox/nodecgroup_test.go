package sandbox_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Each node of a multi-node test gets its own cgroup, so that the proxy of
// one node acts only on that node's clients.
func TestClientsRunInTheirNodesCgroup(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	cgA := must(c.sb.AddCgroup("node-a"))(t)
	cgB := must(c.sb.AddCgroup("node-b"))(t)
	if _, err := c.sb.AddCgroup("node-a"); err == nil {
		t.Error("a second cgroup named node-a was created")
	}
	if _, err := c.sb.AddCgroup("../escape"); err == nil {
		t.Error("a cgroup named ../escape was created")
	}
	tests := []struct {
		name   string
		client *sandbox.Client
		want   *sandbox.Cgroup
	}{
		{"a client without a cgroup runs in the sandbox's", c.client, c.sb.Cgroup},
		{"a client placed in node-a's cgroup runs there", c.client.InCgroup(cgA), cgA},
		{"a node's own client placed in node-b's cgroup runs there", c.sb.ClientAt(c.node.Host).InCgroup(cgB), cgB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.client.Cgroup() != tt.want {
				t.Errorf("Cgroup() = %s, want %s", tt.client.Cgroup().Name(), tt.want.Name())
			}
			rep, err := tt.client.TCP(t.Context(), ap(podAIP, 8080), 1)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Process.Cgroup != tt.want.Name() {
				t.Errorf("probe ran in cgroup %q, want %q", rep.Process.Cgroup, tt.want.Name())
			}
			if r := rep.Results[0]; r.Err != "" || r.Server != "pod-a" {
				t.Errorf("probe got %+v, want an answer from pod-a", r)
			}
		})
	}

	// A probe left running in a node cgroup is ended by Close, and the
	// cgroup goes with the sandbox.
	loop := must(c.client.InCgroup(cgA).StartLoop(t.Context(), ap(podAIP, 8080), sandbox.LoopOptions{}))(t)
	procs := must(cgA.Procs())(t)
	if !slices.Contains(procs, loop.PID()) {
		t.Errorf("node-a's cgroup.procs = %v, want the loop's PID %d", procs, loop.PID())
	}
	paths := []string{cgA.Path(), cgB.Path()}
	if err := c.sb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := loop.Stop(); err != nil {
		t.Errorf("loop after Close: %v", err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (stat: %v)", p, err)
		}
	}
	if _, err := c.sb.AddCgroup("late"); err == nil {
		t.Error("AddCgroup on a closed sandbox succeeded")
	}
	if _, err := os.Stat(filepath.Dir(paths[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup mount %s left behind (stat: %v)", filepath.Dir(paths[0]), err)
	}
}

func TestNamedServersSayWhichPortAnswered(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	must(c.podA.StartTCPServerNamed(7070, "pod-a:7070"))(t)
	must(c.podA.StartUDPServerNamed(7070, "pod-a:7070/udp"))(t)
	for _, bad := range []string{"", "two words", "line\nbreak"} {
		if _, err := c.podA.StartTCPServerNamed(7071, bad); err == nil {
			t.Errorf("server named %q was started", bad)
		}
	}
	tcp := must(c.client.TCP(t.Context(), ap(podAIP, 7070), 1))(t)
	udp := must(c.client.UDPConnected(t.Context(), ap(podAIP, 7070), 1))(t)
	tests := []struct {
		name, got, err, want string
	}{
		{"tcp", tcp.Results[0].Server, tcp.Results[0].Err, "pod-a:7070"},
		{"udp", udp.Results[0].Server, udp.Results[0].Err, "pod-a:7070/udp"},
	}
	for _, tt := range tests {
		if tt.err != "" || tt.got != tt.want {
			t.Errorf("%s: answered by %q (error %q), want %q", tt.name, tt.got, tt.err, tt.want)
		}
	}
}

func TestWaitEndsWhenTheAwaitedServerAnswers(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	late := netip.MustParseAddr("10.244.1.50")
	tests := []struct {
		name string
		// act, if set, runs once the probe is watching; it returns when
		// the awaited answer became possible.
		act          func(t *testing.T) time.Time
		dst          netip.AddrPort
		server       string
		wantAnswered bool
		wantErrors   bool
	}{
		{"a server that answers at once ends the wait on the first attempt", nil, ap(podAIP, 8080), "pod-a", true, false},
		{"a pod that appears later ends the wait once it serves", func(t *testing.T) time.Time {
			pod := must(c.sb.AddPod(c.node, "late", late))(t)
			start := time.Now()
			must(pod.StartTCPServer(8080))(t)
			return start
		}, ap(late, 8080), "late", true, true},
		{"another server's answers do not end the wait", nil, ap(podBIP, 8080), "pod-a", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready := time.Now()
			w, err := c.client.StartWait(t.Context(), tt.dst, sandbox.WaitOptions{
				Server: tt.server, Timeout: 200 * time.Millisecond, Interval: time.Millisecond, MaxAttempts: 300, MaxDuration: time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = w.Stop() })
			if tt.act != nil {
				ready = tt.act(t)
			}
			res, err := w.Result(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			checkProcess(t, c.sb, c.client, res.Process)
			if res.Answered != tt.wantAnswered {
				t.Fatalf("answered = %v, want %v (result %+v)", res.Answered, tt.wantAnswered, res)
			}
			if (len(res.Errors) > 0) != tt.wantErrors {
				t.Errorf("errors before the answer: %v, want some: %v", res.Errors, tt.wantErrors)
			}
			if !tt.wantAnswered {
				if res.Attempts != 300 || res.Servers["pod-b"] != 300 {
					t.Errorf("got %d attempts answered by %v, want all 300 by pod-b", res.Attempts, res.Servers)
				}
				return
			}
			if res.Answer.Server != tt.server || res.AnsweredAt.Before(ready) {
				t.Errorf("answer %+v at %v, want one from %s after %v", res.Answer, res.AnsweredAt, tt.server, ready)
			}
		})
	}
}
