package main

import (
	"encoding/json"
	"fmt"
	"os"
)

// scaleRun is one run of test/e2e/bench's BenchmarkScale, as it writes
// it to EBPF_PROXY_BENCH_JSON.
type scaleRun struct {
	Services  int           `json:"services"`
	Endpoints int           `json:"endpoints"`
	LoadTime  float64       `json:"load_s"`
	Results   []scaleResult `json:"results"`
	// file is the run's file name, meta what its NAME.meta says.
	file string
	meta meta
}

// scaleResult is one proxy's figures in a scale run.
type scaleResult struct {
	Proxy         string  `json:"proxy"`
	StartToSynced float64 `json:"start_to_synced_s"`
	FirstSync     float64 `json:"first_sync_s"`
	PeakRSSSynced float64 `json:"peak_rss_synced_mib"`
	PeakRSSEnd    float64 `json:"peak_rss_end_mib"`
	ChangeP50     float64 `json:"change_p50_ms"`
	ChangeP99     float64 `json:"change_p99_ms"`
	SyncPerChange float64 `json:"sync_per_change_ms"`
	Changes       int     `json:"changes"`
	NewP50        float64 `json:"new_service_p50_ms"`
	NewP99        float64 `json:"new_service_p99_ms"`
	NewServices   int     `json:"new_services"`
	Note          string  `json:"note"`

	// The peaks of the proxy's own memory cgroup (its pages and the
	// kernel memory it caused) and of their kernel part; zero in runs
	// from before they were measured, and the kernel part on cgroup v2.
	CgroupPeakSynced  float64 `json:"cgroup_peak_synced_mib"`
	CgroupPeakEnd     float64 `json:"cgroup_peak_end_mib"`
	CgroupKmemPeakEnd float64 `json:"cgroup_kmem_peak_end_mib"`
}

func readScale(path string) (scaleRun, error) {
	var s scaleRun
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	// 0 Services is a run: the proxies with the probe Service alone.
	if s.Services < 0 || len(s.Results) == 0 {
		return s, fmt.Errorf("%s: a negative Service count or no results", path)
	}
	return s, nil
}

// figures are the targets' figures this run measured (the BPF mode's, at
// 10 endpoints per Service).
func (s scaleRun) figures() map[string]float64 {
	got := map[string]float64{}
	for _, r := range s.Results {
		if r.Proxy != "ebpf" || s.Endpoints != 10 {
			continue
		}
		switch s.Services {
		case 100:
			if r.CgroupPeakEnd > 0 {
				got["mem_100_cgroup"] = r.CgroupPeakEnd
			}
		case 10000:
			got["rss_10k"] = r.PeakRSSEnd
			if r.NewServices > 0 {
				got["new_service_p99"] = r.NewP99
			}
		case 30000:
			got["svc30k_programmed"] = r.StartToSynced
			got["svc30k_rss"] = r.PeakRSSEnd
			if r.Changes > 0 {
				got["svc30k_change_p99"] = r.ChangeP99
			}
		}
	}
	return got
}

// result returns proxy's result in s.
func (s scaleRun) result(proxy string) (scaleResult, bool) {
	for _, r := range s.Results {
		if r.Proxy == proxy {
			return r, true
		}
	}
	return scaleResult{}, false
}

// memVsIPTables is the BPF mode's memory cgroup peak over upstream
// iptables mode's in run s, if both were measured.
func (s scaleRun) memVsIPTables() (float64, bool) {
	e, ok1 := s.result("ebpf")
	i, ok2 := s.result("iptables")
	if !ok1 || !ok2 || e.CgroupPeakEnd <= 0 || i.CgroupPeakEnd <= 0 {
		return 0, false
	}
	return e.CgroupPeakEnd / i.CgroupPeakEnd, true
}

// worstMemVsIPTables is mem_vs_iptables over runs: the largest of their
// ratios (scaleRun.memVsIPTables) at 10 endpoints per Service, and the
// index of the run it comes from; false when no run has one.
func worstMemVsIPTables(runs []scaleRun) (float64, int, bool) {
	worst, at := 0.0, -1
	for i, s := range runs {
		if s.Endpoints != 10 {
			continue
		}
		if v, ok := s.memVsIPTables(); ok && (at < 0 || v > worst) {
			worst, at = v, i
		}
	}
	return worst, at, at >= 0
}

// proxyLabel is how the report names a proxy of the scale and packet rate
// runs.
func proxyLabel(p string) string {
	switch p {
	case "ebpf":
		return "ebpf-proxy (BPF)"
	case "ebpf-nftables":
		return "ebpf-proxy nftables"
	case "ebpf-iptables":
		return "ebpf-proxy iptables"
	case "iptables":
		return "kube-proxy iptables"
	case "nftables":
		return "kube-proxy nftables"
	}
	return p
}
