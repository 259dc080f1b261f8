package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProbeRequestsAreChecked(t *testing.T) {
	self, err := selfProcess()
	if err != nil {
		t.Fatal(err)
	}
	good := probeRequest{Kind: kindTCP, Addr: netip.MustParseAddrPort("10.244.1.10:80"), Count: 1,
		Timeout: time.Second, Netns: self.Netns, Cgroup: self.Cgroup}
	tests := []struct {
		name    string
		edit    func(*probeRequest)
		wantErr string
	}{
		{"a probe outside its client netns refuses to send", func(r *probeRequest) { r.Netns++ }, "refusing to probe"},
		{"a probe outside the sandbox cgroup refuses to send", func(r *probeRequest) { r.Cgroup = "/ebpt-000000" }, "refusing to probe"},
		{"zero attempts", func(r *probeRequest) { r.Count = 0 }, "count 0"},
		{"too many attempts", func(r *probeRequest) { r.Count = maxCount + 1 }, "not in [1, 1000]"},
		{"no port", func(r *probeRequest) { r.Addr = netip.AddrPortFrom(r.Addr.Addr(), 0) }, "not ip:port"},
		{"no timeout", func(r *probeRequest) { r.Timeout = 0 }, "timeout 0s"},
		{"unbounded loop", func(r *probeRequest) { r.Kind = kindLoop }, "loop duration 0s"},
		{"unbounded hold", func(r *probeRequest) { r.Kind = kindHold }, "hold duration 0s"},
		{"too many connects", func(r *probeRequest) { r.Kind, r.Count = kindConnects, maxAttempts+1 }, "not in [1, 1000000]"},
		{"unknown kind", func(r *probeRequest) { r.Kind = "dccp" }, `unknown probe kind "dccp"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := good
			tt.edit(&req)
			body, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			code := runProbe(string(body), strings.NewReader(""), &out)
			var msg probeMessage
			if err := json.Unmarshal(out.Bytes(), &msg); err != nil {
				t.Fatalf("probe output %q: %v", out.String(), err)
			}
			if code == 0 || !strings.Contains(msg.Error, tt.wantErr) || msg.Result != nil {
				t.Errorf("exit code %d, message %+v; want a failure containing %q and no result", code, msg, tt.wantErr)
			}
		})
	}
}

func TestServerRepliesAreParsed(t *testing.T) {
	tests := []struct {
		name, line, server, client, wantErr string
	}{
		{"ipv4 client", "pod-a 10.244.1.100:4242\n", "pod-a", "10.244.1.100:4242", ""},
		{"ipv4-mapped client is unmapped", "pod-a [::ffff:10.244.1.100]:4242\n", "pod-a", "10.244.1.100:4242", ""},
		{"ipv6 client", "pod-b [fd00::1]:80\n", "pod-b", "[fd00::1]:80", ""},
		{"no address", "pod-a\n", "", "", "malformed server reply"},
		{"garbage address", "pod-a nowhere\n", "", "", "malformed server reply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server, client, err := parseReply(tt.line)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("got error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || server != tt.server || client.String() != tt.client {
				t.Errorf("got %q %s (%v), want %q %s", server, client, err, tt.server, tt.client)
			}
		})
	}
}

func TestErrorsAreNamedLikeErrno(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"refused connect", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, "ECONNREFUSED"},
		{"denied by a BPF hook", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.EPERM)}, "EPERM"},
		{"own deadline", &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, "ETIMEDOUT"},
		{"dial timeout", fmt.Errorf("dial: %w", context.DeadlineExceeded), "ETIMEDOUT"},
		{"server closed first", fmt.Errorf("read: %w", io.EOF), "EOF"},
		{"anything else keeps its text", errors.New("tls: bad record"), "tls: bad record"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errName(tt.err); got != tt.want {
				t.Errorf("errName(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

func TestPingsMatchTheirEcho(t *testing.T) {
	// The server's side of the connection: what it does with "ping 2\n".
	echo := func(conn net.Conn, line string) { _, _ = io.WriteString(conn, line) }
	tests := []struct {
		name   string
		server func(conn net.Conn, line string)
		want   string
		// size is the ping's line size; 0 is a short one.
		size int
	}{
		{"the echo comes back", echo, "", 0},
		{"a line longer than the reader's buffer comes back whole", echo, "", 10000},
		{"the late padded echo of an earlier ping is skipped", func(conn net.Conn, line string) {
			echo(conn, "ping 1 "+strings.Repeat("x", 5000)+"\n"+line)
		}, "", 6000},
		{"a cut echo is an error", func(conn net.Conn, line string) { echo(conn, line[:100]+"\n") }, "unexpected echo", 6000},
		{"the late echo of a ping that timed out is skipped", func(conn net.Conn, line string) {
			echo(conn, "ping 1\n"+line)
		}, "", 0},
		{"a different line is an error", func(conn net.Conn, _ string) { echo(conn, "pong 2\n") }, `unexpected echo "pong 2\n"`, 0},
		{"an echo from the future is an error", func(conn net.Conn, _ string) { echo(conn, "ping 3\n") }, `unexpected echo "ping 3\n"`, 0},
		{"a server that closes gives EOF", func(conn net.Conn, _ string) { conn.Close() }, "EOF", 0},
		{"a server that does not answer gives ETIMEDOUT", func(net.Conn, string) {}, "ETIMEDOUT", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			t.Cleanup(func() { client.Close(); server.Close() })
			done := make(chan struct{})
			go func() {
				defer close(done)
				line, err := bufio.NewReader(server).ReadString('\n')
				if err != nil {
					return
				}
				tt.server(server, line)
			}()
			got := ping(client, bufio.NewReader(client), 2, tt.size, 200*time.Millisecond)
			client.Close()
			<-done
			if !strings.Contains(got, tt.want) || (tt.want == "") != (got == "") {
				t.Errorf("ping = %q, want %q", got, tt.want)
			}
		})
	}
	if got := ping(nil, nil, 1, 0, time.Second); got != "ENOTCONN" {
		t.Errorf("ping without a connection = %q, want ENOTCONN", got)
	}
}
