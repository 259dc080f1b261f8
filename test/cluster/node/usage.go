package node

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/procstat"
)

// Usage says where the guest's CPU and memory went, in one line: its
// available memory, load average, and the commands that have used the most
// CPU since they started (processes of one name summed). On one emulated
// vCPU a slow step is either a busy neighbour or memory pressure; this
// tells which.
func Usage() string {
	mem, _ := os.ReadFile("/proc/meminfo")
	load, _ := os.ReadFile("/proc/loadavg")
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var procs [][]byte
	for _, p := range stats {
		if b, err := os.ReadFile(p); err == nil {
			procs = append(procs, b)
		}
	}
	return usageLine(mem, load, procs, 6)
}

// usageLine formats Usage from /proc/meminfo, /proc/loadavg and the
// processes' /proc/PID/stat, naming the top commands by CPU time.
func usageLine(meminfo, loadavg []byte, stats [][]byte, top int) string {
	var b strings.Builder
	kb := memInfo(meminfo)
	fmt.Fprintf(&b, "guest: memory available %d of %d MiB", kb["MemAvailable"]/1024, kb["MemTotal"]/1024)
	if f := strings.Fields(string(loadavg)); len(f) >= 3 {
		fmt.Fprintf(&b, ", load %s %s %s", f[0], f[1], f[2])
	}
	type use struct {
		comm  string
		ticks uint64
	}
	by := map[string]uint64{}
	for _, s := range stats {
		if st, ok := procstat.Parse(s); ok {
			by[st.Comm] += st.Ticks
		}
	}
	var uses []use
	for c, t := range by {
		uses = append(uses, use{c, t})
	}
	slices.SortFunc(uses, func(a, b use) int {
		return cmp.Or(cmp.Compare(b.ticks, a.ticks), cmp.Compare(a.comm, b.comm))
	})
	b.WriteString(", CPU s:")
	for i, u := range uses {
		if i == top {
			break
		}
		fmt.Fprintf(&b, " %s %.0f", u.comm, float64(u.ticks)/procstat.ClockTicks)
	}
	return b.String()
}

// memInfo parses /proc/meminfo into kB by field.
func memInfo(b []byte) map[string]uint64 {
	m := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			m[name] = v
		}
	}
	return m
}
