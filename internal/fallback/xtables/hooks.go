package xtables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Hook is a rule in a built-in chain that jumps to one of our chains.
type Hook struct {
	Table, Chain string
	// Spec is the rule after "-A CHAIN", written as iptables prints it.
	Spec string
}

// EnsureHooks adds to tx what makes the built-in chains hold exactly hooks
// as their rules that jump to a chain named with prefix, in the given order:
// nothing when they already do, else deletions of every such rule found and
// insertions of hooks at the top. It lists each built-in chain once with
// iptables -S; the chains of the table themselves are never listed, so the
// cost does not grow with the number of Services. Jumps to prefixed chains
// that hooks do not name (another mode's, an older version's) are removed.
func EnsureHooks(ctx context.Context, r *Runner, prefix string, hooks []Hook, tx *Transaction) error {
	for _, table := range Tables {
		for _, chain := range Builtin[table] {
			var want []string
			for _, h := range hooks {
				if h.Table == table && h.Chain == chain {
					want = append(want, h.Spec)
				}
			}
			rules, err := r.ListChain(ctx, table, chain)
			if err != nil {
				return fmt.Errorf("list %s %s: %w", table, chain, err)
			}
			var have []string
			for _, line := range rules {
				spec := strings.TrimPrefix(line, "-A "+chain+" ")
				if strings.HasPrefix(Target(spec), prefix) {
					have = append(have, spec)
				}
			}
			if sameRules(have, want) {
				continue
			}
			t := tx.Table(table)
			for _, spec := range have {
				t.Delete(chain, spec)
			}
			for i := len(want) - 1; i >= 0; i-- {
				t.Insert(chain, want[i])
			}
		}
	}
	return nil
}

// HooksIntact reports whether the built-in chains that hooks name hold
// exactly hooks as their jumps to prefixed chains. It lists only those
// chains: with the legacy back end every listing fetches the whole table,
// so a periodic check must stay small. A missing hook means someone
// flushed the built-in chains, and probably ours with them.
func HooksIntact(ctx context.Context, r *Runner, prefix string, hooks []Hook) (bool, error) {
	type chainKey struct{ table, chain string }
	want := map[chainKey][]string{}
	var order []chainKey
	for _, h := range hooks {
		k := chainKey{h.Table, h.Chain}
		if _, ok := want[k]; !ok {
			order = append(order, k)
		}
		want[k] = append(want[k], h.Spec)
	}
	for _, k := range order {
		rules, err := r.ListChain(ctx, k.table, k.chain)
		if err != nil {
			return false, fmt.Errorf("list %s %s: %w", k.table, k.chain, err)
		}
		var have []string
		for _, line := range rules {
			spec := strings.TrimPrefix(line, "-A "+k.chain+" ")
			if strings.HasPrefix(Target(spec), prefix) {
				have = append(have, spec)
			}
		}
		if !sameRules(have, want[k]) {
			return false, nil
		}
	}
	return true, nil
}

// sameRules compares rule specs word by word, so that quoting differences
// between what we write and what iptables prints do not count.
func sameRules(a, b []string) bool {
	return slices.EqualFunc(a, b, func(x, y string) bool { return slices.Equal(Words(x), Words(y)) })
}

// Owned are the chains named with a prefix found in one table, and every
// rule elsewhere in the table that jumps to one of them.
type Owned struct {
	Chains map[string]bool
	// Jumps are rules in chains not named with the prefix (built-in or
	// someone else's) that target an owned chain, as chain and spec.
	Jumps []Hook
}

// ReadOwned reads one table with iptables-save and returns what carries
// prefix. It is called at start-up and after a failed sync, never on every
// sync: at 10,000 Services the nat table holds over 100,000 rules.
func ReadOwned(ctx context.Context, r *Runner, table, prefix string) (Owned, error) {
	out, err := r.Save(ctx, table)
	if err != nil {
		return Owned{}, fmt.Errorf("read %s table: %w", table, err)
	}
	own := Owned{Chains: map[string]bool{}}
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if strings.HasPrefix(name, prefix) {
				own.Chains[name] = true
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			if !strings.HasPrefix(chain, prefix) && strings.HasPrefix(Target(spec), prefix) {
				own.Jumps = append(own.Jumps, Hook{Table: table, Chain: chain, Spec: spec})
			}
		}
	}
	return own, nil
}

// Cleanup removes every chain named with prefix from Tables, and every rule
// that jumps to one, in one transaction.
func Cleanup(ctx context.Context, r *Runner, prefix string) error {
	var tx Transaction
	for _, table := range Tables {
		own, err := ReadOwned(ctx, r, table, prefix)
		if err != nil {
			return err
		}
		RemoveOwned(&tx, table, own)
	}
	if tx.Empty() {
		return nil
	}
	if err := r.Restore(ctx, tx.Bytes()); err != nil {
		return fmt.Errorf("remove %s chains (%s): %w", prefix, r.Backend, err)
	}
	return nil
}

// RemoveOwned adds to tx what removes own from table: the jumps first, then
// the chains, flushed and deleted.
func RemoveOwned(tx *Transaction, table string, own Owned) {
	t := tx.Table(table)
	for _, j := range own.Jumps {
		t.Delete(j.Chain, j.Spec)
	}
	chains := make([]string, 0, len(own.Chains))
	for c := range own.Chains {
		chains = append(chains, c)
	}
	slices.Sort(chains)
	for _, c := range chains {
		t.Chain(c)
		t.DeleteChain(c)
	}
}

// Holding returns the installed back ends, iptables and ip6tables tools
// alike, whose tables in the namespace at netnsPath ("" for the caller's)
// hold something named with prefix: a chain or a rule that mentions one. It
// runs only iptables-save (ip6tables-save) without -t, which dumps the
// tables that exist and creates none, so that a cleanup in a namespace that
// never had our rules changes nothing there (iptables -L, and iptables-save
// -t, instantiate the legacy tables they name). A back end whose save fails
// is reported in the error and left out.
func Holding(ctx context.Context, netnsPath, prefix string) ([]Backend, error) {
	return holding(ctx, netnsPath, []func(string) []Backend{candidates, candidates6}, func(dump string) bool {
		return strings.Contains(dump, prefix)
	})
}

// HoldingClaimed is Holding for the chains that claims names, with the
// iptables and the ip6tables tools of every back end.
func HoldingClaimed(ctx context.Context, netnsPath string, claims Claims) ([]Backend, error) {
	return holding(ctx, netnsPath, []func(string) []Backend{candidates, candidates6}, func(dump string) bool {
		return len(claimedChains(dump, claims)) > 0
	})
}

func holding(ctx context.Context, netnsPath string, families []func(string) []Backend, match func(dump string) bool) ([]Backend, error) {
	var out []Backend
	var errs []error
	for _, family := range families {
		for _, name := range []string{BackendLegacy, BackendNFT} {
			for _, b := range family(name) {
				if !installed(ctx, b) {
					continue
				}
				r := &Runner{Backend: b, Netns: netnsPath}
				dump, err := r.run(ctx, nil, b.Save)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", b, err))
				} else if match(string(dump)) {
					out = append(out, b)
				}
				break
			}
		}
	}
	return out, errors.Join(errs...)
}

// claimedChains lists the chains of a whole iptables-save dump that claims
// names, as "table chain".
func claimedChains(dump string, claims Claims) []string {
	var out []string
	table := ""
	for _, line := range strings.Split(dump, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if claims(table, name) {
				out = append(out, table+" "+name)
			}
		}
	}
	return out
}

// CleanupAll runs Cleanup with every back end, of either IP family, that
// Holding finds, except those skip reports (nil skips none): a running
// dataplane skips its own back end, whose chains its syncs replace.
func CleanupAll(ctx context.Context, netnsPath, prefix string, skip func(Backend) bool) error {
	backends, err := Holding(ctx, netnsPath, prefix)
	errs := []error{err}
	for _, b := range backends {
		if skip != nil && skip(b) {
			continue
		}
		if err := Cleanup(ctx, &Runner{Backend: b, Netns: netnsPath}, prefix); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// OtherBackends returns the skip function of CleanupAll for a dataplane that
// runs with b: it skips b itself and every back end of the other IP family,
// whose chains belong to the other family's dataplane.
func OtherBackends(b Backend) func(Backend) bool {
	return func(o Backend) bool { return o.IPv6 != b.IPv6 || o.Name == b.Name }
}

// Claims says whether a chain of a table belongs to the software whose
// rules are being removed (ReadClaimed, RemoveClaimed): another program's,
// named by an explicit list rather than by our prefix.
type Claims func(table, chain string) bool

// Claimed is what ReadClaimed finds in one table.
type Claimed struct {
	// Owned holds the claimed chains to remove and the jumps to them from
	// the built-in chains.
	Owned
	// Kept are claimed chains left in place because a chain that is
	// neither built in nor claimed jumps to them, directly or through
	// other claimed chains: removing them would break someone else's
	// rules, and removing the jump would change what those rules do.
	Kept []string
}

// ReadClaimed reads one table with iptables-save and returns the chains
// that claims names, except those someone else's chains still use (see
// Claimed.Kept), and the rules of the built-in chains that jump to them.
func ReadClaimed(ctx context.Context, r *Runner, table string, claims Claims) (Claimed, error) {
	out, err := r.Save(ctx, table)
	if err != nil {
		return Claimed{}, fmt.Errorf("read %s table: %w", table, err)
	}
	builtin := map[string]bool{}
	claimed := map[string]bool{}
	type rule struct{ chain, spec, target string }
	var rules []rule
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			// ":NAME POLICY [packets:bytes]"; user chains have policy "-".
			f := strings.Fields(line[1:])
			if len(f) > 1 && f[1] != "-" {
				builtin[f[0]] = true
			} else if len(f) > 0 && claims(table, f[0]) {
				claimed[f[0]] = true
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			rules = append(rules, rule{chain, spec, Target(spec)})
		}
	}
	// Keep what a foreign chain reaches through claimed chains.
	kept := map[string]bool{}
	var queue []string
	for _, r := range rules {
		if claimed[r.target] && !claimed[r.chain] && !builtin[r.chain] && !kept[r.target] {
			kept[r.target] = true
			queue = append(queue, r.target)
		}
	}
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		for _, r := range rules {
			if r.chain == c && claimed[r.target] && !kept[r.target] {
				kept[r.target] = true
				queue = append(queue, r.target)
			}
		}
	}
	got := Claimed{Owned: Owned{Chains: map[string]bool{}}}
	for c := range claimed {
		if kept[c] {
			got.Kept = append(got.Kept, c)
		} else {
			got.Chains[c] = true
		}
	}
	slices.Sort(got.Kept)
	for _, r := range rules {
		if builtin[r.chain] && got.Chains[r.target] {
			got.Jumps = append(got.Jumps, Hook{Table: table, Chain: r.chain, Spec: r.spec})
		}
	}
	return got, nil
}

// RemoveClaimed removes from Tables, in one transaction, the chains that
// claims names and the jumps to them from the built-in chains, except the
// chains that someone else's rules still use. It returns the chains
// removed and those kept, each as "table chain".
func RemoveClaimed(ctx context.Context, r *Runner, claims Claims) (removed, kept []string, err error) {
	var tx Transaction
	for _, table := range Tables {
		c, err := ReadClaimed(ctx, r, table, claims)
		if err != nil {
			return nil, nil, err
		}
		RemoveOwned(&tx, table, c.Owned)
		for name := range c.Chains {
			removed = append(removed, table+" "+name)
		}
		for _, name := range c.Kept {
			kept = append(kept, table+" "+name)
		}
	}
	slices.Sort(removed)
	if tx.Empty() {
		return nil, kept, nil
	}
	if err := r.Restore(ctx, tx.Bytes()); err != nil {
		return nil, kept, fmt.Errorf("remove chains (%s): %w", r.Backend, err)
	}
	return removed, kept, nil
}

// ToolNames lists the names (Backend.String) of the back ends that
// dataplanes write with, for the other modes' cleanup (mode.Instance.Uses).
func ToolNames[D interface{ Tools() Backend }](ds []D) []string {
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = d.Tools().String()
	}
	return names
}

// Keeping returns the skip function of CleanupAll that keeps the back
// ends of names (ToolNames): nil where names is empty, which skips none.
func Keeping(names []string) func(Backend) bool {
	if len(names) == 0 {
		return nil
	}
	return func(b Backend) bool { return slices.Contains(names, b.String()) }
}
