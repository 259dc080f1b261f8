package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// realtimeFile says 1 on a PREEMPT_RT kernel; it is absent elsewhere.
var realtimeFile = "/sys/kernel/realtime"

// nexthopSharing says how far new flows of a family (v6 for IPv6) to one
// backend may share the next hop that the first of them found in the same
// second (bpf/lib/nexthop.h), and why not further. The programs key a
// shared next hop by everything their FIB lookup is given but the client's
// port, and that port changes the route only where the family hashes
// multipath routes over ports (fib_multipath_hash_policy 1, or 3, whose
// fields may name them) or a routing rule matches a source port: a
// client's flows share unless one of these holds. Every client's flows
// share where, besides, the client's address cannot change the route
// either: no routing rule matches source addresses, no route is multipath
// (every hash policy takes the source address) and no IPv6 route is by
// source (from a prefix); the key then leaves the client out. None on a
// PREEMPT_RT kernel, where a program may be preempted by another on its
// CPU and so meet a slot of the per-CPU cache half written. It reads the
// namespace of the calling thread; nl must be a handle in the same one.
func nexthopSharing(nl *netlink.Handle, sys sysctl.Sysctl, v6 bool) (loader.NexthopShare, string, error) {
	if rt, err := sysctl.ReadIntFile(realtimeFile); err == nil && rt == 1 {
		return loader.NexthopShareOff, "a PREEMPT_RT kernel (" + realtimeFile + ")", nil
	}
	name, family := "net/ipv4/fib_multipath_hash_policy", netlink.FAMILY_V4
	if v6 {
		name, family = "net/ipv6/fib_multipath_hash_policy", netlink.FAMILY_V6
	}
	policy, err := sys.GetInt(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A kernel without multipath routes has no such parameter.
	case err != nil:
		return loader.NexthopShareOff, "", fmt.Errorf("read %s: %w", name, err)
	case policy == 1 || policy == 3:
		return loader.NexthopShareOff, fmt.Sprintf("%s is %d: multipath routes are chosen by ports", name, policy), nil
	}
	rules, err := nl.RuleList(family)
	if err != nil {
		return loader.NexthopShareOff, "", fmt.Errorf("list routing rules: %w", err)
	}
	for _, r := range rules {
		if r.Sport != nil {
			return loader.NexthopShareOff, fmt.Sprintf("routing rule %d (table %d) matches source ports", r.Priority, r.Table), nil
		}
	}
	for _, r := range rules {
		if r.Src != nil {
			return loader.NexthopShareClient, fmt.Sprintf("routing rule %d (table %d) matches source addresses (from %s)", r.Priority, r.Table, r.Src), nil
		}
	}
	why, err := routesBySource(family)
	if err != nil {
		return loader.NexthopShareOff, "", err
	}
	if why != "" {
		return loader.NexthopShareClient, why, nil
	}
	return loader.NexthopShareAll, "", nil
}

// rtaNHID is RTA_NH_ID (linux/rtnetlink.h): a route through a nexthop
// object, which may be a group.
const rtaNHID = 30

// routesBySource says which route of family, in any table of the calling
// thread's namespace, may be chosen by the source address, or "" if none
// may: a multipath route, one through a nexthop group, or one by source
// (an IPv6 route from a prefix). The netlink library's routes carry
// neither the source prefix nor the nexthop object, so the dump is read
// here.
func routesBySource(family int) (string, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
	msg := nl.NewRtMsg()
	msg.Family = uint8(family)
	msg.Table = unix.RT_TABLE_UNSPEC
	msg.Protocol, msg.Scope, msg.Type = 0, 0, 0
	req.AddData(msg)
	var why string
	nhids := map[uint32]string{}
	var parseErr error
	err := req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWROUTE, func(m []byte) bool {
		rt := nl.DeserializeRtMsg(m)
		if int(rt.Family) != family || rt.Flags&unix.RTM_F_CLONED != 0 {
			return true
		}
		attrs, err := nl.ParseRouteAttr(m[rt.Len():])
		if err != nil {
			parseErr = err
			return false
		}
		dst := "default"
		for _, a := range attrs {
			if a.Attr.Type == unix.RTA_DST {
				if ip, ok := netip.AddrFromSlice(a.Value); ok {
					dst = netip.PrefixFrom(ip.Unmap(), int(rt.Dst_len)).String()
				}
			}
		}
		where := fmt.Sprintf("route %s (table %d)", dst, routeTable(rt, attrs))
		if rt.Src_len > 0 {
			why = where + " is by source"
			return false
		}
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.RTA_MULTIPATH:
				why = where + " is multipath: its hash takes the source address"
				return false
			case rtaNHID:
				if len(a.Value) == 4 {
					nhids[nl.NativeEndian().Uint32(a.Value)] = where
				}
			}
		}
		return true
	})
	if err == nil {
		err = parseErr
	}
	if err != nil {
		return "", fmt.Errorf("list routes: %w", err)
	}
	if why != "" || len(nhids) == 0 {
		return why, nil
	}
	groups, err := nexthopGroups()
	if err != nil {
		return "", err
	}
	for id, where := range nhids {
		if groups[id] {
			return fmt.Sprintf("%s is through nexthop group %d: its hash takes the source address", where, id), nil
		}
	}
	return "", nil
}

// routeTable is a route's table: RTA_TABLE where the header's byte cannot
// hold it.
func routeTable(rt *nl.RtMsg, attrs []syscall.NetlinkRouteAttr) uint32 {
	for _, a := range attrs {
		if a.Attr.Type == unix.RTA_TABLE && len(a.Value) == 4 {
			return nl.NativeEndian().Uint32(a.Value)
		}
	}
	return uint32(rt.Table)
}

// nexthopGroups are the IDs of the nexthop objects of the calling
// thread's namespace that are groups (multipath).
func nexthopGroups() (map[uint32]bool, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEXTHOP, unix.NLM_F_DUMP)
	req.AddData(nhmsg{})
	groups := map[uint32]bool{}
	var parseErr error
	err := req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWNEXTHOP, func(m []byte) bool {
		if len(m) < nhmsgLen {
			return true
		}
		attrs, err := nl.ParseRouteAttr(m[nhmsgLen:])
		if err != nil {
			parseErr = err
			return false
		}
		var id uint32
		group := false
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.NHA_ID:
				if len(a.Value) == 4 {
					id = nl.NativeEndian().Uint32(a.Value)
				}
			case unix.NHA_GROUP:
				group = true
			}
		}
		if group {
			groups[id] = true
		}
		return true
	})
	if err == nil {
		err = parseErr
	}
	if err != nil {
		return nil, fmt.Errorf("list nexthop objects: %w", err)
	}
	return groups, nil
}

// nhmsgLen is the size of struct nhmsg (linux/nexthop.h): family, scope,
// protocol, a pad byte and 32 bits of flags.
const nhmsgLen = 8

// nhmsg is a nexthop dump's header: every field zero, all families.
type nhmsg struct{}

func (nhmsg) Len() int          { return nhmsgLen }
func (nhmsg) Serialize() []byte { return make([]byte, nhmsgLen) }
