package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

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
	sm, err := loader.OpenPinnedSockMaps(*bpffs)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer sm.Close()
	lines, err := maps.Dump(maps.KernelMaps(sm))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The IPv6 maps number their ids apart from the IPv4 ones: a header
	// keeps "backend 1" of one family from reading as the other's.
	lines6, err := maps.Dump6(maps.KernelMaps6(sm))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if len(lines6) > 0 {
		lines = append(append(lines, "# IPv6"), lines6...)
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	return 0
}
