package tclb_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

const httpPort = 8081

// TestSNATPortReusedAfterClose: with one source NAT port on node-a, two
// external clients take turns connecting through a NodePort to pod-b on
// node-b. Each connection needs the port the previous one closed: the
// client closing first (the TCP probe) leaves no socket behind on pod-b;
// the HTTP server closing first (Connection: close) leaves pod-b's socket
// in TIME_WAIT on the very tuple the next connection uses, which pod-b may
// answer with an ACK of the old connection that node-a must not pass to the
// new client (see ct_reply_late).
func TestSNATPortReusedAfterClose(t *testing.T) {
	e := newTopology(t)
	e.snatMin, e.snatMax = 61000, 61000
	for _, n := range e.nodes {
		e.attach(n, loader.TCAttachAuto, false)
	}
	if _, err := e.pods["pod-b"].StartHTTPServer(httpPort); err != nil {
		t.Fatal(err)
	}
	e.sync(
		service{name: "to-pod-b", clusterIP: "10.96.0.11", proto: model.TCP, port: 80, nodePort: 30011, endpoints: []string{"pod-b"}},
		service{name: "http-pod-b", clusterIP: "10.96.0.20", proto: model.TCP, port: 80, nodePort: 30020, target: httpPort, endpoints: []string{"pod-b"}},
	)
	a := e.nodes[0]
	const turns = 3
	for _, tc := range []struct {
		name  string
		to    netip.AddrPort
		probe func(c *sandbox.Client, to netip.AddrPort) (served string, seen netip.Addr, errno string)
	}{
		{"the client closes first", netip.AddrPortFrom(a.IP, 30011), func(c *sandbox.Client, to netip.AddrPort) (string, netip.Addr, string) {
			rep, err := c.TCP(e.ctx(), to, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Results[0]
			return r.Server, r.ClientSeen.Addr(), r.Err
		}},
		{"the server closes first", netip.AddrPortFrom(a.IP, 30020), func(c *sandbox.Client, to netip.AddrPort) (string, netip.Addr, string) {
			rep, err := c.HTTP(e.ctx(), to, "/", 1)
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Results[0]
			return r.Server, r.ClientSeen.Addr(), r.Err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reusedBefore := e.counter(a, bpfobj.TcLbMetricLB_M_TC_SNAT_REUSED)
			noPortBefore := e.counter(a, bpfobj.TcLbMetricLB_M_TC_SNAT_NO_PORT)
			for i := range 2 * turns {
				c := e.client
				if i%2 == 1 {
					c = e.other
				}
				served, seen, errno := tc.probe(c, tc.to)
				if errno != "" || served != "pod-b" || seen != a.IP {
					t.Errorf("connection %d from %s: served by %q, who saw %s, error %q; want pod-b seeing %s", i, c.IP, served, seen, errno, a.IP)
				}
			}
			if d := e.counter(a, bpfobj.TcLbMetricLB_M_TC_SNAT_REUSED) - reusedBefore; d < 2*turns-1 {
				t.Errorf("node-a reused a closed flow's port %d times, want at least %d", d, 2*turns-1)
			}
			if d := e.counter(a, bpfobj.TcLbMetricLB_M_TC_SNAT_NO_PORT) - noPortBefore; d != 0 {
				t.Errorf("node-a found no free port %d times", d)
			}
			t.Logf("node-a handed %d late packets of closed connections to its stack", e.counter(a, bpfobj.TcLbMetricLB_M_TC_SNAT_LATE))
		})
	}
}
