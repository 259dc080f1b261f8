package kubeproxy

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// runner returns the tools of one back end and family in ns; it fails the
// test where privileged tests are required and they are missing.
func runner(t testing.TB, ns, name string, ipv6 bool) *xtables.Runner {
	t.Helper()
	cmd := "iptables"
	if ipv6 {
		cmd = "ip6tables"
	}
	b := xtables.Backend{Name: name, Iptables: cmd + "-" + name, Save: cmd + "-" + name + "-save", Restore: cmd + "-" + name + "-restore", IPv6: ipv6}
	for _, tool := range []string{b.Iptables, b.Save, b.Restore} {
		if _, err := exec.LookPath(tool); err != nil {
			if reason, required := sandbox.PrivilegedRequired(); required {
				t.Fatalf("%s is missing but %s requires this test: %v", tool, reason, err)
			}
			t.Skipf("%s is missing: %v", tool, err)
		}
	}
	return &xtables.Runner{Backend: b, Netns: ns}
}

func load(t testing.TB, r *xtables.Runner, file string) {
	t.Helper()
	rules, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(t.Context(), rules); err != nil {
		t.Fatalf("load %s with %s: %v", file, r.Backend, err)
	}
}

// tableState is what iptables-save shows of one table: "table :CHAIN"
// for each chain and "table -A CHAIN spec" for each rule, counters left
// out.
func tableState(t testing.TB, r *xtables.Runner) []string {
	t.Helper()
	var out []string
	for _, table := range xtables.Tables {
		dump, err := r.Save(t.Context(), table)
		if err != nil {
			t.Fatalf("%s save %s: %v", r.Backend, table, err)
		}
		for _, line := range strings.Split(string(dump), "\n") {
			switch {
			case strings.HasPrefix(line, ":"):
				name, _, _ := strings.Cut(line[1:], " ")
				out = append(out, table+" :"+name)
			case strings.HasPrefix(line, "-A "):
				out = append(out, table+" "+line)
			}
		}
	}
	return out
}

// without drops from state the chains named in gone ("table CHAIN"), their
// rules and the rules that jump to them: what a correct removal leaves.
func without(state, gone []string) []string {
	isGone := func(table, chain string) bool { return slices.Contains(gone, table+" "+chain) }
	var out []string
	for _, line := range state {
		table, rest, _ := strings.Cut(line, " ")
		if name, ok := strings.CutPrefix(rest, ":"); ok {
			if !isGone(table, name) {
				out = append(out, line)
			}
			continue
		}
		chain, spec, _ := strings.Cut(strings.TrimPrefix(rest, "-A "), " ")
		if !isGone(table, chain) && !isGone(table, xtables.Target(spec)) {
			out = append(out, line)
		}
	}
	return out
}

// What upstream kube-proxy's rules in testdata/node-ipv4.rules are, by
// table; nat KUBE-MARK-MASQ stays, a user's chain jumps to it.
var removedIPv4 = []string{
	"filter KUBE-EXTERNAL-SERVICES", "filter KUBE-FORWARD", "filter KUBE-NODEPORTS",
	"filter KUBE-PROXY-CANARY", "filter KUBE-PROXY-FIREWALL", "filter KUBE-SERVICES",
	"mangle KUBE-PROXY-CANARY",
	"nat KUBE-EXT-6G4VTUJ2WNFMC3ZC", "nat KUBE-EXT-LOLE4ISW44XBNF3G", "nat KUBE-NODEPORTS",
	"nat KUBE-POSTROUTING", "nat KUBE-PROXY-CANARY", "nat KUBE-SEP-2XZJVPRY2PQVE3B3",
	"nat KUBE-SEP-LMQ3LR7ZBU2VLD4H", "nat KUBE-SEP-X5OYBVWF3TUVZCVU", "nat KUBE-SERVICES",
	"nat KUBE-SVC-6G4VTUJ2WNFMC3ZC", "nat KUBE-SVC-LOLE4ISW44XBNF3G", "nat KUBE-SVL-LOLE4ISW44XBNF3G",
}

var removedIPv6 = []string{
	"filter KUBE-FORWARD", "filter KUBE-PROXY-CANARY", "filter KUBE-SERVICES",
	"mangle KUBE-PROXY-CANARY",
	"nat KUBE-MARK-MASQ", "nat KUBE-NODEPORTS", "nat KUBE-POSTROUTING", "nat KUBE-PROXY-CANARY",
	"nat KUBE-SEP-QYV7WBJ4TB3MD3BM", "nat KUBE-SERVICES", "nat KUBE-SVC-6G4VTUJ2WNFMC3ZC",
}

func prefixed(prefix string, names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, prefix+" "+n)
	}
	return out
}

func nft(t testing.TB, ns string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if reason, required := sandbox.PrivilegedRequired(); required {
			t.Fatalf("nft is missing but %s requires this test: %v", reason, err)
		}
		t.Skipf("nft is missing: %v", err)
	}
	out, err := runNFT(t.Context(), ns, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// A node that ran kube-proxy in iptables mode, dual-stack, with either
// iptables back end (and the nftables mode's tables from an earlier
// try): after Remove, kube-proxy's chains and the jumps to them are gone
// in iptables and ip6tables, its nftables tables too, and everything else
// (the kubelet's chains, a user's chains, the chain a user's rule uses)
// is as it was.
func TestRemoveTakesKubeProxysRulesAndLeavesTheRest(t *testing.T) {
	for _, backend := range []string{xtables.BackendLegacy, xtables.BackendNFT} {
		t.Run(backend, func(t *testing.T) {
			ns := sandbox.TestNetns(t, "kp-rm-"+backend).Path()
			v4, v6 := runner(t, ns, backend, false), runner(t, ns, backend, true)
			load(t, v4, "testdata/node-ipv4.rules")
			load(t, v6, "testdata/node-ipv6.rules")
			nft(t, ns, "add", "table", "ip", "kube-proxy")
			nft(t, ns, "add", "table", "ip6", "kube-proxy")
			nft(t, ns, "add", "table", "inet", "user")
			before4, before6 := tableState(t, v4), tableState(t, v6)

			if present, err := Present(t.Context(), ns); err != nil || !present {
				t.Fatalf("Present before removal = %v, %v; want true", present, err)
			}
			done, err := Remove(t.Context(), ns)
			if err != nil {
				t.Fatalf("Remove: %v", err)
			}

			if got, want := tableState(t, v4), without(before4, removedIPv4); !slices.Equal(got, want) {
				t.Errorf("IPv4 tables after removal:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if got, want := tableState(t, v6), without(before6, removedIPv6); !slices.Equal(got, want) {
				t.Errorf("IPv6 tables after removal:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			wantRemoved := append(prefixed(backend, removedIPv4), prefixed(backend+" ip6tables", removedIPv6)...)
			if !slices.Equal(done.Chains, wantRemoved) {
				t.Errorf("Removed.Chains = %q, want %q", done.Chains, wantRemoved)
			}
			if want := []string{backend + " nat KUBE-MARK-MASQ"}; !slices.Equal(done.Kept, want) {
				t.Errorf("Removed.Kept = %q, want %q (a user's chain jumps to it)", done.Kept, want)
			}
			if want := []string{"ip kube-proxy", "ip6 kube-proxy"}; !slices.Equal(done.NFTables, want) {
				t.Errorf("Removed.NFTables = %q, want %q", done.NFTables, want)
			}
			tables := nft(t, ns, "list", "tables")
			if strings.Contains(tables, "kube-proxy") || !strings.Contains(tables, "table inet user") {
				t.Errorf("nftables tables after removal:\n%s\nwant kube-proxy's gone and inet user kept", tables)
			}

			again, err := Remove(t.Context(), ns)
			if err != nil || !again.Empty() {
				t.Errorf("a second Remove = %+v, %v; want nothing removed", again, err)
			}
		})
	}
}

// On a node that never ran kube-proxy, Remove changes nothing, not even
// by creating an empty table.
func TestRemoveWhereKubeProxyNeverRanCreatesNothing(t *testing.T) {
	ns := sandbox.TestNetns(t, "kp-rm-none").Path()
	done, err := Remove(t.Context(), ns)
	if err != nil || !done.Empty() {
		t.Fatalf("Remove = %+v, %v; want nothing removed", done, err)
	}
	if present, err := Present(t.Context(), ns); err != nil || present {
		t.Errorf("Present = %v, %v; want false", present, err)
	}
	for _, tool := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		cmd := exec.Command(tool)
		var out strings.Builder
		cmd.Stdout = &out
		if err := netns.Start(ns, cmd); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if strings.Contains(out.String(), "*") {
			t.Errorf("%s shows tables after Remove in an empty namespace:\n%s", tool, out.String())
		}
	}
}
