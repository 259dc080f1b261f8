package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets a test run the program itself as a child process, for what
// only a whole process shows: exit codes and signals.
func TestMain(m *testing.M) {
	if os.Getenv("TESTSERVER_RUN_MAIN") == "1" {
		os.Args = append([]string{"testserver"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startServer runs a Server named name on loopback ports and returns its TCP
// and UDP addresses; it stops at the end of the test.
func startServer(t *testing.T, name string) (tcp, udp string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Name: name, Linger: 5 * time.Second}
	done := make(chan error, 2)
	go func() { done <- s.ServeTCP(ctx, ln) }()
	go func() { done <- s.ServeUDP(ctx, pc) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		}
	})
	return ln.Addr().String(), pc.LocalAddr().String()
}

// closedPort returns a loopback address where nothing listens on network.
func closedPort(t *testing.T, network string) string {
	t.Helper()
	var addr string
	if network == "tcp" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = ln.Addr().String()
		ln.Close()
	} else {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = pc.LocalAddr().String()
		pc.Close()
	}
	return addr
}

// silent returns addresses that take connections and datagrams and never
// answer: a listener that never accepts, a socket that never replies.
func silent(t *testing.T) (tcp, udp string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	return ln.Addr().String(), pc.LocalAddr().String()
}

// oneShot returns the address of a TCP server that answers every connection
// with reply (nothing when empty) and closes it.
func oneShot(t *testing.T, reply string) string {
	return answering(t, 0, reply)
}

// answering is oneShot with each answer delay after the connection. The
// answer and the close leave in one segment (TCP_CORK holds the answer
// until the close sets FIN on it): a client that has read the answer has
// its FIN too, and its socket is in CLOSE_WAIT whatever the scheduling.
func answering(t *testing.T, delay time.Duration, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if err := cork(c); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(delay)
				_, _ = c.Write([]byte(reply))
			}()
		}
	}()
	return ln.Addr().String()
}

// cork sets TCP_CORK on c, a TCP connection.
func cork(c net.Conn) error {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, 1)
	}); err != nil {
		return err
	}
	return serr
}

func TestProbe(t *testing.T) {
	tcp, udp := startServer(t, "pod-a")
	silentTCP, silentUDP := silent(t)
	tests := []struct {
		name, proto, addr string
		wantError         string
		// wantState is the TCP state a failed attempt's socket was in.
		wantState string
	}{
		{"tcp: the server's name and the client's address", "tcp", tcp, "", ""},
		{"udp: the server's name and the client's address", "udp", udp, "", ""},
		{"tcp: nothing listening is refused", "tcp", closedPort(t, "tcp"), KindRefused, "CLOSE"},
		{"udp: nothing listening is refused (port unreachable)", "udp", closedPort(t, "udp"), KindRefused, ""},
		{"tcp: no answer is a timeout", "tcp", silentTCP, KindTimeout, "ESTABLISHED"},
		{"udp: no answer is a timeout", "udp", silentUDP, KindTimeout, ""},
		{"tcp: closed before the answer", "tcp", oneShot(t, ""), KindEOF, "CLOSE_WAIT"},
		{"tcp: an answer of one word is not a server's", "tcp", oneShot(t, "hello\n"), KindBadAnswer, "CLOSE_WAIT"},
		{"tcp: an answer without its newline is incomplete", "tcp", oneShot(t, "pod-b 127.0.0.1:1"), KindBadAnswer, "CLOSE_WAIT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Probe(context.Background(), tt.proto, tt.addr, 2, 300*time.Millisecond)
			if len(r.Attempts) != 2 {
				t.Fatalf("%d attempts, want 2", len(r.Attempts))
			}
			for _, a := range r.Attempts {
				if a.Error != tt.wantError {
					t.Errorf("error %q (%s), want %q", a.Error, a.Detail, tt.wantError)
				}
				switch {
				case tt.wantState == "" && a.Socket != nil:
					t.Errorf("socket %s, want none described", a.Socket)
				case tt.wantState != "" && a.Socket == nil:
					t.Errorf("failed TCP attempt without its socket")
				case tt.wantState != "" && (a.Socket.State != tt.wantState || a.Socket.LocalPort == 0):
					t.Errorf("socket %s, want %s and its local port", a.Socket, tt.wantState)
				}
				if tt.wantError != "" {
					continue
				}
				if a.Server != "pod-a" {
					t.Errorf("server %q, want pod-a", a.Server)
				}
				if host, _, err := net.SplitHostPort(a.Peer); err != nil || host != "127.0.0.1" {
					t.Errorf("peer %q, want 127.0.0.1:port", a.Peer)
				}
				if a.ElapsedMS <= 0 {
					t.Errorf("elapsed %v ms", a.ElapsedMS)
				}
			}
			wantOK := 2
			if tt.wantError != "" {
				wantOK = 0
			}
			if r.OK != wantOK || r.Failed != 2-wantOK {
				t.Errorf("ok %d failed %d, want %d and %d", r.OK, r.Failed, wantOK, 2-wantOK)
			}
		})
	}
}

func TestServeTCPClosesLingeringConnectionsOnStop(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Server{Name: "a", Linger: time.Hour}).ServeTCP(ctx, ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 100)
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeTCP still runs 5s after its context ended")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ServeTCP took %v to stop", d)
	}
}

func TestLoop(t *testing.T) {
	t.Run("stdin closes: every attempt answered", func(t *testing.T) {
		tcp, _ := startServer(t, "pod-a")
		stop := make(chan struct{})
		time.AfterFunc(300*time.Millisecond, func() { close(stop) })
		r := Loop(context.Background(), tcp, 20*time.Millisecond, time.Second, time.Minute, stop)
		if r.Stopped != "stdin" {
			t.Errorf("stopped by %q, want stdin", r.Stopped)
		}
		if r.Attempts < 5 || r.Failures != 0 || r.Servers["pod-a"] != r.Attempts {
			t.Errorf("attempts %d failures %d servers %v, want >= 5, 0, all pod-a", r.Attempts, r.Failures, r.Servers)
		}
		if r.FirstFailure != nil || r.LastFailure != nil {
			t.Errorf("failure times %v %v, want none", r.FirstFailure, r.LastFailure)
		}
	})
	t.Run("max duration: failures counted by kind with their times", func(t *testing.T) {
		addr := closedPort(t, "tcp")
		r := Loop(context.Background(), addr, 20*time.Millisecond, time.Second, 200*time.Millisecond, nil)
		if r.Stopped != "max-duration" {
			t.Errorf("stopped by %q, want max-duration", r.Stopped)
		}
		if r.Attempts < 3 || r.Failures != r.Attempts || r.Errors[KindRefused] != r.Attempts {
			t.Errorf("attempts %d failures %d errors %v, want all refused", r.Attempts, r.Failures, r.Errors)
		}
		if r.FirstFailure == nil || r.LastFailure == nil || !r.LastFailure.After(*r.FirstFailure) {
			t.Errorf("first failure %v, last %v", r.FirstFailure, r.LastFailure)
		}
		if want := min(r.Failures, maxFailedAttempts); len(r.FailedAttempts) != want {
			t.Errorf("%d failed attempts kept, want %d", len(r.FailedAttempts), want)
		} else if f := r.FailedAttempts[0]; f.Error != KindRefused || !f.At.Equal(*r.FirstFailure) {
			t.Errorf("first failed attempt %+v, want refused at %v", f, *r.FirstFailure)
		}
		if d := r.Ended.Sub(r.Started); d < 200*time.Millisecond || d > 2*time.Second {
			t.Errorf("ran %v for a max duration of 200ms", d)
		}
	})
	t.Run("an attempt cut short by the stop is not counted", func(t *testing.T) {
		silentTCP, _ := silent(t)
		stop := make(chan struct{})
		time.AfterFunc(100*time.Millisecond, func() { close(stop) })
		start := time.Now()
		r := Loop(context.Background(), silentTCP, 0, time.Hour, time.Minute, stop)
		if r.Attempts != 0 || r.Failures != 0 {
			t.Errorf("attempts %d failures %d, want 0 and 0", r.Attempts, r.Failures)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("took %v to stop", d)
		}
	})
}

func TestRun(t *testing.T) {
	tcp, _ := startServer(t, "pod-a")
	refused := closedPort(t, "tcp")
	tests := []struct {
		name      string
		args      []string
		stdin     string
		wantUsage bool
		want      string // in the output
	}{
		{"no subcommand", nil, "", true, ""},
		{"unknown subcommand", []string{"bogus"}, "", true, ""},
		{"probe without an address", []string{"probe"}, "", true, ""},
		{"probe of an unknown protocol", []string{"probe", "--proto", "sctp", tcp}, "", true, ""},
		{"serve without ports", []string{"serve"}, "", true, ""},
		{"serve with a bad port", []string{"serve", "--tcp", "80,x"}, "", true, ""},
		{"probe that succeeds", []string{"probe", "--count", "3", tcp}, "", false, `"ok": 3`},
		{"probe that fails exits 0 all the same", []string{"probe", refused}, "", false, `"error": "refused"`},
		{"loop ends with stdin", []string{"loop", "--interval", "10ms", tcp}, "", false, `"stopped": "stdin"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(tt.args, strings.NewReader(tt.stdin), &out)
			if tt.wantUsage {
				if !errors.Is(err, errUsage) {
					t.Fatalf("error %v, want bad usage", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tt.want) {
				t.Errorf("output lacks %s:\n%s", tt.want, out.String())
			}
			var v map[string]any
			if err := json.Unmarshal(out.Bytes(), &v); err != nil {
				t.Errorf("output is not one JSON object: %v", err)
			}
		})
	}
}

// process is the program run as a child process.
type process struct {
	cmd  *exec.Cmd
	done chan error // receives Wait's result
}

// start runs the program as a child process with args; it is killed at the
// end of the test if still running.
func start(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// The race detector otherwise sleeps a second before the exit.
	cmd.Env = append(append(os.Environ(), "TESTSERVER_RUN_MAIN=1", "GORACE=atexit_sleep_ms=0"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%v stderr:\n%s", args, stderr.String())
		}
		p.done <- nil
	})
	return p
}

// terminate sends SIGTERM to p and checks that it exits 0 within a second.
func terminate(t *testing.T, p *process) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want 0", err)
		}
	case <-time.After(time.Second):
		t.Error("still running a second after SIGTERM")
	}
}

func TestServeProcess(t *testing.T) {
	port := closedPort(t, "tcp")
	_, p, _ := net.SplitHostPort(port)
	cmd := start(t, []string{"POD_NAME=pod-z"}, "serve", "--tcp", p, "--udp", p)
	addr := net.JoinHostPort("127.0.0.1", p)
	var r ProbeReport
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r = Probe(context.Background(), "udp", addr, 1, 100*time.Millisecond); r.OK == 1 {
			break
		}
	}
	if r.OK != 1 || r.Attempts[0].Server != "pod-z" {
		t.Fatalf("udp probe of the server: %+v", r)
	}
	if r = Probe(context.Background(), "tcp", addr, 1, time.Second); r.OK != 1 || r.Attempts[0].Server != "pod-z" {
		t.Fatalf("tcp probe of the server: %+v", r)
	}
	terminate(t, cmd)
}

func TestPauseProcess(t *testing.T) {
	cmd := start(t, nil, "pause")
	// Past the start, where the signal handlers are set.
	time.Sleep(200 * time.Millisecond)
	terminate(t, cmd)
}

func TestReap(t *testing.T) {
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	// The child exits at once and stays a zombie until reaped.
	zombie := func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return len(f) > 0 && f[0] == "Z"
	}
	for i := 0; !zombie(); i++ {
		if i == 500 {
			t.Fatal("the child never became a zombie")
		}
		time.Sleep(10 * time.Millisecond)
	}
	reap()
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !os.IsNotExist(err) {
		t.Errorf("child %d still exists after reap: %v", pid, err)
	}
}

// TestProbeTimeoutCountsRunningTime checks that an attempt's time is the
// time its client ran: a client stopped for longer than its timeout (1 s)
// still gets an answer that comes 3 s after the connection, and the same
// client, not stopped, times out.
func TestProbeTimeoutCountsRunningTime(t *testing.T) {
	addr := answering(t, 3*time.Second, "pod-slow 127.0.0.1:1\n")
	probe := func(stop time.Duration) Attempt {
		t.Helper()
		cmd := exec.Command(os.Args[0], "probe", "--timeout", "1s", addr)
		cmd.Env = append(os.Environ(), "TESTSERVER_RUN_MAIN=1", "GORACE=atexit_sleep_ms=0")
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if stop > 0 {
			// Past the start, into the attempt, then not run for stop.
			time.Sleep(200 * time.Millisecond)
			_ = cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(stop)
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("probe: %v", err)
		}
		var r ProbeReport
		if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Attempts) != 1 {
			t.Fatalf("probe report %q: %v", out.String(), err)
		}
		return r.Attempts[0]
	}
	if a := probe(0); a.Error != KindTimeout || a.StalledMS != 0 {
		t.Errorf("running client: %+v, want a timeout and no stall", a)
	}
	if a := probe(2500 * time.Millisecond); a.Error != "" || a.Server != "pod-slow" || a.StalledMS < 2000 {
		t.Errorf("client stopped for 2.5 s: %+v, want pod-slow's answer and a stall of at least 2 s", a)
	}
}
