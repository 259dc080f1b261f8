package nftables

import (
	"context"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/golden"
)

// testPlanner returns a planner for cfg and a fake nftables that checks
// what it is given (every chain, set and map a rule or an element names
// must exist, a deleted object must exist).
func testPlanner(t *testing.T, cfg Config) (*planner, *knftables.Fake) {
	t.Helper()
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	return newPlanner(&cfg), knftables.NewFake(cfg.family().nft, TableName)
}

func run(t *testing.T, fake *knftables.Fake, tx *knftables.Transaction) {
	t.Helper()
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("the fake nftables refuses the transaction: %v\n%s", err, tx)
	}
}

func TestTransactionsMatchGoldenFiles(t *testing.T) {
	for _, sc := range example.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			cfg := Config{Netfilter: xtables.Netfilter{IPv6: sc.IPv6, ClusterCIDR: sc.ClusterCIDR, MasqueradeAll: sc.MasqueradeAll, MasqueradeBit: sc.MasqueradeBit}}
			src, ex := example.NodeASource(t, sc.IPv6)
			up := src.Update()
			p, fake := testPlanner(t, cfg)
			p.r.nodeIPs = up.State.Node.Addrs
			// 127.0.0.1 in --nodeport-addresses serves no NodePorts.
			spec, err := model.ParseNodePortSpec(sc.NodePorts, sc.IPv6, false)
			if err != nil {
				t.Fatal(err)
			}
			// The node's interfaces hold its addresses and loopback ones,
			// which never accept NodePorts.
			local := append([]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}, up.State.Node.Addrs...)
			p.r.nodePorts = spec.Resolve(&up.State.Node, local)
			pl := p.full(fake.NewTransaction(), up.State)
			golden.Check(t, sc.Name+"-full", pl.tx.String())
			run(t, fake, pl.tx)
			p.commit(pl)
			if !sc.Partial {
				return
			}
			example.Churn(src, ex)
			up = src.Update()
			pl = p.partial(fake.NewTransaction(), up)
			golden.Check(t, sc.Name+"-partial", pl.tx.String())
			run(t, fake, pl.tx)
			p.commit(pl)

			// The table after the partial sync is the table a full
			// sync of the new state writes on a fresh node.
			fresh, freshFake := testPlanner(t, cfg)
			fresh.r.nodeIPs, fresh.r.nodePorts = p.r.nodeIPs, p.r.nodePorts
			run(t, freshFake, fresh.full(freshFake.NewTransaction(), up.State).tx)
			// The same lines: map elements may come in another order.
			if d := golden.LineDiff(freshFake.Dump(), fake.Dump()); d != "" {
				t.Errorf("after the partial sync the table differs from a full sync's:\n%s", d)
			}
		})
	}
}

// A full sync after partial ones leaves what a full sync alone leaves:
// stale chains and sets are deleted, affinity sets kept.
func TestFullSyncDeletesWhatNothingWants(t *testing.T) {
	ex := example.Example()
	src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
	p, fake := testPlanner(t, Config{Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR}})
	up := src.Update()
	pl := p.full(fake.NewTransaction(), up.State)
	run(t, fake, pl.tx)
	p.commit(pl)

	// A restarted agent knows the kernel's chains, not the Services.
	q, _ := testPlanner(t, Config{Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR}})
	chains, err := fake.List(context.Background(), "chains")
	if err != nil {
		t.Fatal(err)
	}
	sets, err := fake.List(context.Background(), "sets")
	if err != nil {
		t.Fatal(err)
	}
	q.learn(asSet(chains), asSet(sets))
	for _, pair := range ex {
		src.DeleteService(pair.Service)
		if pair.Slice != nil {
			src.DeleteSlice(pair.Slice)
		}
	}
	up = src.Update()
	run(t, fake, q.full(fake.NewTransaction(), up.State).tx)
	fresh, freshFake := testPlanner(t, Config{Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR}})
	run(t, freshFake, fresh.full(freshFake.NewTransaction(), up.State).tx)
	if d := golden.LineDiff(freshFake.Dump(), fake.Dump()); d != "" {
		t.Errorf("a full sync over an earlier table leaves:\n%s", d)
	}
	if strings.Contains(fake.Dump(), " affinity-") || strings.Contains(fake.Dump(), " endpoint-") {
		t.Errorf("per-Service objects left:\n%s", fake.Dump())
	}
}

// Each dataplane serves one family: a cluster CIDR or local traffic CIDR
// of the other one is a configuration error, not rules that never match.
func TestConfigRefusesACIDROfTheOtherFamily(t *testing.T) {
	for name, cfg := range map[string]Config{
		"IPv6 cluster CIDR for IPv4": {Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR6}},
		"IPv4 cluster CIDR for IPv6": {Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: example.ClusterCIDR}},
		"masquerade bit 32":          {Netfilter: xtables.Netfilter{MasqueradeBit: 32}},
	} {
		if err := cfg.setDefaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func asSet(names []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}
