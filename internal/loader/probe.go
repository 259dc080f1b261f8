package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// Features are the kernel capabilities the loader found.
type Features struct {
	// SetRetval lets a refused connect() report ECONNREFUSED rather than
	// EPERM (bpf_set_retval in cgroup sock_addr programs).
	SetRetval bool
}

// ErrUnsupported is returned (wrapped) when the kernel lacks something the
// socket programs cannot do without.
var ErrUnsupported = errors.New("kernel lacks a required BPF feature")

// Probe checks, with real probe programs rather than kernel versions, that
// the socket load balancer can run here.
func Probe() (Features, error) {
	var f Features
	if err := features.HaveProgramType(ebpf.CGroupSockAddr); err != nil {
		return f, fmt.Errorf("%w: cgroup sock_addr programs: %w", ErrUnsupported, err)
	}
	for _, h := range []asm.BuiltinFunc{asm.FnGetSocketCookie, asm.FnGetPrandomU32, asm.FnMapLookupElem, asm.FnMapUpdateElem} {
		if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, h); err != nil {
			return f, fmt.Errorf("%w: helper %s in cgroup sock_addr programs: %w", ErrUnsupported, h, err)
		}
	}
	// loadBalancerSourceRanges for the node's own sockets: the socket
	// hooks tag a socket, a cgroup_skb egress program reads the tag.
	for _, pt := range []ebpf.ProgramType{ebpf.CGroupSockAddr, ebpf.CGroupSKB} {
		if err := features.HaveProgramHelper(pt, asm.FnSkStorageGet); err != nil {
			return f, fmt.Errorf("%w: helper %s in %s programs: %w", ErrUnsupported, asm.FnSkStorageGet, pt, err)
		}
	}
	switch err := features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSetRetval); {
	case err == nil:
		f.SetRetval = true
	case errors.Is(err, ebpf.ErrNotSupported):
	default:
		return f, fmt.Errorf("probe bpf_set_retval: %w", err)
	}
	return f, nil
}
