package iptables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/golden"
)

// freshHooks adds the hooks as EnsureHooks does on a node that has none.
func freshHooks(tx *xtables.Transaction) error {
	hs := hooks()
	for i := len(hs) - 1; i >= 0; i-- {
		tx.Table(hs[i].Table).Insert(hs[i].Chain, hs[i].Spec)
	}
	return nil
}

func TestRestoreInputMatchesGoldenFiles(t *testing.T) {
	for _, sc := range example.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			cfg := Config{Netfilter: xtables.Netfilter{IPv6: sc.IPv6, ClusterCIDR: sc.ClusterCIDR, MasqueradeAll: sc.MasqueradeAll, MasqueradeBit: sc.MasqueradeBit}}
			src, ex := example.NodeASource(t, sc.IPv6)
			up := src.Update()
			if err := cfg.setDefaults(); err != nil {
				t.Fatal(err)
			}
			p := newPlanner(&cfg)
			p.r.nodeIPs = up.State.Node.Addrs
			// Upstream serves localhost NodePorts for IPv4 only: ::1 in
			// --nodeport-addresses serves none, as upstream's IPv6
			// proxier; IPv4 prefixes are ignored by the IPv6 dataplane.
			// The node's local addresses hold its loopback one, as a
			// node's do.
			spec, err := model.ParseNodePortSpec(sc.NodePorts, cfg.IPv6, !sc.NoLocalhostNodePorts)
			if err != nil {
				t.Fatal(err)
			}
			local := append([]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}, up.State.Node.Addrs...)
			p.r.nodePorts = spec.Resolve(&up.State.Node, local)
			pl, err := p.full(up.State, freshHooks)
			if err != nil {
				t.Fatal(err)
			}
			golden.Check(t, sc.Name+"-full", string(pl.tx.Bytes()))
			p.commit(pl)
			if !sc.Partial {
				return
			}
			example.Churn(src, ex)
			pl = p.partial(src.Update())
			golden.Check(t, sc.Name+"-partial", string(pl.tx.Bytes()))
		})
	}
}

// syncedPlanner returns a planner of the IPv4 dataplane with the example's
// cluster CIDR that has made and committed the full sync of node-a's
// example cluster, the Source (for changes) and the pairs it holds, and the
// state that was synced.
func syncedPlanner(t *testing.T) (*planner, *example.Source, []example.Pair, *model.State) {
	t.Helper()
	src, ex := example.NodeASource(t, false)
	cfg := Config{Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR}}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	p := newPlanner(&cfg)
	state := src.Update().State
	pl, err := p.full(state, freshHooks)
	if err != nil {
		t.Fatal(err)
	}
	p.commit(pl)
	return p, src, ex, state
}

// A partial sync followed by a full one must leave the same chains and
// rules as the full one alone: the planner's memory of what it applied must
// match what it wrote.
func TestPartialSyncsKeepTheAppliedStateOfAFullSync(t *testing.T) {
	p, src, ex, _ := syncedPlanner(t)

	src.SetSlice(builders.SliceFor(ex[0].Service, example.EndpointsOn(example.PodB1)...))
	src.DeleteService(ex[4].Service)
	src.SetSlice(builders.SliceFor(ex[6].Service, example.EndpointsOn(example.PodA1)...))
	up := src.Update()
	p.commit(p.partial(up))

	fresh := newPlanner(p.r.cfg)
	want, err := fresh.full(up.State, freshHooks)
	if err != nil {
		t.Fatal(err)
	}
	fresh.commit(want)
	if !sameKeys(p.kernel["nat"], fresh.kernel["nat"]) {
		t.Errorf("after the partial sync the planner knows nat chains %v, a full sync writes %v", keys(p.kernel["nat"]), keys(fresh.kernel["nat"]))
	}
	for _, table := range xtables.Tables {
		if p.total[table] != fresh.total[table] {
			t.Errorf("%s: %d rules counted after the partial sync, %d after a full one", table, p.total[table], fresh.total[table])
		}
	}
	for name, a := range fresh.services {
		b := p.services[name]
		if b == nil {
			t.Errorf("%s missing after the partial sync", name)
			continue
		}
		if strings.Join(a.chains, ",") != strings.Join(b.chains, ",") || fmt.Sprint(a.shared) != fmt.Sprint(b.shared) {
			t.Errorf("%s: partial sync remembers %v %v, full sync %v %v", name, b.chains, b.shared, a.chains, a.shared)
		}
	}
	if _, ok := p.services[model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: "sticky"}, Port: "http", Protocol: model.TCP}]; ok {
		t.Errorf("deleted Service sticky is still remembered")
	}
}

func sameKeys(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A full sync reconciles: unchanged Services are not written again, a
// change the partial syncs missed is written as a partial sync would.
func TestReconcileWritesOnlyWhatDiffers(t *testing.T) {
	p, src, ex, state := syncedPlanner(t)
	if pl := p.reconcile(state); !pl.tx.Empty() {
		t.Errorf("reconciling an unchanged state writes:\n%s", pl.tx.Bytes())
	}

	src.SetSlice(builders.SliceFor(ex[0].Service, example.EndpointsOn(example.PodB1)...))
	src.DeleteService(ex[8].Service)
	up := src.Update()
	want := p.partial(up).tx.Bytes()
	got := p.reconcile(up.State)
	// The same lines; the order of Services may differ.
	if d := golden.LineDiff(string(want), string(got.tx.Bytes())); d != "" {
		t.Errorf("reconcile and a partial sync of the same change differ:\n%s", d)
	}
	p.commit(got)
	if pl := p.reconcile(up.State); !pl.tx.Empty() {
		t.Errorf("reconciling again writes:\n%s", pl.tx.Bytes())
	}
}

// Each dataplane serves one family: a cluster CIDR or local traffic CIDR
// of the other one is a configuration error, not rules that never match.
func TestConfigRefusesACIDROfTheOtherFamily(t *testing.T) {
	for name, cfg := range map[string]Config{
		"IPv6 cluster CIDR for IPv4":       {Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR6}},
		"IPv4 cluster CIDR for IPv6":       {Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: example.ClusterCIDR}},
		"IPv4 local traffic CIDR for IPv6": {Netfilter: xtables.Netfilter{IPv6: true, LocalDetector: xtables.LocalDetector{CIDR: example.ClusterCIDR}}},
	} {
		if err := cfg.setDefaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for name, cfg := range map[string]Config{
		"IPv4": {Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR}},
		"IPv6": {Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: example.ClusterCIDR6}},
	} {
		if err := cfg.setDefaults(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
