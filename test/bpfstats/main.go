// Command bpfstats loads the agent's BPF objects into the running kernel,
// attaching and pinning nothing, and prints what each program costs the
// verifier and the kernel: its instructions in the object, the
// instructions the verifier processed to accept it, and its translated
// and JITed sizes, and the time and memory the kernel took to verify it.
// It measures changes to bpf/ (make bpf-stats runs it on this machine's
// kernel and in the VM runner's guests). The hash maps are made small:
// their capacity changes no program, and the guests have little memory.
//
// Each program is loaded on its own, from a memory cgroup of the
// command's (cgroup v1's memory hierarchy, or v2's where it has the memory
// controller and memory.peak can be reset, kernel 6.12 on), so that the
// memory its verification charged is the cgroup's peak during the load
// less its usage after it: what the agent's container must have room for
// while it loads, on kernels whose verifier charges its memory to the
// loading process's cgroup (a "-" where no such cgroup could be made; 0
// where the kernel charges nothing).
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

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
	mc, err := newMemoryCgroup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bpfstats: the verifier's memory is not measured: %v\n", err)
	} else {
		defer mc.remove()
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "object\tprogram\tinstructions\tverified\ttranslated B\tJITed B\tload ms\tverifier MiB\t")
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
		names := make([]string, 0, len(spec.Programs))
		for n := range spec.Programs {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			row, err := loadOne(spec, n, mc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s/%s: %w", o.name, n, err))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t\n", o.name, n, len(spec.Programs[n].Instructions), row)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// loadOne loads program name of spec alone, with the maps it uses, and
// returns the rest of its row: verified instructions, translated and
// JITed sizes, load time and the verifier's memory.
func loadOne(spec *ebpf.CollectionSpec, name string, mc *memoryCgroup) (string, error) {
	one := spec.Copy()
	for n := range one.Programs {
		if n != name {
			delete(one.Programs, n)
		}
	}
	// The maps first, so that the peak below is the program's load.
	maps := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range maps {
			m.Close()
		}
	}()
	for n, ms := range one.Maps {
		if strings.HasPrefix(n, ".") {
			continue // a data section: the collection makes and freezes it
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			return "", fmt.Errorf("map %s: %w", n, err)
		}
		maps[n] = m
	}
	if err := mc.resetPeak(); err != nil {
		return "", err
	}
	start := time.Now()
	coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{MapReplacements: maps})
	took := time.Since(start)
	if err != nil {
		return "", err
	}
	defer coll.Close()
	verifier := "-"
	if mc != nil {
		peak, err := mc.read(mc.peak)
		if err != nil {
			return "", err
		}
		usage, err := mc.read(mc.usage)
		if err != nil {
			return "", err
		}
		verifier = fmt.Sprintf("%.1f", float64(peak-min(usage, peak))/(1<<20))
	}
	info, err := coll.Programs[name].Info()
	if err != nil {
		return "", err
	}
	verified, _ := info.VerifiedInstructions()
	xlated, _ := info.TranslatedSize()
	jited, _ := info.JitedSize()
	return fmt.Sprintf("%d\t%d\t%d\t%d\t%s", verified, xlated, jited, took.Milliseconds(), verifier), nil
}

// memoryCgroup is the memory cgroup bpfstats runs in.
type memoryCgroup struct {
	dir, home   string
	usage, peak string
}

// newMemoryCgroup makes a memory cgroup and moves this process into it.
func newMemoryCgroup() (*memoryCgroup, error) {
	name := fmt.Sprintf("ebpf-proxy-bpfstats-%d", os.Getpid())
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var mc *memoryCgroup
	var root, prefix string
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.max_usage_in_bytes"); err == nil {
		root, prefix = "/sys/fs/cgroup/memory", ":memory:"
		mc = &memoryCgroup{usage: "memory.usage_in_bytes", peak: "memory.max_usage_in_bytes"}
	} else if ctl, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && strings.Contains(string(ctl), "memory") {
		root, prefix = "/sys/fs/cgroup", "0::"
		mc = &memoryCgroup{usage: "memory.current", peak: "memory.peak"}
	} else {
		return nil, errors.New("neither cgroup v1's memory hierarchy nor cgroup v2's memory controller is mounted")
	}
	for _, line := range strings.Split(string(self), "\n") {
		if i := strings.Index(line, prefix); i >= 0 && (prefix != "0::" || strings.HasPrefix(line, prefix)) {
			mc.home = filepath.Join(root, line[i+len(prefix):])
		}
	}
	if mc.home == "" {
		return nil, fmt.Errorf("/proc/self/cgroup names no memory cgroup of this process")
	}
	mc.dir = filepath.Join(root, name)
	if err := os.Mkdir(mc.dir, 0o755); err != nil {
		return nil, err
	}
	if err := mc.resetPeak(); err != nil {
		os.Remove(mc.dir)
		return nil, fmt.Errorf("reset the peak (kernel 6.12 on, for cgroup v2): %w", err)
	}
	if err := os.WriteFile(filepath.Join(mc.dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.Remove(mc.dir)
		return nil, err
	}
	return mc, nil
}

// resetPeak makes the cgroup's peak its usage now.
func (mc *memoryCgroup) resetPeak() error {
	if mc == nil {
		return nil
	}
	return os.WriteFile(filepath.Join(mc.dir, mc.peak), []byte("0"), 0o644)
}

// read is the number in the cgroup's file.
func (mc *memoryCgroup) read(file string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(mc.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// remove moves this process back to where it was and removes the cgroup.
func (mc *memoryCgroup) remove() {
	if err := os.WriteFile(filepath.Join(mc.home, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "bpfstats: leave the memory cgroup: %v\n", err)
		return
	}
	os.Remove(mc.dir)
}
