package main

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// addDumpFlags registers dump's flags.
func addDumpFlags(fs *pflag.FlagSet, bpffs *string) {
	fs.StringVar(bpffs, "bpffs-path", loader.DefaultBPFFSPath, "Directory on a bpf filesystem where the agent pinned its maps.")
}

// runDump prints the pinned maps under bpffs in the canonical sorted form,
// for debugging a node (`ebpf-proxy dump [--bpffs-path DIR]`), and returns
// the exit code.
func runDump(bpffs string, stdout, stderr io.Writer) int {
	sm, err := loader.OpenPinnedSockMaps(bpffs)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer sm.Close()
	lines, err := maps.Dump(maps.KernelMaps(sm))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	// The IPv6 maps number their ids apart from the IPv4 ones: a header
	// keeps "backend 1" of one family from reading as the other's.
	lines6, err := maps.Dump6(maps.KernelMaps6(sm))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if len(lines6) > 0 {
		lines = append(append(lines, "# IPv6"), lines6...)
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return 0
}
