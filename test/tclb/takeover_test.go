package tclb_test

import (
	"context"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestConnectionsKubeProxyOpenedSurviveTheTakeover: on a node where
// kube-proxy's rules translated connections through NodePorts (here the
// iptables mode's, which match upstream's), the agent's programs attach
// with those connections open, as at a node's migration. Every segment
// they carry afterwards is of no flow the programs track; the programs
// hand it to the kernel, whose conntrack entry goes on translating it, to
// a pod on the node and, source-NATed, to one on the other node, with TC
// alone and with XDP in front of it. They still answer once kube-proxy's
// rules are removed, while new connections are the programs'.
func TestConnectionsKubeProxyOpenedSurviveTheTakeover(t *testing.T) {
	for _, mode := range []string{"tc", loader.XDPGeneric} {
		t.Run(mode, func(t *testing.T) {
			e := newTopology(t)
			a, b := e.nodes[0], e.nodes[1]
			svcs := []service{
				{name: "local", clusterIP: "10.96.0.30", proto: model.TCP, port: 80, nodePort: 30030, endpoints: []string{"pod-a"}},
				{name: "remote", clusterIP: "10.96.0.31", proto: model.TCP, port: 80, nodePort: 30031, endpoints: []string{"pod-b"}},
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ipt, err := iptables.New(ctx, iptables.Config{Netfilter: xtables.Netfilter{Netns: a.NS.Path(), ClusterCIDR: sandbox.PodCIDR}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := iptables.Cleanup(context.Background(), a.NS.Path()); err != nil {
					t.Errorf("remove the iptables rules: %v", err)
				}
			})
			if err := ipt.Sync(model.Update{State: e.state(a, false, svcs...), Full: true}); err != nil {
				t.Fatal(err)
			}

			type held struct {
				svc  service
				conn *sandbox.Held
			}
			var conns []held
			for _, s := range svcs {
				// A ping that hangs fails after this, rather than
				// holding the test.
				h, err := e.client.WithTimeout(5*time.Second).Hold(ctx, netip.AddrPortFrom(a.IP, s.nodePort))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { h.Close() })
				if h.First.Err != "" || h.First.Server != s.endpoints[0] {
					t.Fatalf("%s: holding a connection through kube-proxy's rules: got %+v, want one to %s", s.name, h.First, s.endpoints[0])
				}
				conns = append(conns, held{s, h})
			}
			ping := func(when string) {
				t.Helper()
				for _, c := range conns {
					if err := c.conn.Ping(); err != nil {
						t.Errorf("%s, %s's connection opened through kube-proxy's rules broke: %v", when, c.svc.name, err)
					}
				}
			}

			e.attach(b, loader.TCAttachAuto, false)
			e.attach(a, loader.TCAttachAuto, false)
			if mode != "tc" {
				e.attachXDP(a, mode)
			}
			e.sync(svcs...)
			ping("after the programs attached beside kube-proxy's rules")
			if n := e.counter(a, bpfobj.TcLbMetricLB_M_TC_NF_TRACKED); n < uint64(len(conns)) {
				t.Errorf("node-a's TC handed %d segments to the kernel's conntrack, want at least %d", n, len(conns))
			}

			local, snat := e.counter(a, bpfobj.TcLbMetricLB_M_TC_NEW_LOCAL), e.counter(a, bpfobj.TcLbMetricLB_M_TC_NEW_SNAT)+e.counter(a, bpfobj.TcLbMetricLB_M_XDP_NEW_SNAT)
			for _, s := range svcs {
				e.expectServer(netip.AddrPortFrom(a.IP, s.nodePort), s.endpoints[0])
			}
			if e.counter(a, bpfobj.TcLbMetricLB_M_TC_NEW_LOCAL) == local {
				t.Error("new connections to the pod on the node were not the programs'")
			}
			if e.counter(a, bpfobj.TcLbMetricLB_M_TC_NEW_SNAT)+e.counter(a, bpfobj.TcLbMetricLB_M_XDP_NEW_SNAT) == snat {
				t.Error("new connections to the pod on the other node were not the programs'")
			}

			// kube-proxy gone, the agent keeps connection tracking
			// running for its connections and removes its rules.
			keepCtx, stopKeep := context.WithCancel(ctx)
			defer stopKeep()
			n, err := nfconntrack.Keep(keepCtx, nfconntrack.KeepConfig{Netns: a.NS.Path(), Interval: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if n != len(conns) {
				t.Errorf("connection tracking kept running for %d translated connections, want %d", n, len(conns))
			}
			if err := iptables.Cleanup(ctx, a.NS.Path()); err != nil {
				t.Fatal(err)
			}
			ping("once kube-proxy's rules were removed")

			// Once they are closed, connection tracking is no longer
			// kept running.
			for _, c := range conns {
				if err := c.conn.Close(); err != nil {
					t.Error(err)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for keepTablePresent(t, a) {
				if time.Now().After(deadline) {
					t.Fatalf("table %s still there 10 s after the connections closed", nfconntrack.KeepTable)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// keepTablePresent says whether node n holds nfconntrack.KeepTable.
func keepTablePresent(t *testing.T, n *node) bool {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.NS.Path()), "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return strings.Contains(string(out), "inet "+nfconntrack.KeepTable)
}
