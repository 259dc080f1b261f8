package tclb_test

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
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
				// The client's close() returns before the last
				// segment of the close has crossed node-a; a
				// SYN overtaking it finds the port still taken,
				// as conntrack would (the port is free in
				// TIME_WAIT and CLOSE only).
				e.waitSNATPortClosed(a, e.snatMin)
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

// ctClosed is CT_F_CLOSED of bpf/lib/structs.h: the flow is closed and its
// source NAT port free.
const ctClosed = 1 << 5

// waitSNATPortClosed waits until every flow that node n tracks on its
// source NAT port is closed (or gone), and fails the test after 10 s.
func (e *env) waitSNATPortClosed(n *node, port uint16) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := e.openFlowsOnPort(n, port)
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s still tracks %d open flows on source NAT port %d after 10 s", n.Name, open, port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openFlowsOnPort counts node n's reply entries on source NAT port port
// that are not closed.
func (e *env) openFlowsOnPort(n *node, port uint16) int {
	e.t.Helper()
	var (
		key   bpfobj.TcCt4Key
		val   bpfobj.TcCt4Entry
		count int
	)
	// The key holds the port in network order.
	var be [2]byte
	binary.BigEndian.PutUint16(be[:], port)
	want := binary.NativeEndian.Uint16(be[:])
	it := n.tc.Objects.Tc4CtV1.Iterate()
	for it.Next(&key, &val) {
		if key.Dir == 1 /* CT_DIR_REPLY */ && key.Dport == want && val.Flags&ctClosed == 0 {
			count++
		}
	}
	if err := it.Err(); err != nil {
		e.t.Fatal(err)
	}
	return count
}
