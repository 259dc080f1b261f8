package ipvs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Cleanup removes everything the IPVS dataplane creates in the namespace
// at netnsPath ("" for the caller's): our iptables chains (with every
// iptables back end, which also removes the iptables dataplane's), then
// what RemoveLeftovers removes. It is --cleanup's part for this mode and
// succeeds when there is nothing to remove, also on a kernel without IPVS.
func Cleanup(ctx context.Context, netnsPath string) error {
	var errs []error
	// Rules first: an ipset that a rule references cannot be destroyed.
	if err := xtables.CleanupAll(ctx, netnsPath, xtables.Prefix, ""); err != nil {
		errs = append(errs, err)
	}
	if err := RemoveLeftovers(ctx, netnsPath); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// RemoveLeftovers removes what the IPVS dataplane creates besides iptables
// chains: our virtual servers (those on the dummy interface's addresses or
// listed in our frontend sets; other IPVS services are left alone), our
// ipsets and the dummy interface. An agent starting in iptables mode calls
// it after its first sync, which has replaced the IPVS mode's chains with
// its own (an ipset that a rule still references cannot be destroyed); an
// IPVS-mode start needs nothing of the kind, its first sync removes the
// iptables mode's chains. It succeeds when there is nothing to remove, also
// on a kernel without IPVS.
func RemoveLeftovers(ctx context.Context, netnsPath string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k, err := openNetlink(netnsPath)
	if err != nil {
		return err
	}
	defer k.close()
	dummy, err := k.dummy(false)
	if err != nil {
		return err
	}
	sets, err := k.listSets()
	if err != nil {
		// A kernel without ipset has none of ours.
		sets = nil
	}
	var errs []error
	ipvsPresent, err := procNetIPVS(netnsPath)
	if err != nil {
		errs = append(errs, err)
	}
	if ipvsPresent {
		if err := k.deleteOwnedServices(netnsPath, dummy, sets); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range ipsetTypes {
		if !sets[s.name] {
			continue
		}
		if err := k.nl.IpsetDestroy(s.name); err != nil {
			errs = append(errs, fmt.Errorf("destroy ipset %s: %w", s.name, err))
		}
	}
	if dummy != nil {
		if err := k.nl.LinkDel(dummy); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", DummyName, err))
		}
	}
	return errors.Join(errs...)
}

// deleteOwnedServices deletes the virtual servers that the dataplane would
// recognise as its own after a restart.
func (k *kernel) deleteOwnedServices(netnsPath string, dummy netlink.Link, sets map[string]bool) error {
	h, err := libipvs.New(netnsPath)
	if err != nil {
		return fmt.Errorf("IPVS handle: %w", err)
	}
	defer h.Close()
	owned := map[vsKey]bool{}
	entries, err := k.setEntries(sets)
	if err != nil {
		return err
	}
	for e := range entries {
		if slices.Contains(frontendSets, e.Set) {
			owned[vsKey{Addr: e.IP, Proto: e.Proto, Port: e.Port}] = true
		}
	}
	if dummy != nil {
		bound, err := k.dummyAddrs(dummy)
		if err != nil {
			return err
		}
		services, err := h.GetServices()
		if err != nil {
			return fmt.Errorf("list virtual servers: %w", err)
		}
		for _, s := range services {
			if key, ok := keyOf(s); ok && bound[key.Addr] {
				owned[key] = true
			}
		}
	}
	var errs []error
	for key := range owned {
		s := ipvsService(key, "", 0)
		if !h.IsServicePresent(s) {
			continue
		}
		if err := h.DelService(s); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

func procNetIPVS(netnsPath string) (bool, error) {
	var ok bool
	err := netns.Do(netnsPath, func() error {
		_, err := os.Stat("/proc/net/ip_vs")
		ok = err == nil
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
	return ok, err
}

// CleanupOtherBackends removes our iptables chains from every back end but
// the one d uses: an agent that starts in IPVS mode calls it after its first
// sync, which has replaced whatever an earlier agent left in d's own back
// end.
func (d *Dataplane) CleanupOtherBackends(ctx context.Context) error {
	return xtables.CleanupAll(ctx, d.cfg.Netns, xtables.Prefix, d.runner.Backend.Name)
}
