package bpf

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// realtimeFile says 1 on a PREEMPT_RT kernel; it is absent elsewhere.
var realtimeFile = "/sys/kernel/realtime"

// nexthopSharing says whether a client's new flows of a family (v6 for
// IPv6) to one backend may share the next hop that the first of them
// found in the same second (bpf/lib/nexthop.h), and if not, why not. The
// programs key a shared next hop by everything their FIB lookup is given
// but the client's port, and that port changes the route only where the
// family hashes multipath routes over ports (fib_multipath_hash_policy 1,
// or 3, whose fields may name them) or a routing rule matches a source
// port. Nor on a PREEMPT_RT kernel, where a program may be preempted by
// another on its CPU and so meet a slot of the per-CPU cache half written.
// It reads the namespace of the calling thread; nl must be a handle in the
// same one.
func nexthopSharing(nl *netlink.Handle, sys sysctl.Sysctl, v6 bool) (bool, string, error) {
	if rt, err := sysctl.ReadIntFile(realtimeFile); err == nil && rt == 1 {
		return false, "a PREEMPT_RT kernel (" + realtimeFile + ")", nil
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
		return false, "", fmt.Errorf("read %s: %w", name, err)
	case policy == 1 || policy == 3:
		return false, fmt.Sprintf("%s is %d: multipath routes are chosen by ports", name, policy), nil
	}
	rules, err := nl.RuleList(family)
	if err != nil {
		return false, "", fmt.Errorf("list routing rules: %w", err)
	}
	for _, r := range rules {
		if r.Sport != nil {
			return false, fmt.Sprintf("routing rule %d (table %d) matches source ports", r.Priority, r.Table), nil
		}
	}
	return true, "", nil
}
