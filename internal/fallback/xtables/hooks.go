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

// Holding returns the installed back ends whose tables in the namespace at
// netnsPath ("" for the caller's) hold something named with prefix: a chain
// or a rule that mentions one. It runs only iptables-save without -t, which
// dumps the tables that exist and creates none, so that a cleanup in a
// namespace that never had our rules changes nothing there (iptables -L,
// and iptables-save -t, instantiate the legacy tables they name). A back end
// whose save fails is reported in the error and left out.
func Holding(ctx context.Context, netnsPath, prefix string) ([]Backend, error) {
	var out []Backend
	var errs []error
	for _, name := range []string{BackendLegacy, BackendNFT} {
		for _, b := range candidates(name) {
			if !installed(ctx, b) {
				continue
			}
			r := &Runner{Backend: b, Netns: netnsPath}
			dump, err := r.run(ctx, nil, b.Save)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			} else if strings.Contains(string(dump), prefix) {
				out = append(out, b)
			}
			break
		}
	}
	return out, errors.Join(errs...)
}

// CleanupAll runs Cleanup with every back end that Holding finds, except
// the one named except (the back end a running dataplane owns; "" for none).
func CleanupAll(ctx context.Context, netnsPath, prefix, except string) error {
	backends, err := Holding(ctx, netnsPath, prefix)
	errs := []error{err}
	for _, b := range backends {
		if b.Name == except {
			continue
		}
		if err := Cleanup(ctx, &Runner{Backend: b, Netns: netnsPath}, prefix); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
