// Package figures names the benchmark figures that have a target, reads
// them from `go test -bench` output, and prints them in the one format
// every benchmark target ends with:
//
//	bench: NAME=VALUE UNIT target=T met=yes|no
//
// so that a reader sees at a glance what is met. Figures without a target
// (the trivial path beside the per-packet costs, absolute rates beside a
// ratio) print without target and met.
package figures

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Figure is one measured quantity and its target.
type Figure struct {
	// Name is the figure's name in bench: lines, e.g. "xdp_miss".
	Name string
	// Unit is the value's unit: "ns", "ratio", "MiB", "s", "ms", "pps".
	Unit string
	// Target is the bound to meet; 0 means none.
	Target float64
	// Higher is true when a value at or above Target meets it, false when
	// a value at or below it does.
	Higher bool
	// Doc says what is measured, for the report.
	Doc string
	// Bench and Metric name where the figure is read from in go test
	// -bench output: the benchmark's full name without the -GOMAXPROCS
	// suffix, and the metric's unit. Empty for figures another program
	// prints itself.
	Bench, Metric string
	// Worst makes Bench a prefix: the figure is the value of Metric that
	// meets the target least among the benchmarks whose names begin with
	// it (each path's ratio, say, and the figure their worst).
	Worst bool
	// Source is the make target that measures the figure.
	Source string
}

// Met says whether v meets f's target (true for a figure without one).
func (f Figure) Met(v float64) bool {
	switch {
	case f.Target == 0:
		return true
	case f.Higher:
		return v >= f.Target
	}
	return v <= f.Target
}

// Line formats v as f's bench: line.
func (f Figure) Line(v float64) string {
	s := fmt.Sprintf("bench: %s=%s %s", f.Name, format(v), f.Unit)
	if f.Target == 0 {
		return s
	}
	met := "no"
	if f.Met(v) {
		met = "yes"
	}
	return fmt.Sprintf("%s target=%s met=%s", s, strconv.FormatFloat(f.Target, 'f', -1, 64), met)
}

// format prints v with the precision its size calls for: ratios with two
// decimals, large numbers without.
func format(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

const (
	xdpPaths  = "BenchmarkXDPPaths/xdp/"
	tcPaths   = "BenchmarkPaths/ingress/"
	tcPaths6  = "BenchmarkPathsIPv6/ingress/"
	basePaths = "BenchmarkPathsVsBaseline/"
)

// All are the figures with targets, in the order they are printed, then
// the figures printed beside them.
var All = []Figure{
	// The per-packet costs, as ratios to a baseline timed in the same
	// process in turns with them, which hold on any machine (the same
	// path's nanoseconds differ three to five times between two machines
	// of this project's kind); the nanoseconds are printed beside them.
	{Name: "xdp_miss_x_base", Unit: "ratio", Target: 1.5, Doc: "xdp_miss over the baseline of the same hook timed in turns with it (BenchmarkPathsVsBaseline): pktest's sample program, which parses the frame and makes one hash lookup, on a frame it has no entry for; a ratio means the same on another machine",
		Bench: basePaths + "xdp/not_a_frontend", Metric: "path/baseline", Source: "make bench"},
	{Name: "xdp_tracked_x_base", Unit: "ratio", Target: 10, Doc: "xdp_tracked over the baseline (see xdp_miss_x_base)",
		Bench: basePaths + "xdp/tracked_flow,_remote_backend_(SNAT)", Metric: "path/baseline", Source: "make bench"},
	{Name: "xdp_new_x_base", Unit: "ratio", Target: 32, Doc: "xdp_new over the baseline (see xdp_miss_x_base)",
		Bench: basePaths + "xdp/new_flow,_remote_backend_(SNAT)", Metric: "path/baseline", Source: "make bench"},
	{Name: "tc_miss_x_base", Unit: "ratio", Target: 1.5, Doc: "tc_miss over the baseline of TC (see xdp_miss_x_base)",
		Bench: basePaths + "tc/ingress/not_a_frontend", Metric: "path/baseline", Source: "make bench"},
	{Name: "tc_tracked_x_base", Unit: "ratio", Target: 10, Doc: "tc_tracked over the baseline (see xdp_miss_x_base)",
		Bench: basePaths + "tc/ingress/tracked_flow,_remote_backend_(SNAT)", Metric: "path/baseline", Source: "make bench"},
	{Name: "tc_tracked_local_x_base", Unit: "ratio", Target: 10, Doc: "tc_tracked_local over the baseline (see xdp_miss_x_base)",
		Bench: basePaths + "tc/ingress/tracked_flow,_local_backend", Metric: "path/baseline", Source: "make bench"},
	{Name: "sock_hook", Unit: "ns", Target: 1000, Doc: "socket hooks per connection (one run of connect4 plus one of getpeername4, the kernel's run-time statistics), 10,000 Services",
		Bench: "BenchmarkConnectRate/services=10000", Metric: "hook_ns/conn", Source: "make bench"},
	{Name: "ipv6_vs_ipv4", Unit: "ratio", Target: 1.25, Doc: "the costliest path's IPv6 ns per packet over its IPv4 one, TC and XDP, each path timed over both families side by side",
		Bench: "BenchmarkPathsIPv6VsIPv4/", Metric: "ipv6/ipv4", Worst: true, Source: "make bench"},
	{Name: "pps_xdp_vs_iptables", Unit: "ratio", Target: 3, Higher: true, Doc: "packets per second forwarded through a NodePort to another node, XDP against upstream iptables",
		Source: "make bench-pps"},
	{Name: "pps_tc_vs_iptables", Unit: "ratio", Target: 1.5, Higher: true, Doc: "the same, TC against upstream iptables",
		Source: "make bench-pps"},
	{Name: "rss_10k", Unit: "MiB", Target: 128, Doc: "the agent's peak RSS with 10,000 Services of 10 endpoints, default settings",
		Source: "make e2e-bench"},
	{Name: "new_service_p99", Unit: "ms", Target: 1000, Doc: "10,000 Services: a new Service and its EndpointSlice, from the Service's create call to the first connection answered through its ClusterIP, p99",
		Source: "make e2e-bench"},
	{Name: "svc30k_programmed", Unit: "s", Target: 3, Doc: "30,000 Services of 10 endpoints: from the agent's start to all programmed",
		Source: "make e2e-bench EBPF_PROXY_BENCH_SERVICES=30000"},
	{Name: "svc30k_rss", Unit: "MiB", Target: 300, Doc: "30,000 Services: the agent's peak RSS",
		Source: "make e2e-bench EBPF_PROXY_BENCH_SERVICES=30000"},
	{Name: "svc30k_change_p99", Unit: "ms", Target: 20, Doc: "30,000 Services: one endpoint change, API write to the first connection answered by the new endpoint, p99",
		Source: "make e2e-bench EBPF_PROXY_BENCH_SERVICES=30000"},
	{Name: "mem_100_cgroup", Unit: "MiB", Target: 64, Doc: "100 Services of 10 endpoints: the peak of the BPF mode's own memory cgroup from its start to the run's end, its pages and the kernel memory it caused (BPF maps)",
		Source: "make e2e-bench EBPF_PROXY_BENCH_SERVICES=100"},
	{Name: "mem_vs_iptables", Unit: "ratio", Target: 1, Doc: "the BPF mode's memory cgroup peak over upstream kube-proxy iptables' (its iptables-restore children and the rules they installed included) in the same run, the largest over the Service counts run",
		Source: "make bench-report"},

	// Beside them, without targets.
	{Name: "xdp_miss", Unit: "ns", Doc: "XDP, a packet to no frontend (what every other packet the node receives pays)",
		Bench: xdpPaths + "not_a_frontend/IPv4", Metric: "ns/pkt", Source: "make bench"},
	{Name: "xdp_tracked", Unit: "ns", Doc: "XDP, a packet of a tracked flow to a remote backend (DNAT and SNAT)",
		Bench: xdpPaths + "tracked_flow,_remote_backend_(SNAT)/IPv4", Metric: "ns/pkt", Source: "make bench"},
	{Name: "xdp_new", Unit: "ns", Doc: "XDP, the first packet of a flow to a remote backend (verdict, selection, tracking, SNAT port), taking the next hop an earlier flow to the backend found in the second, whatever its client (shared, bpf/lib/nexthop.h); with the lookup: xdp_new_lookup",
		Bench: xdpPaths + "new_flow,_remote_backend_(SNAT)/IPv4", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_miss", Unit: "ns", Doc: "TC ingress, a packet to no frontend",
		Bench: tcPaths + "not_a_frontend", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_tracked", Unit: "ns", Doc: "TC ingress, a packet of a tracked flow to a remote backend (DNAT and SNAT)",
		Bench: tcPaths + "tracked_flow,_remote_backend_(SNAT)", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_tracked_local", Unit: "ns", Doc: "TC ingress, a packet of a tracked flow to a backend on the node",
		Bench: tcPaths + "tracked_flow,_local_backend", Metric: "ns/pkt", Source: "make bench"},
	{Name: "pps_bypass_vs_iptables", Unit: "ratio", Doc: "the bound of pps_xdp_vs_iptables and pps_tc_vs_iptables: no proxy, the frames sent to the pod itself past node-a, against upstream iptables; no proxy's ratio can exceed it on this path",
		Source: "make bench-pps"},
	{Name: "xdp_trivial", Unit: "ns", Doc: "XDP, the trivial path (ARP): the floor of the same run",
		Bench: xdpPaths + "not_TCP_or_UDP_(ARP,_neighbour_solicitation)/IPv4", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_trivial", Unit: "ns", Doc: "TC ingress, the trivial path (ARP): the floor of the same run",
		Bench: tcPaths + "not_IPv4", Metric: "ns/pkt", Source: "make bench"},
	{Name: "xdp_tracked_ipv6", Unit: "ns", Doc: "XDP, tracked flow to a remote backend, IPv6",
		Bench: xdpPaths + "tracked_flow,_remote_backend_(SNAT)/IPv6", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_tracked_ipv6", Unit: "ns", Doc: "TC ingress, tracked flow to a remote backend, IPv6",
		Bench: tcPaths6 + "tracked_flow,_remote_backend_(SNAT)", Metric: "ns/pkt", Source: "make bench"},
	{Name: "xdp_new_lookup", Unit: "ns", Doc: "XDP, xdp_new with the next hop looked up: the first flow to its backend in its second on its CPU, or a new client's where the route may depend on the client",
		Bench: xdpPaths + "new_flow,_next_hop_looked_up,_remote_backend_(SNAT)/IPv4", Metric: "ns/pkt", Source: "make bench"},
	{Name: "xdp_new_lookup_ipv6", Unit: "ns", Doc: "xdp_new_lookup over IPv6",
		Bench: xdpPaths + "new_flow,_next_hop_looked_up,_remote_backend_(SNAT)/IPv6", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_new_lookup", Unit: "ns", Doc: "TC ingress, the first packet of a flow to a remote backend with the next hop looked up",
		Bench: tcPaths + "new_flow,_next_hop_looked_up,_remote_backend_(SNAT)", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_new_lookup_ipv6", Unit: "ns", Doc: "tc_new_lookup over IPv6",
		Bench: tcPaths6 + "new_flow,_next_hop_looked_up,_remote_backend_(SNAT)", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_pod_miss", Unit: "ns", Doc: "TC at a pod's device (--socket-lb-scope=node), a pod's packet to no Service: what the rest of such a pod's traffic pays",
		Bench: "BenchmarkPaths/pod/not_to_a_Service", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_pod_miss_x_base", Unit: "ratio", Doc: "tc_pod_miss over the baseline of TC (see xdp_miss_x_base)",
		Bench: basePaths + "tc/pod/not_to_a_Service", Metric: "path/baseline", Source: "make bench"},
	{Name: "tc_pod_new", Unit: "ns", Doc: "TC at a pod's device, the first packet of the pod's flow to a ClusterIP (verdict, selection, tracking)",
		Bench: "BenchmarkPaths/pod/new_flow_to_a_ClusterIP", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_pod_tracked", Unit: "ns", Doc: "TC at a pod's device, a packet of the pod's tracked flow to a ClusterIP (DNAT)",
		Bench: "BenchmarkPaths/pod/tracked_flow_to_a_ClusterIP", Metric: "ns/pkt", Source: "make bench"},
	{Name: "tc_pod_tracked_x_base", Unit: "ratio", Doc: "tc_pod_tracked over the baseline of TC (see xdp_miss_x_base)",
		Bench: basePaths + "tc/pod/tracked_flow_to_a_ClusterIP", Metric: "path/baseline", Source: "make bench"},
	{Name: "tc_pod_reply", Unit: "ns", Doc: "TC egress at a pod's device, the backend's reply to the pod's flow to a ClusterIP, translated back",
		Bench: "BenchmarkPaths/pod_egress/reply_from_the_backend", Metric: "ns/pkt", Source: "make bench"},
	{Name: "pod_conn_packet_vs_direct", Unit: "ratio", Doc: "new TCP connections per second from a pod to a ClusterIP translated per packet (--socket-lb-scope=node), over a pod no program sees reaching the pod directly; alternating rounds, the median ratio",
		Bench: "BenchmarkPodConnectRate", Metric: "packet/direct", Source: "make bench"},
	{Name: "pod_conn_socket_vs_direct", Unit: "ratio", Doc: "the same through the socket programs (--socket-lb-scope=all)",
		Bench: "BenchmarkPodConnectRate", Metric: "socket/direct", Source: "make bench"},
	{Name: "sock_connect_warm", Unit: "ns", Doc: "connect4 to a ClusterIP run back to back (connect() on one UDP socket, no packet), 10,000 Services: the hook without the cache misses a connection's other work causes",
		Bench: "BenchmarkConnectHookWarm/services=10000", Metric: "clusterip_connect4_ns/run", Source: "make bench"},
}

// ByName returns the figure called name.
func ByName(name string) (Figure, bool) {
	for _, f := range All {
		if f.Name == name {
			return f, true
		}
	}
	return Figure{}, false
}

// Print writes name's bench: line for v; it panics on an unknown name, a
// programming error.
func Print(w io.Writer, name string, v float64) {
	f, ok := ByName(name)
	if !ok {
		panic("figures: unknown figure " + name)
	}
	fmt.Fprintln(w, f.Line(v))
}

// Result is one benchmark's line of go test -bench output: its name without
// the -GOMAXPROCS suffix, and its metrics by unit.
type Result struct {
	Name    string
	Metrics map[string]float64
	// Runs is how many runs Medians folded into the result (0: one,
	// as parsed).
	Runs int
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// Parse reads go test -bench output and returns every benchmark result in
// it, in order, and every bench: line a benchmark printed itself, by name.
// Other lines are skipped.
func Parse(r io.Reader) ([]Result, map[string]float64, error) {
	var results []Result
	printed := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if name, v, ok := parseLine(line); ok {
			printed[name] = v
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		res := Result{Name: procSuffix.ReplaceAllString(f[0], ""), Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			res.Metrics[f[i+1]] = v
		}
		results = append(results, res)
	}
	return results, printed, sc.Err()
}

// Medians folds the results of a benchmark run several times (-count N)
// into one, each metric the median of its runs (the mean of the middle two
// for an even count): single runs of the per-packet paths vary by up to
// 1.5x between runs on a shared machine. Results keep the order of each
// benchmark's first run; Runs says how many each folded.
func Medians(results []Result) []Result {
	var order []string
	runs := map[string][]Result{}
	for _, r := range results {
		if _, ok := runs[r.Name]; !ok {
			order = append(order, r.Name)
		}
		runs[r.Name] = append(runs[r.Name], r)
	}
	out := make([]Result, 0, len(order))
	for _, name := range order {
		rs := runs[name]
		m := Result{Name: name, Metrics: map[string]float64{}, Runs: len(rs)}
		vals := map[string][]float64{}
		for _, r := range rs {
			for k, v := range r.Metrics {
				vals[k] = append(vals[k], v)
			}
		}
		for k, vs := range vals {
			slices.Sort(vs)
			n := len(vs)
			m.Metrics[k] = vs[n/2]
			if n%2 == 0 {
				m.Metrics[k] = (vs[n/2-1] + vs[n/2]) / 2
			}
		}
		out = append(out, m)
	}
	return out
}

// parseLine reads "bench: NAME=VALUE UNIT ...".
func parseLine(line string) (string, float64, bool) {
	rest, ok := strings.CutPrefix(line, "bench: ")
	if !ok {
		return "", 0, false
	}
	kv, _, _ := strings.Cut(rest, " ")
	name, val, ok := strings.Cut(kv, "=")
	if !ok {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(val, 64)
	if err != nil {
		return "", 0, false
	}
	return name, v, true
}

// Collect returns the value of every figure found in results (the last
// result of a benchmark counts) or among the printed lines, by name.
func Collect(results []Result, printed map[string]float64) map[string]float64 {
	got := map[string]float64{}
	for _, f := range All {
		if v, ok := printed[f.Name]; ok {
			got[f.Name] = v
		}
		if f.Bench == "" {
			continue
		}
		for _, r := range results {
			v, ok := r.Metrics[f.Metric]
			switch {
			case !ok:
			case f.Worst && strings.HasPrefix(r.Name, f.Bench):
				if w, seen := got[f.Name]; !seen || (f.Higher && v < w) || (!f.Higher && v > w) {
					got[f.Name] = v
				}
			case !f.Worst && r.Name == f.Bench:
				got[f.Name] = v
			}
		}
	}
	return got
}
