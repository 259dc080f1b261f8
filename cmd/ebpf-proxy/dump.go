package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/spf13/pflag"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// runDump prints the pinned maps in the canonical sorted form, for
// debugging a node: `ebpf-proxy dump [--bpffs-path DIR]`.
func runDump(args []string) int {
	fs := pflag.NewFlagSet("ebpf-proxy dump", pflag.ContinueOnError)
	bpffs := fs.String("bpffs-path", loader.DefaultBPFFSPath, "Directory on a bpf filesystem where the agent pinned its maps.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(*bpffs, "maps", name), &ebpf.LoadPinOptions{ReadOnly: true})
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
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	// Maps of an agent older than source ranges lack this one.
	if m, err := open(bpfobj.SockMapLb4SourceRangesV1); err == nil {
		sm.Lb4SourceRangesV1 = m
	}
	defer sm.Close()
	lines, err := maps.Dump(maps.KernelMaps(&sm))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	return 0
}
