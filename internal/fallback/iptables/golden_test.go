package iptables

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// freshHooks adds the hooks as EnsureHooks does on a node that has none.
func freshHooks(tx *xtables.Transaction) error {
	hs := hooks()
	for i := len(hs) - 1; i >= 0; i-- {
		tx.Table(hs[i].Table).Insert(hs[i].Chain, hs[i].Spec)
	}
	return nil
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test -update to create it): %v", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it after review):\n%s", name, path, lineDiff(string(want), string(got)))
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	onlyW, onlyG := diff(w, g)
	var b strings.Builder
	for _, l := range onlyW {
		b.WriteString("- " + l + "\n")
	}
	for _, l := range onlyG {
		b.WriteString("+ " + l + "\n")
	}
	return b.String()
}

func TestRestoreInputMatchesGoldenFiles(t *testing.T) {
	tests := []struct {
		name string
		// cfg.IPv6 renders the IPv6 example (example.Example6 on
		// example.Node6) instead of the IPv4 one.
		cfg Config
		// nodePorts is --nodeport-addresses; unset is every address.
		nodePorts []string
		// change, if set, alters the example after the full sync; the
		// partial sync's input is checked against "<name>-partial".
		change func(src *example.Source, ex []example.Pair)
	}{
		{
			name: "node-a",
			cfg:  Config{ClusterCIDR: example.ClusterCIDR},
			change: func(src *example.Source, ex []example.Pair) {
				web, empty, hairpin := ex[0], ex[6], ex[8]
				// web loses a2; empty gets its first endpoint; hairpin
				// goes away.
				src.SetSlice(builders.SliceFor(web.Service, example.EndpointsOn(example.PodA1, example.PodB1)...))
				src.SetSlice(builders.SliceFor(empty.Service, example.EndpointsOn(example.PodB1)...))
				src.DeleteService(hairpin.Service)
				src.DeleteSlice(hairpin.Slice)
			},
		},
		{
			name: "node-a-masquerade-all",
			cfg: Config{
				MasqueradeAll: true,
				MasqueradeBit: 12,
			},
			nodePorts: []string{"192.168.77.0/24", "127.0.0.1/32"},
		},
		{
			name: "node-a-ipv6",
			cfg:  Config{IPv6: true, ClusterCIDR: example.ClusterCIDR6},
			change: func(src *example.Source, ex []example.Pair) {
				web, empty, hairpin := ex[0], ex[6], ex[8]
				src.SetSlice(example.SliceFor(web.Service, example.EndpointsOn(example.PodA1v6, example.PodB1v6)...))
				src.SetSlice(example.SliceFor(empty.Service, example.EndpointsOn(example.PodB1v6)...))
				src.DeleteService(hairpin.Service)
				src.DeleteSlice(hairpin.Slice)
			},
		},
		{
			// ::1 in --nodeport-addresses serves no NodePorts, as
			// upstream's IPv6 proxier; IPv4 prefixes are ignored.
			name: "node-a-ipv6-masquerade-all",
			cfg: Config{
				IPv6:          true,
				MasqueradeAll: true,
				MasqueradeBit: 12,
			},
			nodePorts: []string{"fd00:192:168:77::/64", "::1/128", "192.168.77.0/24"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex := example.Example()
			src := example.NewSource(t, example.Node(example.NodeA))
			if tt.cfg.IPv6 {
				ex = example.Example6()
				src = example.NewSource6(t, example.Node6(example.NodeA))
			}
			src.Add(ex...)
			up := src.Update()
			cfg := tt.cfg
			if err := cfg.setDefaults(); err != nil {
				t.Fatal(err)
			}
			p := newPlanner(&cfg)
			p.r.nodeIPs = up.State.Node.Addrs
			// Upstream serves localhost NodePorts for IPv4 only.
			spec, err := model.ParseNodePortSpec(tt.nodePorts, cfg.IPv6, !cfg.IPv6)
			if err != nil {
				t.Fatal(err)
			}
			p.r.nodePorts = spec.Resolve(&up.State.Node, nil)
			pl, err := p.full(up.State, freshHooks)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tt.name+"-full", pl.tx.Bytes())
			p.commit(pl)
			if tt.change == nil {
				return
			}
			tt.change(src, ex)
			pl = p.partial(src.Update())
			checkGolden(t, tt.name+"-partial", pl.tx.Bytes())
		})
	}
}

// A partial sync followed by a full one must leave the same chains and
// rules as the full one alone: the planner's memory of what it applied must
// match what it wrote.
func TestPartialSyncsKeepTheAppliedStateOfAFullSync(t *testing.T) {
	ex := example.Example()
	src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
	cfg := Config{ClusterCIDR: example.ClusterCIDR}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	p := newPlanner(&cfg)
	pl, err := p.full(src.Update().State, freshHooks)
	if err != nil {
		t.Fatal(err)
	}
	p.commit(pl)

	src.SetSlice(builders.SliceFor(ex[0].Service, example.EndpointsOn(example.PodB1)...))
	src.DeleteService(ex[4].Service)
	src.SetSlice(builders.SliceFor(ex[6].Service, example.EndpointsOn(example.PodA1)...))
	up := src.Update()
	p.commit(p.partial(up))

	fresh := newPlanner(&cfg)
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
	ex := example.Example()
	src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
	cfg := Config{ClusterCIDR: example.ClusterCIDR}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	p := newPlanner(&cfg)
	up := src.Update()
	pl, err := p.full(up.State, freshHooks)
	if err != nil {
		t.Fatal(err)
	}
	p.commit(pl)
	if pl := p.reconcile(up.State); !pl.tx.Empty() {
		t.Errorf("reconciling an unchanged state writes:\n%s", pl.tx.Bytes())
	}

	src.SetSlice(builders.SliceFor(ex[0].Service, example.EndpointsOn(example.PodB1)...))
	src.DeleteService(ex[8].Service)
	up = src.Update()
	want := p.partial(up).tx.Bytes()
	got := p.reconcile(up.State)
	// The same lines; the order of Services may differ.
	if d := lineDiff(string(want), string(got.tx.Bytes())); d != "" {
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
		"IPv6 cluster CIDR for IPv4":       {ClusterCIDR: example.ClusterCIDR6},
		"IPv4 cluster CIDR for IPv6":       {IPv6: true, ClusterCIDR: example.ClusterCIDR},
		"IPv4 local traffic CIDR for IPv6": {IPv6: true, LocalDetector: xtables.LocalDetector{CIDR: example.ClusterCIDR}},
	} {
		if err := cfg.setDefaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for name, cfg := range map[string]Config{
		"IPv4": {ClusterCIDR: example.ClusterCIDR},
		"IPv6": {IPv6: true, ClusterCIDR: example.ClusterCIDR6},
	} {
		if err := cfg.setDefaults(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
