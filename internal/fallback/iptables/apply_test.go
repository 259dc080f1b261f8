package iptables

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// backends are the iptables flavours a privileged test runs with. Both
// must work wherever privileged tests are required.
var backends = []string{xtables.BackendLegacy, xtables.BackendNFT}

// requireBackend fails the test where privileged tests are required and
// the back end's IPv4 tools are missing, and skips it elsewhere.
func requireBackend(t testing.TB, backend string) {
	t.Helper()
	requireTools(t, "iptables", backend)
}

// requireTools is requireBackend for the iptables or the ip6tables tools.
func requireTools(t testing.TB, tools, backend string) {
	t.Helper()
	if _, err := exec.LookPath(tools + "-" + backend + "-restore"); err != nil {
		if reason, required := sandbox.PrivilegedRequired(); required {
			t.Fatalf("%s %s tools are missing but %s requires this test: %v", tools, backend, reason, err)
		}
		t.Skipf("%s %s tools are missing: %v", tools, backend, err)
	}
}

// exampleFamily is the example cluster of one IP family as the privileged
// tests run it: the same Services with the family's addresses.
type exampleFamily struct {
	name, tools string
	ipv6        bool
	example     func() []example.Pair
	source      func(testing.TB) *example.Source
	clusterCIDR netip.Prefix
	a1, a2, b1  netip.Addr
	service     func(name, clusterIP string, opts ...builders.ServiceOption) *v1.Service
	// late is the ClusterIP of a Service added by a test.
	late string
}

var families = []exampleFamily{
	{
		name: "IPv4", tools: "iptables",
		example:     example.Example,
		source:      func(tb testing.TB) *example.Source { return example.NewSource(tb, example.Node(example.NodeA)) },
		clusterCIDR: example.ClusterCIDR,
		a1:          example.PodA1, a2: example.PodA2, b1: example.PodB1,
		service: example.Service,
		late:    "10.96.0.99",
	},
	{
		name: "IPv6", tools: "ip6tables", ipv6: true,
		example:     example.Example6,
		source:      func(tb testing.TB) *example.Source { return example.NewSource6(tb, example.Node6(example.NodeA)) },
		clusterCIDR: example.ClusterCIDR6,
		a1:          example.PodA1v6, a2: example.PodA2v6, b1: example.PodB1v6,
		service: example.Service6,
		late:    "fd00:10:96::99",
	},
}

// forEachFamilyAndBackend runs f for every family and back end, as "IPv4/legacy" and so on.
func forEachFamilyAndBackend(t *testing.T, f func(t *testing.T, fam exampleFamily, backend string)) {
	for _, fam := range families {
		for _, backend := range backends {
			t.Run(fam.name+"/"+backend, func(t *testing.T) {
				requireTools(t, fam.tools, backend)
				f(t, fam, backend)
			})
		}
	}
}

// config is the dataplane configuration of the family's example in the
// namespace at ns.
func (f exampleFamily) config(ns, backend string) Config {
	return Config{Backend: backend, Netfilter: xtables.Netfilter{Netns: ns, IPv6: f.ipv6, ClusterCIDR: f.clusterCIDR}}
}

// newSource returns a Source on node-a holding the family's example.
func (f exampleFamily) newSource(t testing.TB) ([]example.Pair, *example.Source) {
	ex := f.example()
	src := f.source(t)
	src.Add(ex...)
	return ex, src
}

// owned is what iptables-save shows of our chains: for each chain its
// rules, in order, and the jumps to our chains in the built-in ones.
type owned map[string][]string

func readOwned(t testing.TB, r *xtables.Runner) owned {
	t.Helper()
	out := owned{}
	for _, table := range xtables.Tables {
		dump, err := r.Save(t.Context(), table)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(dump), "\n") {
			switch {
			case strings.HasPrefix(line, ":"+Prefix):
				name, _, _ := strings.Cut(line[1:], " ")
				out[table+" "+name] = out[table+" "+name][:0:0]
			case strings.HasPrefix(line, "-A "):
				chain, spec, _ := strings.Cut(line[3:], " ")
				if strings.HasPrefix(chain, Prefix) || strings.HasPrefix(xtables.Target(spec), Prefix) {
					out[table+" "+chain] = append(out[table+" "+chain], spec)
				}
			}
		}
	}
	return out
}

// normalized sorts the rules of the shared chains, whose order partial
// syncs do not keep (and need not: their rules never overlap), after
// checking that the NodePort jump is the last rule of nat SERVICES.
func (o owned) normalized(t testing.TB) owned {
	t.Helper()
	out := owned{}
	for k, rules := range o {
		rules = slices.Clone(rules)
		if k == "nat "+chainServices {
			if len(rules) == 0 || xtables.Target(rules[len(rules)-1]) != chainNodePorts {
				t.Errorf("the last rule of nat %s must jump to %s: %q", chainServices, chainNodePorts, rules)
			}
		}
		table, chain, _ := strings.Cut(k, " ")
		for _, s := range sharedChains {
			if s.table == table && s.chain == chain {
				slices.Sort(rules)
			}
		}
		out[k] = rules
	}
	return out
}

func (o owned) diff(other owned) string {
	var b strings.Builder
	for k, rules := range o {
		if !slices.Equal(rules, other[k]) {
			fmt.Fprintf(&b, "%s:\n  have %q\n  want %q\n", k, rules, other[k])
		}
	}
	for k := range other {
		if _, ok := o[k]; !ok {
			fmt.Fprintf(&b, "%s: missing\n", k)
		}
	}
	return b.String()
}

// freshFullSync writes src's current state with a full sync in a fresh
// namespace and returns what the kernel holds of ours there.
func freshFullSync(t *testing.T, fam exampleFamily, backend string, src *example.Source) owned {
	t.Helper()
	fresh, err := New(t.Context(), fam.config(sandbox.TestNetns(t, "ipt-fresh").Path(), backend))
	if err != nil {
		t.Fatal(err)
	}
	final := src.Update()
	final.Full = true
	if err := fresh.Sync(final); err != nil {
		t.Fatal(err)
	}
	return readOwned(t, fresh.runner).normalized(t)
}

func TestPartialSyncsLeaveWhatAFullSyncWrites(t *testing.T) {
	forEachFamilyAndBackend(t, func(t *testing.T, fam exampleFamily, backend string) {
		ex, src := fam.newSource(t)
		m := metrics.New(fam.name)
		cfg := fam.config(sandbox.TestNetns(t, "ipt-partial").Path(), backend)
		cfg.Metrics = &m.FamilyMetrics
		d, err := New(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if d.Backend() != backend {
			t.Fatalf("asked for back end %s, got %s", backend, d.Backend())
		}
		if err := d.Sync(src.Update()); err != nil {
			t.Fatalf("first (full) sync: %v", err)
		}
		steps := []struct {
			name   string
			change func()
		}{
			{"an endpoint leaves", func() {
				src.SetSlice(example.SliceFor(ex[0].Service, example.EndpointsOn(fam.a1, fam.b1)...))
			}},
			{"a Service without endpoints gets one", func() {
				src.SetSlice(example.SliceFor(ex[6].Service, example.EndpointsOn(fam.a2)...))
			}},
			{"a Service loses all endpoints", func() { src.DeleteSlice(ex[1].Slice) }},
			{"a Service is deleted", func() { src.DeleteService(ex[4].Service) }},
			{"a Service is added", func() {
				late := fam.service("late", fam.late, builders.NodePort(30099))
				src.Add(example.Pair{Service: late, Slice: example.SliceFor(late, example.EndpointsOn(fam.a1)...)})
			}},
		}
		for _, step := range steps {
			step.change()
			up := src.Update()
			if up.Full || len(up.Changed) == 0 {
				t.Fatalf("%s: want a partial update with changes, got full=%t changed=%d", step.name, up.Full, len(up.Changed))
			}
			if err := d.Sync(up); err != nil {
				t.Fatalf("%s: partial sync: %v", step.name, err)
			}
		}
		got := readOwned(t, d.runner).normalized(t)

		want := freshFullSync(t, fam, backend, src)
		if d := got.diff(want); d != "" {
			t.Errorf("after partial syncs the kernel differs from a full sync:\n%s", d)
		}
		// The rule count metric matches the kernel.
		for _, table := range xtables.Tables {
			n := 0
			for k, rules := range got {
				if strings.HasPrefix(k, table+" "+Prefix) {
					n += len(rules)
				}
			}
			if c := gaugeValue(t, m.IPTablesRulesTotal.WithLabelValues(table)); int(c) != n {
				t.Errorf("kubeproxy_sync_proxy_rules_iptables_total{table=%q} = %v, the kernel holds %d of our rules", table, c, n)
			}
		}
	})
}

func TestStartupReplacesWhatAnEarlierAgentLeft(t *testing.T) {
	forEachFamilyAndBackend(t, func(t *testing.T, fam exampleFamily, backend string) {
		ns := sandbox.TestNetns(t, "ipt-restart").Path()
		ex, src := fam.newSource(t)
		cfg := fam.config(ns, backend)
		first, err := New(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := first.Sync(src.Update()); err != nil {
			t.Fatal(err)
		}
		// While no agent runs, three Services go away.
		src.DeleteService(ex[0].Service)
		src.DeleteService(ex[4].Service)
		src.DeleteService(ex[7].Service)
		second, err := New(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := second.Sync(src.Update()); err != nil {
			t.Fatal(err)
		}
		// A second full sync must find nothing to fix in the hooks.
		var tx xtables.Transaction
		if err := xtables.EnsureHooks(t.Context(), second.runner, Prefix, hooks(), &tx); err != nil {
			t.Fatal(err)
		}
		if !tx.Empty() {
			t.Errorf("hooks need fixing right after a full sync:\n%s", tx.Bytes())
		}
		got := readOwned(t, second.runner).normalized(t)

		if d := got.diff(freshFullSync(t, fam, backend, src)); d != "" {
			t.Errorf("after a restart the kernel differs from a fresh full sync:\n%s", d)
		}
	})
}

// syncEverywhere runs a dataplane of each family and back end in the
// namespace at ns, each synced with its family's example, and returns them.
func syncEverywhere(t *testing.T, ns string) []*Dataplane {
	var out []*Dataplane
	for _, fam := range families {
		for _, backend := range backends {
			requireTools(t, fam.tools, backend)
			d, err := New(t.Context(), Config{Backend: backend, Netfilter: xtables.Netfilter{Netns: ns, IPv6: fam.ipv6}})
			if err != nil {
				t.Fatal(err)
			}
			_, src := fam.newSource(t)
			if err := d.Sync(src.Update()); err != nil {
				t.Fatal(err)
			}
			if len(readOwned(t, d.runner)) == 0 {
				t.Fatalf("%s: no chains written", d.runner.Backend)
			}
			out = append(out, d)
		}
	}
	return out
}

func TestCleanupRemovesEverythingFromEveryBackend(t *testing.T) {
	ns := sandbox.TestNetns(t, "ipt-cleanup").Path()
	var runners []*xtables.Runner
	for _, d := range syncEverywhere(t, ns) {
		runners = append(runners, d.runner)
	}
	// Someone else's chain jumping to ours must not keep ours alive, in
	// either family.
	for _, r := range runners {
		if err := r.Restore(t.Context(), []byte("*nat\n:OTHER - [0:0]\n-A OTHER -j "+chainServices+"\nCOMMIT\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := Cleanup(t.Context(), ns); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	for _, r := range runners {
		if left := readOwned(t, r); len(left) != 0 {
			t.Errorf("%s: left after cleanup: %v", r.Backend, left)
		}
	}
	// A second cleanup finds nothing and succeeds.
	if err := Cleanup(t.Context(), ns); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestFullSyncRepairsFlushedBuiltinChains(t *testing.T) {
	forEachFamilyAndBackend(t, func(t *testing.T, fam exampleFamily, backend string) {
		_, src := fam.newSource(t)
		m := metrics.New(fam.name)
		cfg := fam.config(sandbox.TestNetns(t, "ipt-repair").Path(), backend)
		cfg.Metrics = &m.FamilyMetrics
		d, err := New(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(src.Update()); err != nil {
			t.Fatal(err)
		}
		want := readOwned(t, d.runner).normalized(t)

		// A periodic full sync of an unchanged state writes nothing.
		up := src.Update()
		up.Full = true
		if err := d.Sync(up); err != nil {
			t.Fatal(err)
		}
		if n := gaugeValue(t, m.IPTablesRulesLast.WithLabelValues("nat")); n != 0 {
			t.Errorf("a full sync of an unchanged state wrote %v nat rules, want 0", n)
		}

		// Someone flushes the whole nat table: our chains and jumps go.
		flush := exec.CommandContext(t.Context(), "ip", "netns", "exec", strings.TrimPrefix(d.cfg.Netns, "/run/netns/"), d.runner.Backend.Iptables, "-t", "nat", "-F")
		if out, err := flush.CombinedOutput(); err != nil {
			t.Fatalf("flush nat: %v: %s", err, out)
		}
		up = src.Update()
		up.Full = true
		if err := d.Sync(up); err != nil {
			t.Fatal(err)
		}
		if diff := readOwned(t, d.runner).normalized(t).diff(want); diff != "" {
			t.Errorf("after a flush and a full sync the kernel differs from before:\n%s", diff)
		}
	})
}

// A dataplane's CleanupOtherBackends removes our chains from the other back
// end of its own family only: on a dual-stack node the other family's
// chains are the other family's dataplane's.
func TestCleanupOtherBackendsKeepsToItsFamily(t *testing.T) {
	ns := sandbox.TestNetns(t, "ipt-clean-other").Path()
	all := syncEverywhere(t, ns)
	var ipv6Legacy *Dataplane
	for _, d := range all {
		if d.cfg.IPv6 && d.Backend() == xtables.BackendLegacy {
			ipv6Legacy = d
		}
	}
	if err := ipv6Legacy.CleanupOtherBackends(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, d := range all {
		left := len(readOwned(t, d.runner))
		removed := d.cfg.IPv6 && d.Backend() == xtables.BackendNFT
		switch {
		case removed && left != 0:
			t.Errorf("%s: %d of our chains left", d.runner.Backend, left)
		case !removed && left == 0:
			t.Errorf("%s: our chains were removed, only IPv6 nft's should be", d.runner.Backend)
		}
	}
}

// What an IPv6 sync writes is what ip6tables-save shows, word for word: the
// REJECT type, the affinity mask, the address literals and the order of
// the matches are written as the tools give them back. Two rewrites that
// both families share are left out: MARK --xor-mark/--or-mark is shown as
// --set-xmark, and the random probability with more digits.
func TestIPv6RulesReadBackAsWritten(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			requireTools(t, "ip6tables", backend)
			fam := families[1]
			_, src := fam.newSource(t)
			cfg := fam.config(sandbox.TestNetns(t, "ipt6-readback").Path(), backend)
			d, err := New(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			up := src.Update()
			if err := d.Sync(up); err != nil {
				t.Fatal(err)
			}
			saved := map[string][][]string{}
			for tableChain, rules := range readOwned(t, d.runner) {
				for _, r := range rules {
					saved[tableChain] = append(saved[tableChain], xtables.Words(r))
				}
			}
			if err := cfg.setDefaults(); err != nil {
				t.Fatal(err)
			}
			p := newPlanner(&cfg)
			p.r.nodeIPs = up.State.Node.Addrs
			p.r.nodePorts = up.State.Node.NodePorts
			pl, err := p.full(up.State, freshHooks)
			if err != nil {
				t.Fatal(err)
			}
			table, n := "", 0
			for _, line := range strings.Split(string(pl.tx.Bytes()), "\n") {
				if strings.HasPrefix(line, "*") {
					table = line[1:]
				}
				if !strings.HasPrefix(line, "-A ") {
					continue
				}
				chain, spec, _ := strings.Cut(line[3:], " ")
				if xtables.Target(spec) == "MARK" || strings.Contains(spec, "-m statistic") {
					continue
				}
				n++
				words := xtables.Words(spec)
				if !slices.ContainsFunc(saved[table+" "+chain], func(w []string) bool { return slices.Equal(w, words) }) {
					t.Errorf("%s: rendered rule not read back as written: %s", table, line)
				}
			}
			if n < 50 {
				t.Fatalf("only %d rules rendered; the example has more", n)
			}
		})
	}
}
