package iptables

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// backends are the iptables flavours a privileged test runs with. Both
// must work wherever privileged tests are required.
var backends = []string{xtables.BackendLegacy, xtables.BackendNFT}

// requireBackend fails the test where privileged tests are required and
// the back end's tools are missing, and skips it elsewhere.
func requireBackend(t testing.TB, backend string) {
	t.Helper()
	if _, err := exec.LookPath("iptables-" + backend + "-restore"); err != nil {
		if reason, required := sandbox.PrivilegedRequired(); required {
			t.Fatalf("iptables %s tools are missing but %s requires this test: %v", backend, reason, err)
		}
		t.Skipf("iptables %s tools are missing: %v", backend, err)
	}
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

func TestPartialSyncsLeaveWhatAFullSyncWrites(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			ex := example.Example()
			src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
			m := metrics.New(metrics.IPv4)
			cfg := Config{Netns: sandbox.TestNetns(t, "ipt-partial").Path(), Backend: backend, ClusterCIDR: example.ClusterCIDR, Metrics: &m.FamilyMetrics}
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
					src.SetSlice(builders.SliceFor(ex[0].Service, example.EndpointsOn(example.PodA1, example.PodB1)...))
				}},
				{"a Service without endpoints gets one", func() {
					src.SetSlice(builders.SliceFor(ex[6].Service, example.EndpointsOn(example.PodA2)...))
				}},
				{"a Service loses all endpoints", func() { src.DeleteSlice(ex[1].Slice) }},
				{"a Service is deleted", func() { src.DeleteService(ex[4].Service) }},
				{"a Service is added", func() {
					src.Add(example.Pair{Service: example.Service("late", "10.96.0.99", builders.NodePort(30099)),
						Slice: builders.SliceFor(example.Service("late", "10.96.0.99"), example.EndpointsOn(example.PodA1)...)})
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

			// The same final state written by a full sync in a fresh
			// namespace.
			fresh, err := New(t.Context(), Config{Netns: sandbox.TestNetns(t, "ipt-full").Path(), Backend: backend, ClusterCIDR: example.ClusterCIDR})
			if err != nil {
				t.Fatal(err)
			}
			final := src.Update()
			final.Full = true
			if err := fresh.Sync(final); err != nil {
				t.Fatal(err)
			}
			want := readOwned(t, fresh.runner).normalized(t)
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
}

func TestStartupReplacesWhatAnEarlierAgentLeft(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			ns := sandbox.TestNetns(t, "ipt-restart").Path()
			ex := example.Example()
			src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
			cfg := Config{Netns: ns, Backend: backend, ClusterCIDR: example.ClusterCIDR}
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

			fresh, err := New(t.Context(), Config{Netns: sandbox.TestNetns(t, "ipt-fresh").Path(), Backend: backend, ClusterCIDR: example.ClusterCIDR})
			if err != nil {
				t.Fatal(err)
			}
			final := src.Update()
			final.Full = true
			if err := fresh.Sync(final); err != nil {
				t.Fatal(err)
			}
			if d := got.diff(readOwned(t, fresh.runner).normalized(t)); d != "" {
				t.Errorf("after a restart the kernel differs from a fresh full sync:\n%s", d)
			}
		})
	}
}

func TestCleanupRemovesEverythingFromEveryBackend(t *testing.T) {
	ns := sandbox.TestNetns(t, "ipt-cleanup").Path()
	var runners []*xtables.Runner
	for _, backend := range backends {
		requireBackend(t, backend)
		d, err := New(t.Context(), Config{Netns: ns, Backend: backend})
		if err != nil {
			t.Fatal(err)
		}
		src := example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...)
		if err := d.Sync(src.Update()); err != nil {
			t.Fatal(err)
		}
		if len(readOwned(t, d.runner)) == 0 {
			t.Fatalf("%s: no chains written", backend)
		}
		runners = append(runners, d.runner)
	}
	// Someone else's chain jumping to ours must not keep ours alive.
	if err := runners[0].Restore(t.Context(), []byte("*nat\n:OTHER - [0:0]\n-A OTHER -j "+chainServices+"\nCOMMIT\n")); err != nil {
		t.Fatal(err)
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
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			requireBackend(t, backend)
			src := example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...)
			m := metrics.New(metrics.IPv4)
			d, err := New(t.Context(), Config{Netns: sandbox.TestNetns(t, "ipt-repair").Path(), Backend: backend, ClusterCIDR: example.ClusterCIDR, Metrics: &m.FamilyMetrics})
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
}
