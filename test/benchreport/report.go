package main

import (
	"fmt"
	"image/color"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/ebpf-proxy/ebpf-proxy/test/benchreport/figures"
)

// pathSeries are the per-packet benchmarks' families, as the chart groups
// them.
var pathSeries = []struct {
	label, prefix, suffix string
}{
	{"XDP IPv4", "BenchmarkXDPPaths/xdp/", "/IPv4"},
	{"XDP IPv6", "BenchmarkXDPPaths/xdp/", "/IPv6"},
	{"TC IPv4", "BenchmarkPaths/ingress/", ""},
	{"TC IPv6", "BenchmarkPathsIPv6/ingress/", ""},
}

// chartPaths are the paths the per-packet chart shows, in order.
var chartPaths = []string{
	"not a frontend",
	"tracked flow, remote backend (SNAT)",
	"reply from a remote backend (SNAT)",
	"new flow, remote backend (SNAT)",
	"new flow, next hop looked up, remote backend (SNAT)",
	"tracked flow, local backend",
}

// pathCost returns a path's ns per packet in series s of run r.
func pathCost(r runOutput, s int, path string) (float64, bool) {
	ps := pathSeries[s]
	name := ps.prefix + strings.ReplaceAll(path, " ", "_") + ps.suffix
	for _, res := range r.results {
		if res.Name == name {
			v, ok := res.Metrics["ns/pkt"]
			return v, ok
		}
	}
	return 0, false
}

// podWays are BenchmarkPodConnectRate's ways, in its order, with what each
// is.
var podWays = []struct{ key, what string }{
	{"direct", "direct: to the pod's own address, from a pod no program sees (the baseline)"},
	{"socket", "socket: to the ClusterIP, translated at connect() (--socket-lb-scope=all)"},
	{"packet", "packet: to the ClusterIP, translated per packet at the pod's device (--socket-lb-scope=node, or opted out)"},
	{"packet_direct", "packet_direct: to the pod's own address from that pod, every packet through the program at its device"},
}

// writePods writes the section of pods translated per packet: the pod
// paths of paths.txt against TC's baseline (baseline.txt), and the
// connection rates of pods.txt.
func writePods(md *strings.Builder, d *data) {
	paths, okPaths := d.run("paths")
	conns, okConns := d.run("pods")
	if !okPaths && !okConns {
		return
	}
	md.WriteString("## Pods translated per packet\n\n")
	md.WriteString("Under `--socket-lb-scope=node`, and for pods opted out of the socket hooks, `tc_pod_ingress` and `tc_egress` at the pod's host-side device translate its Service traffic.\n\n")
	if okPaths {
		base, _ := d.run("baseline")
		fmt.Fprintf(md, "Per packet: the pod paths of `go test ./test/tcpkt -bench Paths`, the median of %d processes; the ratio is the path over a trivial TC program at the same place, timed in turns (`BenchmarkPathsVsBaseline`). Run: %s.\n\n", paths.runsOf(), paths.meta)
		md.WriteString("| path | ns per packet | over TC's baseline |\n|---|---|---|\n")
		for _, res := range paths.results {
			rest, ok := strings.CutPrefix(res.Name, "BenchmarkPaths/pod")
			if !ok {
				continue
			}
			name := "pod" + rest
			ratio := "-"
			for _, b := range base.results {
				if b.Name == "BenchmarkPathsVsBaseline/tc/"+name {
					ratio = fmt.Sprintf("%.2f", b.Metrics["path/baseline"])
				}
			}
			fmt.Fprintf(md, "| %s | %.0f | %s |\n", strings.ReplaceAll(name, "_", " "), res.Metrics["ns/pkt"], ratio)
		}
		md.WriteString("\n")
	}
	if okConns {
		for _, res := range conns.results {
			if res.Name != "BenchmarkPodConnectRate" {
				continue
			}
			fmt.Fprintf(md, "New TCP connections per second from a pod to a pod on its node (connect, read a line, close), `go test ./test/tclb -bench PodConnectRate`: the four ways in alternating rounds; the ratio is the median of the rounds' ratios to direct. Run: %s.\n\n", conns.meta)
			md.WriteString("| way | connections/s | over direct |\n|---|---|---|\n")
			for _, w := range podWays {
				ratio := "1"
				if w.key != "direct" {
					ratio = fmt.Sprintf("%.3f", res.Metrics[w.key+"/direct"])
				}
				fmt.Fprintf(md, "| %s | %.0f | %s |\n", w.what, res.Metrics[w.key+"_conn/s"], ratio)
			}
			md.WriteString("\n")
		}
	}
}

// writeReport writes out/benchmarks.md and out/benchmarks/*.png.
func writeReport(d *data, out string) error {
	imgDir := filepath.Join(out, "benchmarks")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return err
	}
	var md strings.Builder
	md.WriteString("# Benchmarks\n\n")
	md.WriteString("Written by `make bench-report` (test/benchreport) from one run of each benchmark; ")
	md.WriteString("every section names the run it comes from: its date, kernel, machine and load average ")
	md.WriteString("when it ended. Ratios compare rows of the same run. Rerun it to replace this page.\n\n")

	md.WriteString("## Targets\n\n| figure | value | target | met | what | from |\n|---|---|---|---|---|---|\n")
	for _, f := range figures.All {
		if f.Target == 0 {
			continue
		}
		v, ok := d.figures[f.Name]
		val, met := "not measured", "-"
		if ok {
			val = fmt.Sprintf("%.4g %s", v, f.Unit)
			met = map[bool]string{true: "yes", false: "**no**"}[f.Met(v)]
		}
		cmp := "<="
		if f.Higher {
			cmp = ">="
		}
		fmt.Fprintf(&md, "| `%s` | %s | %s %g %s | %s | %s | `%s` |\n", f.Name, val, cmp, f.Target, f.Unit, met, f.Doc, f.Source)
	}
	md.WriteString("\n")

	if r, ok := d.run("paths"); ok {
		if err := plotPaths(r, filepath.Join(imgDir, "paths.png")); err != nil {
			return err
		}
		fmt.Fprintf(&md, "## Per-packet cost of the TC and XDP programs\n\n")
		fmt.Fprintf(&md, "`go test ./test/tcpkt -bench Paths -benchtime 200x`, in %d processes: the kernel's time per packet by BPF_PROG_TEST_RUN, the median of the processes (the same path's cost differs by up to 2x from one process to the next). Run: %s.\n\n",
			r.runsOf(), r.meta)
		md.WriteString("![ns per packet by path](benchmarks/paths.png)\n\n")
		md.WriteString("| path | " + strings.Join(seriesLabels(), " | ") + " |\n|---|---|---|---|---|\n")
		for _, p := range allPaths(r) {
			cells := []string{p}
			for s := range pathSeries {
				if v, ok := pathCost(r, s, p); ok {
					cells = append(cells, fmt.Sprintf("%.0f", v))
				} else {
					cells = append(cells, "-")
				}
			}
			md.WriteString("| " + strings.Join(cells, " | ") + " |\n")
		}
		md.WriteString("\n")
	}

	if r, ok := d.run("families"); ok {
		fmt.Fprintf(&md, "## IPv6 against IPv4, path by path\n\n")
		fmt.Fprintf(&md, "`go test ./test/tcpkt -bench PathsIPv6VsIPv4 -benchtime 200x`, in %d processes: each path timed over both families in turns within one benchmark (pktest.BenchPair), the median of the processes. Run: %s.\n\n",
			r.runsOf(), r.meta)
		md.WriteString("| path | IPv4 ns | IPv6 ns | IPv6/IPv4 |\n|---|---|---|---|\n")
		for _, res := range r.results {
			path, ok := strings.CutPrefix(res.Name, "BenchmarkPathsIPv6VsIPv4/")
			if !ok {
				continue
			}
			fmt.Fprintf(&md, "| %s | %.0f | %.0f | %.2f |\n", strings.ReplaceAll(path, "_", " "),
				res.Metrics["ipv4-ns/pkt"], res.Metrics["ipv6-ns/pkt"], res.Metrics["ipv6/ipv4"])
		}
		md.WriteString("\n")
	}

	if r, ok := d.run("sockets"); ok {
		fmt.Fprintf(&md, "## Socket load balancing\n\n`go test ./test/socklb -bench ConnectRate`. Run: %s.\n\n", r.meta)
		md.WriteString("| benchmark | ClusterIP conn/s | direct conn/s | median ratio | hooks ns per connection |\n|---|---|---|---|---|\n")
		var others []figures.Result
		for _, res := range r.results {
			m := res.Metrics
			if _, ok := m["direct_conn/s"]; !ok {
				others = append(others, res)
				continue
			}
			fmt.Fprintf(&md, "| %s | %.0f | %.0f | %.3f | %.0f |\n", res.Name, m["clusterip_conn/s"], m["direct_conn/s"], m["median_ratio"], m["hook_ns/conn"])
		}
		md.WriteString("\n")
		// The other socket benchmarks report metrics of their own.
		if len(others) > 0 {
			md.WriteString("| benchmark | metrics |\n|---|---|\n")
			for _, res := range others {
				var parts []string
				for _, u := range slices.Sorted(maps.Keys(res.Metrics)) {
					if u != "ns/op" { // the whole benchmark's time
						parts = append(parts, fmt.Sprintf("%.4g %s", res.Metrics[u], u))
					}
				}
				fmt.Fprintf(&md, "| %s | %s |\n", res.Name, strings.Join(parts, ", "))
			}
			md.WriteString("\n")
		}
	}

	writePods(&md, d)

	if r, ok := d.run("pps"); ok {
		rows := ppsRows(r)
		if len(rows) > 0 {
			if err := plotPPS(rows, filepath.Join(imgDir, "pps.png")); err != nil {
				return err
			}
			sentBy := ""
			if r.sentBy != "" {
				sentBy = " Frames sent by " + r.sentBy + ": the row without a proxy is the bound this sets."
			}
			fmt.Fprintf(&md, "## Packets per second through a NodePort\n\n`make bench-pps`: UDP frames generated in the external client's namespace, forwarded by node1 to a pod on node2.%s Run: %s.\n\n", sentBy, r.meta)
			md.WriteString("![packets per second by dataplane](benchmarks/pps.png)\n\n| dataplane | packets/s |\n|---|---|\n")
			for _, row := range rows {
				fmt.Fprintf(&md, "| %s | %.0f |\n", row.name, row.v)
			}
			md.WriteString("\n")
		}
	}

	if len(d.scales) > 0 {
		if err := plotScale(d.scales, "start → all programmed (s)", func(r scaleResult) float64 { return r.StartToSynced },
			filepath.Join(imgDir, "programming.png")); err != nil {
			return err
		}
		if err := plotScale(d.scales, "peak RSS (MiB)", func(r scaleResult) float64 { return r.PeakRSSEnd },
			filepath.Join(imgDir, "rss.png")); err != nil {
			return err
		}
		md.WriteString("## Scale: Services through a real API server\n\n")
		md.WriteString("`make e2e-bench` (test/e2e/bench BenchmarkScale), once per Service count: the Services and EndpointSlices are created through a real kube-apiserver, then each proxy starts on a fresh node namespace.\n\n")
		md.WriteString("![time to program every Service](benchmarks/programming.png)\n\n![peak RSS](benchmarks/rss.png)\n\n")
		md.WriteString("| Services × endpoints | proxy | start → all programmed | first sync | peak RSS | change p50 | change p99 | sync per change | new Service p50 | new Service p99 | run |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range d.scales {
			for _, r := range s.Results {
				// No first sync is the proxy's metric not read (its
				// metrics server did not answer in time), not zero.
				firstSync := "-"
				if r.FirstSync > 0 {
					firstSync = fmt.Sprintf("%.2f s", r.FirstSync)
				}
				// Runs from before the new Services were measured have none.
				n50, n99 := "-", "-"
				if r.NewServices > 0 {
					n50, n99 = fmt.Sprintf("%.1f ms", r.NewP50), fmt.Sprintf("%.1f ms", r.NewP99)
				}
				fmt.Fprintf(&md, "| %d × %d | %s | %.2f s | %s | %.0f MiB | %.1f ms | %.1f ms | %.1f ms | %s | %s | %s |\n", s.Services, s.Endpoints,
					proxyLabel(r.Proxy), r.StartToSynced, firstSync, r.PeakRSSEnd, r.ChangeP50, r.ChangeP99, r.SyncPerChange, n50, n99, s.meta)
			}
		}
		md.WriteString("\n")
	}

	if mem := memoryRuns(d.scales); len(mem) > 0 {
		if err := plotMemory(mem, filepath.Join(imgDir, "memory.png")); err != nil {
			return err
		}
		writeMemory(&md, mem)
	}
	return os.WriteFile(filepath.Join(out, "benchmarks.md"), []byte(md.String()), 0o644)
}

// memoryRuns are the scale runs that measured the proxies' memory
// cgroups.
func memoryRuns(runs []scaleRun) []scaleRun {
	var out []scaleRun
	for _, s := range runs {
		if slices.ContainsFunc(s.Results, func(r scaleResult) bool { return r.CgroupPeakEnd > 0 }) {
			out = append(out, s)
		}
	}
	return out
}

// proxyOrder lists the proxies of runs, those of the BPF mode and upstream
// iptables first (the columns compared), then the others as they come.
func proxyOrder(runs []scaleRun) []string {
	order := []string{"ebpf", "iptables"}
	for _, s := range runs {
		for _, r := range s.Results {
			if !slices.Contains(order, r.Proxy) {
				order = append(order, r.Proxy)
			}
		}
	}
	return slices.DeleteFunc(order, func(p string) bool {
		return !slices.ContainsFunc(runs, func(s scaleRun) bool { _, ok := s.result(p); return ok })
	})
}

// memoryCell is a proxy's cgroup peak and kernel part, as the memory
// table shows them.
func memoryCell(r scaleResult) string {
	switch {
	case r.CgroupPeakEnd <= 0:
		return "-"
	case r.CgroupKmemPeakEnd > 0:
		return fmt.Sprintf("%.0f MiB (kernel %.0f)", r.CgroupPeakEnd, r.CgroupKmemPeakEnd)
	}
	return fmt.Sprintf("%.0f MiB", r.CgroupPeakEnd)
}

// writeMemory writes the memory section: a table of Service counts by
// proxies, each cell the cgroup peak and its kernel part.
func writeMemory(md *strings.Builder, runs []scaleRun) {
	md.WriteString("## Memory: each proxy's own cgroup\n\n")
	md.WriteString("The same runs of `make e2e-bench`: each proxy ran in a memory cgroup of its own, from before its first instruction, with the processes it started (kube-proxy's iptables-restore and nft). ")
	md.WriteString("Its peak, from the proxy's start to the run's end (cgroup v1 `memory.max_usage_in_bytes`, v2 `memory.peak`), counts what peak RSS leaves out: the kernel memory the proxy caused, ")
	md.WriteString("BPF maps for ebpf-proxy, netfilter rules and sets for kube-proxy, as a DaemonSet's memory limit counts it; and the page cache it filled, its binary's included (evicted from the cache before each start, so that every proxy is charged for its own). ")
	md.WriteString("In brackets its kernel part (cgroup v1 `memory.kmem.max_usage_in_bytes`; a peak of its own, not necessarily reached at the same moment). ")
	md.WriteString("0 Services is the proxies with the probe Service alone.\n\n")
	md.WriteString("![memory cgroup peak](benchmarks/memory.png)\n\n")
	proxies := proxyOrder(runs)
	md.WriteString("| Services × endpoints |")
	for _, p := range proxies {
		md.WriteString(" " + proxyLabel(p) + " |")
	}
	md.WriteString(" BPF / iptables | run |\n|---|" + strings.Repeat("---|", len(proxies)+2) + "\n")
	for _, s := range runs {
		fmt.Fprintf(md, "| %d × %d |", s.Services, s.Endpoints)
		for _, p := range proxies {
			cell := "-"
			if r, ok := s.result(p); ok {
				cell = memoryCell(r)
			}
			md.WriteString(" " + cell + " |")
		}
		ratio := "-"
		if v, ok := s.memVsIPTables(); ok {
			ratio = fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(md, " %s | %s |\n", ratio, s.meta)
	}
	md.WriteString("\n")
}

// plotMemory draws one line per proxy: its memory cgroup peak against the
// Service count. The counts are evenly spaced and the peaks on a log
// scale: 0 to 30,000 Services, tens to thousands of MiB.
func plotMemory(runs []scaleRun, file string) error {
	p := plot.New()
	p.Title.Text = "memory cgroup peak against Services (10 endpoints each unless noted)"
	p.X.Label.Text = "Services (the counts run, evenly spaced)"
	p.Y.Label.Text = "memory cgroup peak (MiB, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var ticks []plot.Tick
	for i, s := range runs {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: fmt.Sprint(s.Services)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	var args []any
	for _, proxy := range proxyOrder(runs) {
		var xys plotter.XYs
		for i, s := range runs {
			if r, ok := s.result(proxy); ok && r.CgroupPeakEnd > 0 {
				xys = append(xys, plotter.XY{X: float64(i), Y: r.CgroupPeakEnd})
			}
		}
		if len(xys) > 0 {
			args = append(args, proxyLabel(proxy), xys)
		}
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	p.X.Min -= 0.3
	p.X.Max += 0.3
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(8*vg.Inch, 4.5*vg.Inch, file)
}

func seriesLabels() []string {
	var l []string
	for _, s := range pathSeries {
		l = append(l, s.label+" ns")
	}
	return l
}

// allPaths lists every path of run r, those of the chart first.
func allPaths(r runOutput) []string {
	paths := slices.Clone(chartPaths)
	for _, res := range r.results {
		for _, s := range pathSeries {
			rest, ok := strings.CutPrefix(res.Name, s.prefix)
			if !ok || !strings.HasSuffix(rest, s.suffix) {
				continue
			}
			p := strings.ReplaceAll(strings.TrimSuffix(rest, s.suffix), "_", " ")
			if strings.Contains(p, "/") {
				continue
			}
			if !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	return paths
}

// plotPaths draws the chart's paths as bars grouped by path, one colour per
// series.
func plotPaths(r runOutput, file string) error {
	p := plot.New()
	p.Title.Text = "ns per packet by path (BPF_PROG_TEST_RUN; " + r.meta["kernel"] + ")"
	p.Y.Label.Text = "ns per packet"
	w := vg.Points(14)
	for s := range pathSeries {
		vals := make(plotter.Values, len(chartPaths))
		for i, path := range chartPaths {
			vals[i], _ = pathCost(r, s, path)
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = 0
		bars.Color = plotutil.Color(s)
		bars.Offset = w * vg.Length(2*s-len(pathSeries)+1) / 2
		p.Add(bars)
		p.Legend.Add(pathSeries[s].label, bars)
	}
	// The legend at the top left, over the cheap paths; room above the
	// tallest bar and beside the outer groups.
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(40)
	p.Y.Max *= 1.1
	p.X.Min -= 0.6
	p.X.Max += 0.6
	// One line per part of a path's name: whole names overlap their
	// neighbours.
	labels := make([]string, len(chartPaths))
	for i, c := range chartPaths {
		labels[i] = strings.ReplaceAll(c, ", ", ",\n")
	}
	p.NominalX(labels...)
	return p.Save(10*vg.Inch, 5*vg.Inch, file)
}

type ppsRow struct {
	name string
	v    float64
}

// ppsRows are the absolute packet rates the pps run printed (bench:
// pps_ROW=N pps), without the ratios.
func ppsRows(r runOutput) []ppsRow {
	var rows []ppsRow
	for name, v := range r.printed {
		row, ok := strings.CutPrefix(name, "pps_")
		if !ok || strings.Contains(row, "_vs_") {
			continue
		}
		rows = append(rows, ppsRow{row, v})
	}
	slices.SortFunc(rows, func(a, b ppsRow) int { return strings.Compare(a.name, b.name) })
	return rows
}

func plotPPS(rows []ppsRow, file string) error {
	p := plot.New()
	p.Title.Text = "packets per second through a NodePort to another node"
	p.Y.Label.Text = "packets per second"
	vals := make(plotter.Values, len(rows))
	names := make([]string, len(rows))
	for i, r := range rows {
		vals[i], names[i] = r.v, r.name
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(30))
	if err != nil {
		return err
	}
	bars.LineStyle.Width = 0
	bars.Color = color.RGBA{R: 0x33, G: 0x66, B: 0x99, A: 0xff}
	p.Add(bars)
	p.NominalX(names...)
	return p.Save(8*vg.Inch, 4.5*vg.Inch, file)
}

// plotScale draws one line per proxy: value against the Service count.
func plotScale(runs []scaleRun, ylabel string, value func(scaleResult) float64, file string) error {
	p := plot.New()
	p.Title.Text = ylabel + " against Services (10 endpoints each unless noted)"
	p.X.Label.Text = "Services"
	p.Y.Label.Text = ylabel
	byProxy := map[string]plotter.XYs{}
	var order []string
	for _, s := range runs {
		for _, r := range s.Results {
			if _, ok := byProxy[r.Proxy]; !ok {
				order = append(order, r.Proxy)
			}
			byProxy[r.Proxy] = append(byProxy[r.Proxy], plotter.XY{X: float64(s.Services), Y: value(r)})
		}
	}
	var args []any
	for _, proxy := range order {
		args = append(args, proxyLabel(proxy), byProxy[proxy])
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p.Save(8*vg.Inch, 4.5*vg.Inch, file)
}

// runsOf is how many runs each benchmark of r was the median of (1 when
// they ran once).
func (r runOutput) runsOf() int {
	n := 1
	for _, res := range r.results {
		n = max(n, res.Runs)
	}
	return n
}
