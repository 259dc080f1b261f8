package iptables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nodeaddrs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// TestNodePortsOn127ForTheNodesOwnProcesses: as kube-proxy's iptables mode
// by default (--iptables-localhost-nodeports), a process on the node
// reaches a NodePort on 127.0.0.1; route_localnet is set in the node's
// namespace only, and the connections are counted as
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total. Without
// the setting, the same connections are refused.
func TestNodePortsOn127ForTheNodesOwnProcesses(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			hostBefore, err := sysctl.Default.GetInt(routeLocalnet)
			if err != nil {
				t.Fatal(err)
			}
			e := behaviour.NewEnv(t, factory(backend, false))
			node := e.Nodes[example.NodeA]
			d := e.Dataplanes[example.NodeA].(*Dataplane)
			client := e.Clients[behaviour.ClientNodeA]
			to := netip.MustParseAddrPort("127.0.0.1:30010")
			ctx := behaviour.Context(t)

			// The environment's sync: NodePorts on every address but
			// loopback ones, as with the setting off.
			if rep, err := client.TCP(ctx, to, 3); err != nil {
				t.Fatal(err)
			} else {
				for _, r := range rep.Results {
					if r.Err != "ECONNREFUSED" {
						t.Errorf("127.0.0.1:30010 without localhost NodePorts: %+v, want ECONNREFUSED", r)
					}
				}
			}

			spec, err := model.ParseNodePortSpec(nil, false, true)
			if err != nil {
				t.Fatal(err)
			}
			src := example.NewSourceWithNodePorts(t, example.Node(example.NodeA), spec).Add(e.Example...)
			var local []netip.Addr
			if err := node.NS.Do(func() (err error) {
				local, err = nodeaddrs.Local()
				return err
			}); err != nil {
				t.Fatal(err)
			}
			src.SetLocalAddrs(local)
			up := src.Update()
			up.Full = true
			if !up.State.Node.NodePorts.Localhost {
				t.Fatalf("node-a's NodePort addresses %+v: want localhost NodePorts", up.State.Node.NodePorts)
			}
			if err := d.Sync(up); err != nil {
				t.Fatal(err)
			}

			// The kernel gives the rules back word for word as rendered
			// (iptables-save quotes every comment), which the partial
			// syncs compare against.
			var saved []string
			for _, rules := range readOwned(t, d.runner) {
				saved = append(saved, rules...)
			}
			p := newPlanner(&d.cfg)
			p.r.nodePorts = up.State.Node.NodePorts
			pl, err := p.full(up.State, freshHooks)
			if err != nil {
				t.Fatal(err)
			}
			rendered := 0
			for _, line := range strings.Split(string(pl.tx.Bytes()), "\n") {
				if !strings.HasPrefix(line, "-A ") || !strings.Contains(line, "127.0.0.0/8") {
					continue
				}
				rendered++
				_, spec, _ := strings.Cut(line[3:], " ")
				if !slices.ContainsFunc(saved, func(sv string) bool { return slices.Equal(xtables.Words(sv), xtables.Words(spec)) }) {
					t.Errorf("rendered rule not read back word for word: %s", spec)
				}
			}
			if rendered == 0 {
				t.Error("no rule for 127.0.0.0/8 rendered")
			}

			const n = 5
			rep, err := client.TCP(ctx, to, n)
			if err != nil {
				t.Fatal(err)
			}
			web := map[string]bool{"a1": true, "a2": true, "b1": true}
			for _, r := range rep.Results {
				if r.Err != "" || !web[r.Server] {
					t.Errorf("127.0.0.1:30010 from node-a: %+v, want an answer from an endpoint of default/web", r)
				}
			}
			var nodeValue int
			if err := node.NS.Do(func() (err error) {
				nodeValue, err = sysctl.Default.GetInt(routeLocalnet)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if nodeValue != 1 {
				t.Errorf("route_localnet in node-a's namespace is %d, want 1", nodeValue)
			}
			if v, err := sysctl.Default.GetInt(routeLocalnet); err != nil || v != hostBefore {
				t.Errorf("route_localnet of the test's own namespace is %d (%v), was %d: it must not change", v, err, hostBefore)
			}
			got, err := d.LocalhostAccepted(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got != n {
				t.Errorf("LocalhostAccepted = %d, want %d (one first packet per connection)", got, n)
			}
			c := NewLocalhostCollector(zap.NewNop(), d)
			if v := testutil.ToFloat64(c); v != n {
				t.Errorf("kubeproxy_iptables_localhost_nodeports_accepted_packets_total = %v, want %d", v, n)
			}
			if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP kubeproxy_iptables_localhost_nodeports_accepted_packets_total Packets accepted on NodePorts on 127.0.0.1 (localhost NodePorts; the first packet of each connection).
# TYPE kubeproxy_iptables_localhost_nodeports_accepted_packets_total counter
kubeproxy_iptables_localhost_nodeports_accepted_packets_total 5
`)); err != nil {
				t.Error(err)
			}
			// Traffic to the node's own address is not counted.
			if _, err := client.TCP(ctx, netip.AddrPortFrom(example.NodeAIP, 30010), 2); err != nil {
				t.Fatal(err)
			}
			if got, err := d.LocalhostAccepted(context.Background()); err != nil || got != n {
				t.Errorf("after connections to node-a's own address, LocalhostAccepted = %d (%v), want still %d", got, err, n)
			}
		})
	}
}
