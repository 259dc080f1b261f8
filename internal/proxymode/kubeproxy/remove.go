package kubeproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Removed is what Remove removed.
type Removed struct {
	// Chains are "<back end> <table> <chain>", e.g. "legacy nat
	// KUBE-SERVICES" or "nft ip6tables filter KUBE-FORWARD".
	Chains []string
	// Kept are chains of kube-proxy's names left because someone else's
	// chain jumps to them (see xtables.Claimed), in the same form.
	Kept []string
	// VirtualServers, IPSets and Interface are the IPVS mode's.
	VirtualServers []string
	IPSets         []string
	Interface      string
	// NFTables are the nftables mode's tables, as "family name".
	NFTables []string
}

// Empty reports whether nothing was removed.
func (r Removed) Empty() bool {
	return len(r.Chains) == 0 && len(r.VirtualServers) == 0 && len(r.IPSets) == 0 &&
		r.Interface == "" && len(r.NFTables) == 0
}

// Present reports whether the namespace at netnsPath ("" for the caller's)
// holds anything of kube-proxy's, including chains that Remove would keep
// because another program's rules use them. It only reads:
// iptables-save without -t and ip6tables-save in every back end, netlink
// for the interface and the ipsets, and nft list tables.
func Present(ctx context.Context, netnsPath string) (bool, error) {
	backends, err := xtables.HoldingClaimed(ctx, netnsPath, IsChain)
	if len(backends) > 0 {
		return true, nil
	}
	errs := []error{err}
	held, err := ipvs.HoldsForeign(netnsPath, foreignIPVS())
	if held {
		return true, nil
	}
	errs = append(errs, err)
	tables, err := nftTablesPresent(ctx, netnsPath)
	return len(tables) > 0, errors.Join(append(errs, err)...)
}

// Remove removes kube-proxy's leftovers from the namespace at netnsPath
// ("" for the caller's): its chains and the jumps to them in every
// iptables back end, IPv4 and IPv6 (the rules first, since a referenced
// ipset cannot be destroyed), then the IPVS mode's virtual servers,
// ipsets and kube-ipvs0, then the nftables mode's tables. It removes what
// it can and returns what it removed with the errors met. The caller makes
// sure no kube-proxy runs (see Running): it would put them back.
func Remove(ctx context.Context, netnsPath string) (Removed, error) {
	var done Removed
	backends, err := xtables.HoldingClaimed(ctx, netnsPath, IsChain)
	errs := []error{err}
	for _, b := range backends {
		removed, kept, err := xtables.RemoveClaimed(ctx, &xtables.Runner{Backend: b, Netns: netnsPath}, IsChain)
		for _, c := range removed {
			done.Chains = append(done.Chains, b.String()+" "+c)
		}
		for _, c := range kept {
			done.Kept = append(done.Kept, b.String()+" "+c)
		}
		errs = append(errs, err)
	}
	f, err := ipvs.RemoveForeign(ctx, netnsPath, foreignIPVS())
	done.VirtualServers, done.IPSets = f.VirtualServers, f.Sets
	if f.Dummy {
		done.Interface = DummyName
	}
	errs = append(errs, err)
	tables, err := nftTablesPresent(ctx, netnsPath)
	errs = append(errs, err)
	for _, t := range tables {
		family, name, _ := strings.Cut(t, " ")
		if _, err := runNFT(ctx, netnsPath, "delete", "table", family, name); err != nil {
			errs = append(errs, err)
			continue
		}
		done.NFTables = append(done.NFTables, t)
	}
	return done, errors.Join(errs...)
}

// nftTablesPresent returns those of nftTables that exist; none, and no
// error, where the nft tool is missing (kube-proxy's nftables mode needs
// it, so a node without it has none of its tables).
func nftTablesPresent(ctx context.Context, netnsPath string) ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil
	}
	out, err := runNFT(ctx, netnsPath, "list", "tables")
	if err != nil {
		return nil, err
	}
	var found []string
	for _, line := range strings.Split(string(out), "\n") {
		t := strings.TrimPrefix(strings.TrimSpace(line), "table ")
		for _, want := range nftTables {
			if t == want {
				found = append(found, want)
			}
		}
	}
	return found, nil
}

func runNFT(ctx context.Context, netnsPath string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nft", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := netns.Start(netnsPath, cmd); err != nil {
		return nil, fmt.Errorf("start nft: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
