package tclb_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// TestRemovedBackendResetsExternalClients: an external client holding a
// TCP connection through a NodePort keeps it while its endpoint is
// terminating (a request is answered), and once the endpoint is removed
// its next write is answered with a reset (ECONNRESET) instead of hanging;
// a new connection reaches the live endpoint. For a backend on the node
// (delivered as is) and one on the other node (source NAT).
func TestRemovedBackendResetsExternalClients(t *testing.T) {
	e := newEnv(t, loader.TCAttachAuto)
	a := e.nodes[0]
	for _, tc := range []struct {
		name          string
		nodePort      uint16
		victim, other string
	}{
		{"backend on the node", 30020, "pod-a", "pod-b"},
		{"backend on the other node, source NAT", 30021, "pod-b", "pod-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service{name: "roll", clusterIP: "10.96.0.20", proto: model.TCP, port: 80, nodePort: tc.nodePort, endpoints: []string{tc.victim}}
			e.sync(svc)
			to := netip.AddrPortFrom(a.IP, tc.nodePort)
			// A ping that hangs fails after this, rather than
			// holding the test.
			h, err := e.client.WithTimeout(5*time.Second).Hold(e.ctx(), to)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			if h.First.Err != "" || h.First.Server != tc.victim {
				t.Fatalf("holding a connection: got %+v, want one to %s", h.First, tc.victim)
			}

			svc.endpoints, svc.terminating = []string{tc.other}, []string{tc.victim}
			e.sync(svc)
			if err := h.Ping(); err != nil {
				t.Fatalf("while its endpoint is terminating the connection broke: %v", err)
			}
			e.expectServer(to, tc.other)

			before := e.counter(a, bpfobj.TcLbMetricLB_M_TC_RESET)
			svc.terminating = nil
			e.sync(svc)
			err = h.Ping()
			if err == nil || !strings.Contains(err.Error(), "ECONNRESET") {
				t.Errorf("after its endpoint was removed the connection gave %v, want ECONNRESET", err)
			}
			if d := e.counter(a, bpfobj.TcLbMetricLB_M_TC_RESET) - before; d != 1 {
				t.Errorf("node-a counted %d resets, want 1", d)
			}
			e.expectServer(to, tc.other)
		})
	}
}

// TestRemovedBackendResetsThroughXDP: with the XDP program on node-a's
// uplink, in native and generic mode, an external client's connection
// through a NodePort to node-b's pod is carried by XDP while the endpoint
// is terminating; once it is removed XDP hands the client's next segment to
// TC, whose reset gives the client ECONNRESET (nothing reaches the dead
// pod), and a new connection reaches the live endpoint.
func TestRemovedBackendResetsThroughXDP(t *testing.T) {
	for _, mode := range []string{loader.XDPNative, loader.XDPGeneric} {
		t.Run(mode, func(t *testing.T) {
			e := newXDPEnv(t, mode)
			a := e.nodes[0]
			svc := service{name: "roll", clusterIP: "10.96.0.20", proto: model.TCP, port: 80, nodePort: 30021, endpoints: []string{"pod-b"}}
			e.sync(svc)
			to := netip.AddrPortFrom(a.IP, 30021)
			// The first packet towards node-b, without a neighbour
			// entry yet, is TC's: this resolves it, so that the held
			// connection is XDP's from its first segment on.
			e.expectServer(to, "pod-b")
			h, err := e.client.WithTimeout(5*time.Second).Hold(e.ctx(), to)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			if h.First.Err != "" || h.First.Server != "pod-b" {
				t.Fatalf("holding a connection: got %+v, want one to pod-b", h.First)
			}

			svc.endpoints, svc.terminating = []string{"pod-a"}, []string{"pod-b"}
			e.sync(svc)
			fwd := e.counter(a, bpfobj.TcLbMetricLB_M_XDP_FWD)
			if err := h.Ping(); err != nil {
				t.Fatalf("while its endpoint is terminating the connection broke: %v", err)
			}
			if e.counter(a, bpfobj.TcLbMetricLB_M_XDP_FWD) == fwd {
				t.Error("the terminating endpoint's connection did not go through XDP")
			}
			e.expectServer(to, "pod-a")

			reset := e.counter(a, bpfobj.TcLbMetricLB_M_TC_RESET)
			toTC := e.counter(a, bpfobj.TcLbMetricLB_M_XDP_TO_TC)
			svc.terminating = nil
			e.sync(svc)
			err = h.Ping()
			if err == nil || !strings.Contains(err.Error(), "ECONNRESET") {
				t.Errorf("after its endpoint was removed the connection gave %v, want ECONNRESET", err)
			}
			if d := e.counter(a, bpfobj.TcLbMetricLB_M_TC_RESET) - reset; d != 1 {
				t.Errorf("node-a's TC counted %d resets, want 1", d)
			}
			if e.counter(a, bpfobj.TcLbMetricLB_M_XDP_TO_TC) == toTC {
				t.Error("XDP passed nothing to TC")
			}
			e.expectServer(to, "pod-a")
		})
	}
}

// expectServer checks that new connections to to are served by server.
func (e *env) expectServer(to netip.AddrPort, server string) {
	e.t.Helper()
	rep, err := e.client.TCP(e.ctx(), to, 3)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "" || r.Server != server {
			e.t.Errorf("new connection to %s: got %+v, want one served by %s", to, r, server)
		}
	}
}
