// Command bpfstats loads the agent's BPF objects into the running kernel,
// attaching and pinning nothing, and prints what each program costs the
// verifier and the kernel: its instructions in the object, the
// instructions the verifier processed to accept it, and its translated
// and JITed sizes. It measures changes to bpf/ (make bpf-stats runs it on
// this machine's kernel and in the VM runner's guests). The hash maps are
// made small: their capacity changes no program, and the guests have
// little memory.
package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"text/tabwriter"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// smallMap is the capacity the hash maps are loaded with.
const smallMap = 1024

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bpfstats:", err)
		os.Exit(1)
	}
}

func run() error {
	objects := []struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
	}{{"sock", bpfobj.LoadSock}, {"tc", bpfobj.LoadTc}, {"xdp", bpfobj.LoadXdp}}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "object\tprogram\tinstructions\tverified\ttranslated B\tJITed B\t")
	var errs []error
	for _, o := range objects {
		spec, err := o.load()
		if err != nil {
			return fmt.Errorf("%s: %w", o.name, err)
		}
		for _, ms := range spec.Maps {
			ms.Pinning = ebpf.PinNone
			switch ms.Type {
			case ebpf.Hash, ebpf.LRUHash, ebpf.LPMTrie:
				ms.MaxEntries = min(ms.MaxEntries, smallMap)
			}
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.name, err))
			continue
		}
		names := make([]string, 0, len(coll.Programs))
		for n := range coll.Programs {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			info, err := coll.Programs[n].Info()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s/%s: %w", o.name, n, err))
				continue
			}
			verified, _ := info.VerifiedInstructions()
			xlated, _ := info.TranslatedSize()
			jited, _ := info.JitedSize()
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t\n", o.name, n, len(spec.Programs[n].Instructions), verified, xlated, jited)
		}
		coll.Close()
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return errors.Join(errs...)
}
