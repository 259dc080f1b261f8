package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// memRun is a scale run of services Services of 10 endpoints whose proxies'
// memory cgroups peaked at the MiB of peaks (proxy: MiB).
func memRun(services int, peaks map[string]float64) scaleRun {
	s := scaleRun{Services: services, Endpoints: 10}
	for _, p := range []string{"ebpf", "iptables", "nftables"} {
		if v, ok := peaks[p]; ok {
			s.Results = append(s.Results, scaleResult{Proxy: p, CgroupPeakEnd: v})
		}
	}
	return s
}

func TestWorstMemVsIPTables(t *testing.T) {
	for _, c := range []struct {
		name   string
		runs   []scaleRun
		want   float64
		wantAt int
		ok     bool
	}{
		{"the largest ratio, not the last run's", []scaleRun{
			memRun(0, map[string]float64{"ebpf": 30, "iptables": 20}),
			memRun(100, map[string]float64{"ebpf": 40, "iptables": 10}),
			memRun(1000, map[string]float64{"ebpf": 50, "iptables": 100}),
		}, 4, 1, true},
		{"a run without iptables does not count", []scaleRun{
			memRun(100, map[string]float64{"ebpf": 90, "nftables": 10}),
			memRun(1000, map[string]float64{"ebpf": 50, "iptables": 100}),
		}, 0.5, 1, true},
		{"runs from before the cgroups were measured: none", []scaleRun{
			memRun(1000, map[string]float64{"ebpf": 0, "iptables": 0}),
		}, 0, -1, false},
		{"other endpoint counts do not count", []scaleRun{
			{Services: 100, Endpoints: 2, Results: []scaleResult{{Proxy: "ebpf", CgroupPeakEnd: 90}, {Proxy: "iptables", CgroupPeakEnd: 10}}},
		}, 0, -1, false},
	} {
		got, at, ok := worstMemVsIPTables(c.runs)
		if got != c.want || at != c.wantAt || ok != c.ok {
			t.Errorf("%s: %v at run %d, %t; want %v at run %d, %t", c.name, got, at, ok, c.want, c.wantAt, c.ok)
		}
	}
}

// writeJSON writes a scale run's file as test/e2e/bench writes it.
func writeJSON(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// From the files of a run of 0 and one of 100 Services, the report has the
// memory figures, their targets met or not, and the memory table and plot.
func TestReportOfMemory(t *testing.T) {
	in, out := t.TempDir(), t.TempDir()
	writeJSON(t, in, "scale-0.json", `{"services": 0, "endpoints": 10, "results": [
		{"proxy": "ebpf", "peak_rss_end_mib": 20, "cgroup_peak_end_mib": 30, "cgroup_kmem_peak_end_mib": 12},
		{"proxy": "iptables", "peak_rss_end_mib": 25, "cgroup_peak_end_mib": 20, "cgroup_kmem_peak_end_mib": 2}]}`)
	writeJSON(t, in, "scale-100.json", `{"services": 100, "endpoints": 10, "results": [
		{"proxy": "ebpf", "peak_rss_end_mib": 22, "cgroup_peak_end_mib": 48.5, "cgroup_kmem_peak_end_mib": 13},
		{"proxy": "iptables", "peak_rss_end_mib": 30, "cgroup_peak_end_mib": 97, "cgroup_kmem_peak_end_mib": 4}]}`)
	d, err := load(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.figures["mem_100_cgroup"]; got != 48.5 {
		t.Errorf("mem_100_cgroup = %v, want 48.5", got)
	}
	// 30/20 at 0 Services, not 0.5 at 100.
	if got, src := d.figures["mem_vs_iptables"], d.source["mem_vs_iptables"]; got != 1.5 || src != "scale-0.json" {
		t.Errorf("mem_vs_iptables = %v from %s, want 1.5 from scale-0.json", got, src)
	}
	if err := writeReport(d, out); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| `mem_100_cgroup` | 48.5 MiB | <= 64 MiB | yes |",
		"| `mem_vs_iptables` | 1.5 ratio | <= 1 ratio | **no** |",
		"| Services × endpoints | ebpf-proxy (BPF) | kube-proxy iptables | BPF / iptables | run |",
		"| 0 × 10 | 30 MiB (kernel 12) | 20 MiB (kernel 2) | 1.50 |",
		"| 100 × 10 | 48 MiB (kernel 13) | 97 MiB (kernel 4) | 0.50 |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("benchmarks.md lacks %q:\n%s", want, md)
		}
	}
	if fi, err := os.Stat(filepath.Join(out, "benchmarks", "memory.png")); err != nil || fi.Size() == 0 {
		t.Errorf("memory.png: %v", err)
	}
}
