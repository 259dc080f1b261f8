package loader

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// OpenPinnedSockMaps opens, read-only, the socket load balancer's maps an
// agent pinned under bpffsPath, for inspecting a node (ebpf-proxy dump)
// without loading anything. The caller closes them.
func OpenPinnedSockMaps(bpffsPath string) (*bpfobj.SockMaps, error) {
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpffsPath, "maps", name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		return m, nil
	}
	var sm bpfobj.SockMaps
	var err error
	for _, p := range []struct {
		name string
		dst  **ebpf.Map
	}{
		{bpfobj.SockMapLb4ServicesV1, &sm.Lb4ServicesV1},
		{bpfobj.SockMapLb4BackendsV1, &sm.Lb4BackendsV1},
		{bpfobj.SockMapLb4RevnatV1, &sm.Lb4RevnatV1},
		{bpfobj.SockMapLb4MembersV1, &sm.Lb4MembersV1},
	} {
		if *p.dst, err = open(p.name); err != nil {
			sm.Close()
			return nil, err
		}
	}
	// Maps of an agent older than source ranges lack this one.
	if m, err := open(bpfobj.SockMapLb4SourceRangesV1); err == nil {
		sm.Lb4SourceRangesV1 = m
	}
	// Those of an agent older than IPv6 lack the IPv6 maps: all of them or
	// none are opened (maps.KernelMaps6 gives nil maps then).
	v6 := []struct {
		name string
		dst  **ebpf.Map
	}{
		{bpfobj.SockMapLb6ServicesV1, &sm.Lb6ServicesV1},
		{bpfobj.SockMapLb6BackendsV1, &sm.Lb6BackendsV1},
		{bpfobj.SockMapLb6RevnatV1, &sm.Lb6RevnatV1},
		{bpfobj.SockMapLb6MembersV1, &sm.Lb6MembersV1},
		{bpfobj.SockMapLb6SourceRangesV1, &sm.Lb6SourceRangesV1},
	}
	for i, p := range v6 {
		if *p.dst, err = open(p.name); err != nil {
			for _, q := range v6[:i] {
				(*q.dst).Close()
				*q.dst = nil
			}
			break
		}
	}
	return &sm, nil
}

// OpenPinnedMap opens, read-only, the map name an agent pinned under
// bpffsPath (ebpf-proxy dump's views of the conntrack, affinity and Maglev
// maps). The caller closes it.
func OpenPinnedMap(bpffsPath, name string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffsPath, "maps", name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", name, err)
	}
	return m, nil
}

// Pinned says whether bpffsPath holds pinned maps of an agent: an earlier
// agent's, which a new one adopts.
func Pinned(bpffsPath string) bool {
	entries, err := os.ReadDir(mapsDir(bpffsPath))
	return err == nil && len(entries) > 0
}
