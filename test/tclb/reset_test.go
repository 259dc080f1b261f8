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
