package testbed

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/procstat"
)

// Usage is what a process holds of the node's resources at one moment, as
// a DaemonSet's requests and limits count them.
type Usage struct {
	// RSS and PeakRSS are the resident set size now and its peak
	// (VmRSS, VmHWM), in bytes.
	RSS, PeakRSS uint64
	// FDs is the number of open file descriptors.
	FDs int
	// FDKinds counts the open descriptors by what they are: a file's path,
	// or the kind of an anonymous one ("socket", "pipe",
	// "anon_inode:bpf-map"), without the inode number.
	FDKinds map[string]int
	// Threads is the number of threads.
	Threads int
	// CPU is the processor time used so far, user and system.
	CPU time.Duration
	// MapBytes is the kernel memory of the BPF maps the process holds a
	// descriptor of (their memlock), each map counted once: on a node
	// with cgroup v2 it is charged to the cgroup of the process that made
	// the map, the agent's container.
	MapBytes uint64
	// Maps is the number of those maps.
	Maps int
}

// ProcessUsage reads the usage of process pid from /proc.
func ProcessUsage(pid int) (Usage, error) {
	var u Usage
	dir := fmt.Sprintf("/proc/%d", pid)
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return u, err
	}
	fields := map[string]*uint64{"VmRSS:": &u.RSS, "VmHWM:": &u.PeakRSS}
	found := 0
	for line := range strings.SplitSeq(string(status), "\n") {
		key, rest, _ := strings.Cut(line, "\t")
		if dst, ok := fields[key]; ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return u, fmt.Errorf("parse %s %q: %w", key, rest, err)
			}
			*dst = kb << 10
			found++
		}
		if key == "Threads:" {
			if u.Threads, err = strconv.Atoi(strings.TrimSpace(rest)); err != nil {
				return u, fmt.Errorf("parse Threads %q: %w", rest, err)
			}
		}
	}
	if found != len(fields) {
		return u, fmt.Errorf("no VmRSS or VmHWM in %s/status", dir)
	}
	st, ok, err := procstat.Read(pid)
	if err != nil {
		return u, err
	}
	if !ok {
		return u, fmt.Errorf("parse %s/stat", dir)
	}
	u.CPU = st.CPU()
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		return u, err
	}
	u.FDs = len(fds)
	u.FDKinds = map[string]int{}
	seen := map[string]bool{}
	for _, fd := range fds {
		info, err := os.ReadFile(filepath.Join(dir, "fdinfo", fd.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // closed meanwhile
		}
		if err != nil {
			return u, err
		}
		if target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil {
			u.FDKinds[fdKind(target, info)]++
		}
		id, memlock := fdinfoField(info, "map_id:"), fdinfoField(info, "memlock:")
		if id == "" || memlock == "" || seen[id] {
			continue
		}
		seen[id] = true
		n, err := strconv.ParseUint(memlock, 10, 64)
		if err != nil {
			return u, fmt.Errorf("parse memlock %q of fd %s: %w", memlock, fd.Name(), err)
		}
		u.MapBytes += n
	}
	u.Maps = len(seen)
	return u, nil
}

// fdKind is what the target of a /proc/<pid>/fd link names, without the
// inode number of an anonymous one ("socket:[1234]" is "socket"), and for
// a BPF map, program or link, with its name or type from the kernel
// ("anon_inode:bpf-map lb4_services_v1"), so that a leak says what leaks.
func fdKind(target string, info []byte) string {
	if i := strings.Index(target, ":["); i > 0 && strings.HasSuffix(target, "]") {
		return target[:i]
	}
	if id, err := strconv.ParseUint(fdinfoField(info, "map_id:"), 10, 32); err == nil {
		if m, err := ebpf.NewMapFromID(ebpf.MapID(id)); err == nil {
			defer m.Close()
			if mi, err := m.Info(); err == nil {
				return target + " " + mi.Name
			}
		}
	}
	if id, err := strconv.ParseUint(fdinfoField(info, "prog_id:"), 10, 32); err == nil {
		if p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id)); err == nil {
			defer p.Close()
			if pi, err := p.Info(); err == nil {
				return target + " " + pi.Name
			}
		}
	}
	if lt := fdinfoField(info, "link_type:"); lt != "" {
		return target + " " + lt
	}
	return target
}

// FDGrowth lists the kinds of descriptors of which later holds more than
// earlier, as "kind +n", most first.
func FDGrowth(earlier, later Usage) []string {
	type grown struct {
		kind string
		n    int
	}
	var gs []grown
	for k, n := range later.FDKinds {
		if d := n - earlier.FDKinds[k]; d > 0 {
			gs = append(gs, grown{k, d})
		}
	}
	slices.SortFunc(gs, func(a, b grown) int { return cmp.Or(b.n-a.n, strings.Compare(a.kind, b.kind)) })
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = fmt.Sprintf("%s +%d", g.kind, g.n)
	}
	return out
}

// fdinfoField returns the value of field key ("map_id:") of an fdinfo
// file, or "".
func fdinfoField(info []byte, key string) string {
	for line := range strings.SplitSeq(string(info), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// MiB renders a size in bytes in mebibytes, one decimal.
func MiB(n uint64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) }
