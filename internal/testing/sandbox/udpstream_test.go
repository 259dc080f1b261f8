package sandbox_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func TestUDPStreamMovesToTheNextAddressAfterASocketError(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	addrs := []netip.AddrPort{ap(podAIP, 8080), ap(podBIP, 8080)}
	st, err := c.client.StartUDPStream(t.Context(), addrs, sandbox.UDPStreamOptions{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Stop() })
	checkProcess(t, c.sb, c.client, st.Process)
	first := st.First
	if first.Err != "" || first.Server != "pod-a" || first.Peer != addrs[0] || first.Local.Addr() != clientIP || first.Cookie == 0 {
		t.Fatalf("first query %+v, want pod-a's answer on a socket connected to it", first)
	}
	// The same socket while it works.
	for range 3 {
		q := must(st.Next(t.Context()))(t)
		if q.Err != "" || q.Server != "pod-a" || q.Cookie != first.Cookie || len(q.Retries) != 0 {
			t.Fatalf("query %+v, want pod-a on the first socket", q)
		}
	}
	// pod-a's port closes: its ICMP port unreachable fails the connected
	// socket's receive with ECONNREFUSED, and the client moves on.
	if err := c.podAServers["udp"].Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var moved sandbox.UDPQuery
	for moved.Server != "pod-b" {
		moved = must(st.Next(ctx))(t)
		if moved.Err != "" {
			t.Fatalf("query %+v failed: the retry on a new socket should have been answered", moved)
		}
	}
	if !slices.Equal(moved.Retries, []string{"ECONNREFUSED"}) || moved.Cookie == first.Cookie || moved.Peer != addrs[1] {
		t.Errorf("query %+v, want it retried after ECONNREFUSED on a new socket connected to pod-b", moved)
	}
	// Queries left unread when Stop is called are dropped: give the
	// stream time to queue some first.
	time.Sleep(5 * 20 * time.Millisecond)
	res, err := st.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if res.Sockets != 2 || res.Failures != 0 || res.Errors["ECONNREFUSED"] != 1 || res.Servers["pod-a"] < 4 || res.Servers["pod-b"] < 1 {
		t.Errorf("stream result %+v, want 2 sockets, one ECONNREFUSED, answers from both pods and no failure", res)
	}
	if _, err := st.Next(t.Context()); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Errorf("Next after Stop: %v, want the stream to have ended", err)
	}
	if _, err := st.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestBadUDPStreamsAreRejected(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	many := make([]netip.AddrPort, 17)
	for i := range many {
		many[i] = ap(podAIP, 8080)
	}
	tests := []struct {
		name    string
		addrs   []netip.AddrPort
		wantErr string
	}{
		{"no address", nil, "0 addresses"},
		{"too many addresses", many, "17 addresses"},
		{"no port", []netip.AddrPort{ap(podAIP, 8080), ap(podBIP, 0)}, "not ip:port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := c.client.StartUDPStream(t.Context(), tt.addrs, sandbox.UDPStreamOptions{})
			if err == nil {
				st.Stop()
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("StartUDPStream: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
