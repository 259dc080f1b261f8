package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Cleanup removes everything the IPVS dataplanes of both IP families create
// in the namespace at netnsPath ("" for the caller's): our virtual servers
// first (removeVirtualServers says why), then our iptables chains (with
// every iptables and ip6tables back end, which also removes the iptables
// dataplane's of both families), then the ipsets and the dummy interface.
// It is --cleanup's part for this mode, and what an agent starting in ebpf
// or nftables mode removes of it after its first sync. It succeeds when
// there is nothing to remove, also on a kernel without IPVS.
func Cleanup(ctx context.Context, netnsPath string) error {
	errs := []error{removeVirtualServers(ctx, netnsPath)}
	// Rules before the ipsets: an ipset that a rule references cannot be
	// destroyed.
	errs = append(errs, xtables.CleanupAll(ctx, netnsPath, xtables.Prefix, nil))
	return errors.Join(append(errs, removeLeftovers(ctx, netnsPath, families, objectsOnly))...)
}

// RemoveLeftovers removes what the IPVS dataplane creates besides iptables
// chains, for both IP families: our virtual servers (those on the dummy
// interface's addresses or listed in our frontend sets; other IPVS services
// are left alone), our ipsets and the dummy interface. An agent starting in
// iptables mode calls it after its first sync, which has replaced the IPVS
// mode's chains with its own (an ipset that a rule still references cannot
// be destroyed); an IPVS-mode start needs nothing of the kind, its first
// sync removes the iptables mode's chains. It succeeds when there is
// nothing to remove, also on a kernel without IPVS.
func RemoveLeftovers(ctx context.Context, netnsPath string) error {
	return removeLeftovers(ctx, netnsPath, families, everything)
}

// RemoveFamilyLeftovers is RemoveLeftovers for the one family ipv6 names,
// for an IPVS-mode agent that no longer serves it: that family's virtual
// servers, ipsets and addresses of the dummy interface go, the interface
// and the other family's objects stay. Call it after that family's
// iptables or ip6tables chains are gone.
func RemoveFamilyLeftovers(ctx context.Context, netnsPath string, ipv6 bool) error {
	f := &familyIPv4
	if ipv6 {
		f = &familyIPv6
	}
	return removeLeftovers(ctx, netnsPath, []*family{f}, familyObjects)
}

// removeVirtualServers deletes our virtual servers of both families and
// nothing else: Cleanup's first step, at once after the first sync of the
// mode that replaces IPVS's. Until then a closed IPVS connection of a pod
// on the node (client address and port, the VIP, a backend), which IPVS
// keeps for minutes, still answers for that backend, and a new connection
// the socket hooks send from the same client port straight to the same
// backend meets the old entry, not the backend, and fails. A virtual
// server's deletion makes the kernel flush its connections
// (expire_nodest_conn, which the IPVS dataplane sets).
func removeVirtualServers(ctx context.Context, netnsPath string) error {
	return removeLeftovers(ctx, netnsPath, families, servicesOnly)
}

// What removeLeftovers removes of its families.
type removal int

const (
	// servicesOnly: the virtual servers alone (removeVirtualServers).
	servicesOnly removal = iota
	// familyObjects: the virtual servers, ipsets and dummy addresses.
	familyObjects
	// everything: the virtual servers, ipsets and the dummy interface.
	everything
	// objectsOnly: everything but the virtual servers, which Cleanup
	// deleted first.
	objectsOnly
)

// openLeftovers opens netlink in the namespace at netnsPath and reads what
// finding our objects there starts from: the dummy interface (nil without
// one) and the ipsets by name. Close the kernel after use.
func openLeftovers(ctx context.Context, netnsPath string) (k *kernel, dummy netlink.Link, sets map[string]bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, nil, err
	}
	if k, err = openNetlink(netnsPath); err != nil {
		return nil, nil, nil, err
	}
	if dummy, err = k.dummy(false); err != nil {
		k.close()
		return nil, nil, nil, err
	}
	if sets, err = k.listSets(); err != nil {
		// A kernel without ipset has none of ours.
		sets = nil
	}
	return k, dummy, sets, nil
}

func removeLeftovers(ctx context.Context, netnsPath string, fams []*family, what removal) error {
	k, dummy, sets, err := openLeftovers(ctx, netnsPath)
	if err != nil {
		return err
	}
	defer k.close()
	// The dummy interface goes whole, or only the families' addresses.
	wholeDummy := what == everything || what == objectsOnly
	var errs []error
	ipvsPresent, err := procNetIPVS(netnsPath)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range fams {
		if ipvsPresent && what != objectsOnly {
			if err := k.deleteOwnedServices(netnsPath, f, dummy, sets); err != nil {
				errs = append(errs, err)
			}
		}
		if what == servicesOnly {
			continue
		}
		for _, s := range ipsetTypes {
			name := f.set(s.name)
			if !sets[name] {
				continue
			}
			if err := k.nl.IpsetDestroy(name); err != nil {
				errs = append(errs, fmt.Errorf("destroy ipset %s: %w", name, err))
			}
		}
		if dummy == nil || wholeDummy {
			continue
		}
		bound, err := k.dummyAddrs(dummy, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for a := range bound {
			if err := k.unbind(dummy, a); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if dummy != nil && wholeDummy {
		if err := k.nl.LinkDel(dummy); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", DummyName, err))
		}
	}
	return errors.Join(errs...)
}

// deleteOwnedServices deletes the virtual servers of family f that its
// dataplane would recognise as its own after a restart.
func (k *kernel) deleteOwnedServices(netnsPath string, f *family, dummy netlink.Link, sets map[string]bool) error {
	owned, err := k.ownedServices(netnsPath, f, dummy, sets)
	if err != nil {
		return err
	}
	_, err = deleteServices(netnsPath, owned)
	return err
}

// ownedServices lists the virtual servers of family f that its dataplane
// would recognise as its own after a restart: those listed in our
// frontend sets, and those on the dummy interface's addresses.
func (k *kernel) ownedServices(netnsPath string, f *family, dummy netlink.Link, sets map[string]bool) ([]vsKey, error) {
	owned := map[vsKey]bool{}
	entries, err := k.setEntries(f, sets)
	if err != nil {
		return nil, err
	}
	for e := range entries {
		if slices.Contains(frontendSets, e.Set) {
			owned[vsKey{Addr: e.IP, Proto: e.Proto, Port: e.Port}] = true
		}
	}
	if dummy != nil {
		bound, err := k.dummyAddrs(dummy, f)
		if err != nil {
			return nil, err
		}
		h, err := libipvs.New(netnsPath)
		if err != nil {
			return nil, fmt.Errorf("IPVS handle: %w", err)
		}
		defer h.Close()
		services, err := h.GetServices()
		if err != nil {
			return nil, fmt.Errorf("list virtual servers: %w", err)
		}
		for _, s := range services {
			if key, ok := keyOf(s); ok && bound[key.Addr] {
				owned[key] = true
			}
		}
	}
	return slices.Collect(maps.Keys(owned)), nil
}

// deleteServices deletes the virtual servers keys names that exist, and
// says how many it deleted.
func deleteServices(netnsPath string, keys []vsKey) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	h, err := libipvs.New(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("IPVS handle: %w", err)
	}
	defer h.Close()
	var errs []error
	n := 0
	for _, key := range keys {
		s := ipvsService(key, "", 0)
		if !h.IsServicePresent(s) {
			continue
		}
		if err := h.DelService(s); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", key, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
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

// Tools returns the iptables tools (back end and IP family) d writes with.
func (d *Dataplane) Tools() xtables.Backend { return d.runner.Backend }

// Foreign names another IPVS proxy's objects, for removing what it left
// on the node: kube-proxy's (internal/proxymode/kubeproxy).
type Foreign struct {
	// Dummy is the interface that holds its Service addresses.
	Dummy string
	// Sets are the names of its ipsets.
	Sets []string
	// NodePortSets name, among Sets, those that list its NodePorts, with
	// the protocol of each (the bitmap:port sets' entries carry none).
	NodePortSets map[string]model.Protocol
}

// ForeignRemoved is what RemoveForeign removed.
type ForeignRemoved struct {
	// VirtualServers are "proto address:port" of each.
	VirtualServers []string
	Sets           []string
	// Dummy is set if the interface was deleted.
	Dummy bool
}

// Empty reports whether nothing was removed.
func (r ForeignRemoved) Empty() bool {
	return len(r.VirtualServers) == 0 && len(r.Sets) == 0 && !r.Dummy
}

// HoldsForeign reports whether the namespace at netnsPath ("" for the
// caller's) holds f's dummy interface or one of its ipsets. It only reads.
func HoldsForeign(netnsPath string, f Foreign) (bool, error) {
	k, err := openNetlink(netnsPath)
	if err != nil {
		return false, err
	}
	defer k.close()
	if l, err := k.link(f.Dummy); err != nil || l != nil {
		return l != nil, err
	}
	sets, err := k.listSets()
	if err != nil {
		return false, nil // a kernel without ipset holds none
	}
	return slices.ContainsFunc(f.Sets, func(s string) bool { return sets[s] }), nil
}

// RemoveForeign removes what f names in the namespace at netnsPath ("" for
// the caller's): the virtual servers on the addresses of f.Dummy (IPv4 and
// IPv6) or on a port of f.NodePortSets, except those of ours (a frontend
// in our sets: a Service our IPVS dataplane serves is the same kernel
// object); then f.Sets, then f.Dummy. Call it after the rules that use the
// sets are gone: a referenced ipset cannot be destroyed. It succeeds when
// there is nothing to remove, also on a kernel without IPVS or ipset.
func RemoveForeign(ctx context.Context, netnsPath string, f Foreign) (ForeignRemoved, error) {
	var done ForeignRemoved
	if err := ctx.Err(); err != nil {
		return done, err
	}
	k, err := openNetlink(netnsPath)
	if err != nil {
		return done, err
	}
	defer k.close()
	dummy, err := k.link(f.Dummy)
	if err != nil {
		return done, err
	}
	sets, err := k.listSets()
	if err != nil {
		sets = nil
	}
	var errs []error
	ipvsPresent, err := procNetIPVS(netnsPath)
	if err != nil {
		errs = append(errs, err)
	}
	if ipvsPresent {
		vs, err := k.deleteForeignServices(netnsPath, dummy, sets, f)
		done.VirtualServers = vs
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range f.Sets {
		if !sets[s] {
			continue
		}
		if err := k.nl.IpsetDestroy(s); err != nil {
			errs = append(errs, fmt.Errorf("destroy ipset %s: %w", s, err))
			continue
		}
		done.Sets = append(done.Sets, s)
	}
	if dummy != nil {
		if err := k.nl.LinkDel(dummy); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", f.Dummy, err))
		} else {
			done.Dummy = true
		}
	}
	return done, errors.Join(errs...)
}

// deleteForeignServices deletes f's virtual servers and returns them.
func (k *kernel) deleteForeignServices(netnsPath string, dummy netlink.Link, sets map[string]bool, f Foreign) ([]string, error) {
	foreignAddrs := map[netip.Addr]bool{}
	if dummy != nil {
		addrs, err := k.nl.AddrList(dummy, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", f.Dummy, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				foreignAddrs[ip.Unmap()] = true
			}
		}
	}
	type protoPort struct {
		proto model.Protocol
		port  uint16
	}
	nodePorts := map[protoPort]bool{}
	for name, proto := range f.NodePortSets {
		if !sets[name] {
			continue
		}
		res, err := k.nl.IpsetList(name)
		if err != nil {
			return nil, fmt.Errorf("list ipset %s: %w", name, err)
		}
		for _, e := range res.Entries {
			if e.Port != nil {
				nodePorts[protoPort{proto, *e.Port}] = true
			}
		}
	}
	if len(foreignAddrs) == 0 && len(nodePorts) == 0 {
		return nil, nil
	}
	ours := map[vsKey]bool{}
	for _, fam := range families {
		entries, err := k.setEntries(fam, sets)
		if err != nil {
			return nil, err
		}
		for e := range entries {
			if slices.Contains(frontendSets, e.Set) {
				ours[vsKey{Addr: e.IP, Proto: e.Proto, Port: e.Port}] = true
			}
		}
	}
	h, err := libipvs.New(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("IPVS handle: %w", err)
	}
	defer h.Close()
	services, err := h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("list virtual servers: %w", err)
	}
	var deleted []string
	var errs []error
	for _, s := range services {
		a, ok := netip.AddrFromSlice(s.Address)
		if !ok || s.FWMark != 0 {
			continue
		}
		key := vsKey{Addr: a.Unmap(), Proto: model.Protocol(s.Protocol), Port: s.Port}
		if ours[key] || !(foreignAddrs[key.Addr] || nodePorts[protoPort{key.Proto, key.Port}]) {
			continue
		}
		if err := h.DelService(s); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", key, err))
			continue
		}
		deleted = append(deleted, key.String())
	}
	return deleted, errors.Join(errs...)
}
