package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// The source range check is the cgroup_skb egress program that holds the
// node's own sockets (pods and the node itself) to loadBalancerSourceRanges
// when they reach a LoadBalancer IP: the socket hooks tag such sockets, and
// the program drops their packets from a source address outside the ranges.
// It runs for every packet the cgroup's sockets send, so it is attached only
// while some Service has source ranges (SetSourceRangeCheck); its link is
// pinned like the others, so that it survives the agent.

// sourceRangeLinkPin is where the egress program's link is pinned.
func sourceRangeLinkPin(bpffs string) string {
	return filepath.Join(linksDir(bpffs), bpfobj.SockProgCgEgress4)
}

// adoptSourceRangeCheck takes over the egress link an earlier agent pinned
// for this cgroup, with the new program in it: sockets that agent tagged
// stay checked until the first sync decides whether the check is needed.
func (l *Loaded) adoptSourceRangeCheck(cgID uint64) error {
	pin := sourceRangeLinkPin(l.bpffs)
	lk, err := adoptLink(pin, cgID)
	if err != nil || lk == nil {
		return err
	}
	if err := lk.Update(l.Objects.CgEgress4); err != nil {
		lk.Close()
		return fmt.Errorf("replace %s in its pinned link: %w", bpfobj.SockProgCgEgress4, err)
	}
	l.egress = lk
	return nil
}

// SetSourceRangeCheck attaches (on) or detaches the egress program that
// enforces loadBalancerSourceRanges for the node's own sockets. Attach it
// before the maps name a LoadBalancer IP with source ranges, so that no
// socket translated to it escapes the check; detach it only once none
// does.
func (l *Loaded) SetSourceRangeCheck(on bool) error {
	if on == (l.egress != nil) {
		return nil
	}
	pin := sourceRangeLinkPin(l.bpffs)
	if !on {
		err := l.egress.Unpin()
		// Closing the last reference detaches the program.
		l.egress.Close()
		l.egress = nil
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin %s: %w", pin, err)
		}
		return nil
	}
	lk, err := link.AttachCgroup(link.CgroupOptions{Path: l.cgroupPath, Attach: ebpf.AttachCGroupInetEgress, Program: l.Objects.CgEgress4})
	if err != nil {
		return fmt.Errorf("attach %s to %s: %w", bpfobj.SockProgCgEgress4, l.cgroupPath, err)
	}
	if err := lk.Pin(pin); err != nil {
		lk.Close()
		return fmt.Errorf("pin link of %s: %w", bpfobj.SockProgCgEgress4, err)
	}
	l.egress = lk
	return nil
}

// SourceRangeCheck says whether the egress program is attached.
func (l *Loaded) SourceRangeCheck() bool { return l.egress != nil }
