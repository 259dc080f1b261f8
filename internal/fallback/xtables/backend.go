// Package xtables runs the iptables tools for the fallback dataplanes: it
// picks a back end (legacy or nf_tables), feeds iptables-restore one
// transaction per sync, keeps the jumps from the built-in chains to ours in
// place, and removes every chain with our prefix on cleanup. Commands run in
// the dataplane's network namespace (see internal/netns).
//
// It parses nothing but what it needs from iptables-save and iptables -S:
// chain names and the jump rules that reference our chains.
package xtables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Prefix starts the name of every chain the fallback dataplanes create, in
// every table; cleanup removes every chain that carries it. kube-proxy's
// KUBE- chains are never touched.
const Prefix = "EBPFPROXY-"

// Back-end names accepted in configuration.
const (
	// BackendAuto picks legacy where its tools exist and the kernel has
	// the legacy tables, else nf_tables.
	BackendAuto = ""
	// BackendLegacy is the x_tables kernel interface (iptables-legacy).
	BackendLegacy = "legacy"
	// BackendNFT is iptables over nf_tables (iptables-nft).
	BackendNFT = "nft"
)

// ErrNoBackend is returned when no usable iptables tools are installed, or
// none of them works in the namespace.
var ErrNoBackend = errors.New("no usable iptables back end")

// Backend names the three tools of one iptables flavour.
type Backend struct {
	// Name is BackendLegacy or BackendNFT.
	Name string
	// Iptables, Save and Restore are the commands, looked up in PATH.
	Iptables, Save, Restore string
	// IPv6 is set for the ip6tables tools, which the IPv6 iptables
	// dataplane uses and removing kube-proxy's rules needs.
	IPv6 bool
}

// String returns the back end's name, followed by "ip6tables" for the
// IPv6 tools.
func (b Backend) String() string {
	if b.IPv6 {
		return b.Name + " ip6tables"
	}
	return b.Name
}

// candidates lists the tool sets of a back end, most specific first: the
// suffixed names Debian and most distributions install, then the plain names
// for systems that ship only one flavour (identified by --version).
func candidates(name string) []Backend {
	return []Backend{
		{Name: name, Iptables: "iptables-" + name, Save: "iptables-" + name + "-save", Restore: "iptables-" + name + "-restore"},
		{Name: name, Iptables: "iptables", Save: "iptables-save", Restore: "iptables-restore"},
	}
}

// candidates6 is candidates for the ip6tables tools.
func candidates6(name string) []Backend {
	return []Backend{
		{Name: name, Iptables: "ip6tables-" + name, Save: "ip6tables-" + name + "-save", Restore: "ip6tables-" + name + "-restore", IPv6: true},
		{Name: name, Iptables: "ip6tables", Save: "ip6tables-save", Restore: "ip6tables-restore", IPv6: true},
	}
}

// installed reports whether b's tools are all in PATH and, for the plain
// names, whether they are of b's flavour.
func installed(ctx context.Context, b Backend) bool {
	for _, tool := range []string{b.Iptables, b.Save, b.Restore} {
		if _, err := exec.LookPath(tool); err != nil {
			return false
		}
	}
	if b.Iptables != "iptables" && b.Iptables != "ip6tables" {
		return true
	}
	out, err := exec.CommandContext(ctx, b.Iptables, "--version").Output()
	if err != nil {
		return false
	}
	flavour := "(legacy)"
	if b.Name == BackendNFT {
		flavour = "(nf_tables)"
	}
	return bytes.Contains(out, []byte(flavour))
}

// Detect chooses the IPv4 back end for the namespace at netnsPath ("" for
// the caller's). want is BackendAuto, BackendLegacy or BackendNFT. Auto prefers
// legacy: iptables-nft-restore is quadratic in user space at tens of
// thousands of rules, iptables-legacy-restore is not. A back end counts only
// if its tools are installed and can list the nat table in the namespace
// (a kernel without the legacy tables fails there).
func Detect(ctx context.Context, netnsPath, want string) (Backend, error) {
	return DetectFamily(ctx, netnsPath, want, false)
}

// DetectFamily is Detect for one IP family: with ipv6 it chooses among the
// ip6tables tools, which need the kernel's IPv6 tables (ip6table_nat for
// the legacy back end).
func DetectFamily(ctx context.Context, netnsPath, want string, ipv6 bool) (Backend, error) {
	var names []string
	switch want {
	case BackendAuto:
		names = []string{BackendLegacy, BackendNFT}
	case BackendLegacy, BackendNFT:
		names = []string{want}
	default:
		return Backend{}, fmt.Errorf("iptables back end %q: want %q, %q or empty for auto", want, BackendLegacy, BackendNFT)
	}
	var errs []error
	for _, name := range names {
		b, err := usable(ctx, netnsPath, name, ipv6)
		if err == nil {
			return b, nil
		}
		errs = append(errs, err)
	}
	return Backend{}, fmt.Errorf("%w: %w", ErrNoBackend, errors.Join(errs...))
}

// Usable returns every back end whose tools are installed and work in the
// namespace: the iptables tools first, then the ip6tables tools.
func Usable(ctx context.Context, netnsPath string) []Backend {
	var out []Backend
	for _, ipv6 := range []bool{false, true} {
		for _, name := range []string{BackendLegacy, BackendNFT} {
			if b, err := usable(ctx, netnsPath, name, ipv6); err == nil {
				out = append(out, b)
			}
		}
	}
	return out
}

func usable(ctx context.Context, netnsPath, name string, ipv6 bool) (Backend, error) {
	tools := candidates(name)
	if ipv6 {
		tools = candidates6(name)
	}
	for _, b := range tools {
		if !installed(ctx, b) {
			continue
		}
		r := &Runner{Backend: b, Netns: netnsPath}
		if _, err := r.ListChain(ctx, "nat", "POSTROUTING"); err != nil {
			return Backend{}, fmt.Errorf("%s: %w", name, err)
		}
		return b, nil
	}
	if ipv6 {
		return Backend{}, fmt.Errorf("%s: ip6tables tools not installed", name)
	}
	return Backend{}, fmt.Errorf("%s: tools not installed", name)
}

// Runner runs one back end's tools in one network namespace.
type Runner struct {
	Backend Backend
	// Netns is the path of the namespace to run in; "" runs in the
	// caller's.
	Netns string
}

// waitArgs make the legacy tools wait up to five seconds for the xtables
// lock, which every iptables user on the machine shares (it is a file, not
// per namespace). The nf_tables tools take no lock.
func (r *Runner) waitArgs() []string {
	if r.Backend.Name == BackendLegacy {
		return []string{"-w", "5"}
	}
	return nil
}

// run starts tool with args inside the namespace and returns its stdout.
func (r *Runner) run(ctx context.Context, stdin []byte, tool string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, tool, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := netns.Start(r.Netns, cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", tool, err)
	}
	if err := cmd.Wait(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, firstLines(stderr.String(), 5))
	}
	return stdout.Bytes(), nil
}

// Restore applies input with iptables-restore --noflush: chains the input
// declares are flushed (or created), everything else is left alone. Each
// table in the input is committed atomically.
func (r *Runner) Restore(ctx context.Context, input []byte) error {
	args := append(r.waitArgs(), "--noflush")
	_, err := r.run(ctx, input, r.Backend.Restore, args...)
	return err
}

// Save returns iptables-save's dump of one table.
func (r *Runner) Save(ctx context.Context, table string) ([]byte, error) {
	return r.run(ctx, nil, r.Backend.Save, "-t", table)
}

// ListChain returns the rules of one chain as iptables -S prints them
// ("-A CHAIN spec", after the "-P" or "-N" line, which is dropped).
func (r *Runner) ListChain(ctx context.Context, table, chain string) ([]string, error) {
	return r.listChain(ctx, table, chain)
}

// ListChainCounters is ListChain with each rule's counters, as iptables
// -S -v prints them ("-A CHAIN match -c packets bytes -j target"); see
// RulePackets.
func (r *Runner) ListChainCounters(ctx context.Context, table, chain string) ([]string, error) {
	return r.listChain(ctx, table, chain, "-v")
}

func (r *Runner) listChain(ctx context.Context, table, chain string, extra ...string) ([]string, error) {
	args := append(append(r.waitArgs(), "-t", table, "-S", chain), extra...)
	out, err := r.run(ctx, nil, r.Backend.Iptables, args...)
	if err != nil {
		return nil, err
	}
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "-A ") {
			rules = append(rules, line)
		}
	}
	return rules, nil
}

// firstLines keeps error output short: iptables-restore names the failing
// line first.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("(%d more lines)", len(lines)-n))
	}
	return strings.Join(lines, "; ")
}

// RulePackets returns the packet counter of a rule of ListChainCounters
// ("-c packets bytes"), and false when the rule carries none.
func RulePackets(rule string) (uint64, bool) {
	w := strings.Fields(rule)
	for i := 0; i+2 < len(w); i++ {
		if w[i] == "-c" {
			n, err := strconv.ParseUint(w[i+1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
