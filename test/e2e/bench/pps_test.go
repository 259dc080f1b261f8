package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/benchreport/figures"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// Settings of BenchmarkNodePortPPS, from the environment.
const (
	envPPSFrames = "EBPF_PROXY_BENCH_PPS_FRAMES"  // frames sent per row, default 2000000
	envPPSLimit  = "EBPF_PROXY_BENCH_PPS_LIMIT"   // time limit of a row's sending, default 30s
	envPPSRounds = "EBPF_PROXY_BENCH_PPS_ROUNDS"  // rounds, interleaved; default 3
	envPPSRows   = "EBPF_PROXY_BENCH_PPS_PROXIES" // default "iptables,nftables,tc,xdp"
)

// ppsBaseline is the row every other is compared with: upstream
// kube-proxy's iptables mode (iptables-legacy), as in BenchmarkNodePortRPS.
const ppsBaseline = "iptables"

// ppsRows are the rows the benchmark knows, the baseline first. The names
// become the bench: lines' pps_<name>.
var ppsRows = []rpsRow{
	{name: ppsBaseline, kind: testbed.KubeProxyIPTables, legacyIPTables: true, label: "kube-proxy iptables (legacy)"},
	{name: "nftables", kind: testbed.KubeProxyNFTables, label: "kube-proxy nftables"},
	{name: "tc", kind: testbed.EbpfProxy, args: []string{"--xdp=off"}, label: "ebpf-proxy TC (XDP off)"},
	{name: "xdp", kind: testbed.EbpfProxy, args: []string{"--xdp=native"}, label: "ebpf-proxy XDP native"},
	{name: "iptables-nft", kind: testbed.KubeProxyIPTables, label: "kube-proxy iptables (nft)"},
	{name: "xdp-generic", kind: testbed.EbpfProxy, args: []string{"--xdp=generic"}, label: "ebpf-proxy XDP generic"},
	{name: "bypass", bypass: true, label: "no proxy: frames to the pod, past node-a (the bound)"},
}

var ppsDefaultRows = []string{ppsBaseline, "nftables", "tc", "xdp", "bypass"}

type ppsConfig struct {
	frames uint64
	limit  time.Duration
	rounds int
	rows   []rpsRow
}

func ppsConfigFromEnv() (ppsConfig, error) {
	cfg := ppsConfig{frames: 2_000_000, limit: 30 * time.Second, rounds: 3}
	frames := int(cfg.frames)
	err := errors.Join(envInt(envPPSFrames, &frames, 1000, 1_000_000_000),
		envDuration(envPPSLimit, &cfg.limit, 10*time.Minute),
		envInt(envPPSRounds, &cfg.rounds, 1, 20))
	if err != nil {
		return cfg, err
	}
	cfg.frames = uint64(frames)
	cfg.rows, err = envRows(envPPSRows, ppsDefaultRows, ppsRows)
	return cfg, err
}

// The benchmark's Service, its address plan and its bounds.
const (
	ppsNamespace  = "pps"
	ppsService    = "pps"
	ppsNodePort   = 30090
	ppsTargetPort = 9090
	ppsPod        = "b1"
	// ppsSourcePort is the generated frames' source port: one flow, so
	// that every dataplane measures its established-flow path.
	ppsSourcePort = 40000
	// ppsWarmupFrames go through before the counted run: the first frames
	// wait for neighbour resolution and create the flow's state.
	ppsWarmupFrames = 50_000
	// ppsChunk is the number of frames of one BPF_PROG_TEST_RUN call; the
	// time limit is checked between calls.
	ppsChunk = 200_000
	// ppsBatch is the live-frames batch size, the kernel's default.
	ppsBatch = 64
	// ppsReadyBound bounds the wait for the first frame to reach the pod.
	ppsReadyBound = time.Minute
	// ppsDrainBound bounds the wait for frames still on their way once the
	// generator returned.
	ppsDrainBound = 2 * time.Second
)

// ppsPayload fills each frame to the minimum Ethernet frame (60 bytes
// before the FCS): 14 + 20 + 8 + 18.
var ppsPayload = []byte("ebpf-proxy pps ben")

// ppsResult is one row's measurement in one round.
type ppsResult struct {
	row   rpsRow
	round int
	// sent is the number of frames the generator transmitted, delivered
	// the number the pod's IP layer delivered, over seconds of sending.
	sent, delivered uint64
	seconds         float64
	// readyAfter is how long the first frame took to reach the pod after
	// the proxies' first sync.
	readyAfter time.Duration
	// seenFrom is the source address the pod saw (the node's, after SNAT).
	seenFrom netip.AddrPort
	// loadBefore and loadAfter are the machine's 1-minute load average.
	loadBefore, loadAfter string
	// events are ebpf-proxy's non-zero TC and XDP counters on node-a.
	events string
	// via says how the generator sent the frames (frameSource.via).
	via string
}

// delivered per second.
func (r ppsResult) rate() float64 {
	if r.seconds <= 0 {
		return 0
	}
	return float64(r.delivered) / r.seconds
}

// BenchmarkNodePortPPS measures packets per second forwarded from a client
// outside the cluster through a NodePort on node-a to the Service's only
// endpoint, a pod on node-b: node-a DNATs and SNATs every packet to node-b.
// No NIC or pktgen is needed: the frames are made in the external client's
// namespace by an XDP program returning XDP_TX, run by BPF_PROG_TEST_RUN in
// live-frames mode (as xdp-trafficgen does), which transmits each frame out
// of the client's veth at the rate the path takes them. They are 64-byte
// UDP frames of one flow; the pod's namespace counts the packets its IP
// layer delivers (Ip InDelivers of its /proc/net/snmp), and a UDP socket
// there keeps them from being answered with ICMP errors. For each proxy of the table in turn,
// on a fresh testbed where every node runs it, the same number of frames is
// sent, bounded in time; rows are interleaved over rounds, and the summary
// gives medians and ratios against upstream kube-proxy's iptables mode of
// the same round, then the bench: lines of issue 16.
//
// On veths, a frame sent with XDP_TX (the generator's, and node-a's in the
// XDP row) is dropped unless the receiving peer runs an XDP program: the
// router's veths facing the client and node-a get one that returns
// XDP_PASS, in every row alike.
//
// What the rate means: a veth hands its frames to its peer's queue on the
// sending CPU, and the kernel processes them there in softirq between the
// generator's batches, hop by hop (router, node-a, router, node-b, pod). So
// the generator runs at the rate of the whole path on about one CPU, and
// frames are rarely lost; a row's rate is 1 / (generator + common hops +
// node-a's NodePort translation and forwarding), and only the last part
// differs between rows. The ratios are therefore smaller than those of
// node-a's own per-packet cost.
//
// The bypass row bounds what any proxy on node-a can reach here: no proxy
// runs, and the frames are addressed to the pod itself, which the router
// sends straight to node-b, so node-a and one of the router's hops cost
// nothing. Its ratio to iptables is more than any proxy's can be.
//
// It asserts no speed; it fails only if traffic does not flow. Run it with
// -benchtime 1x; it measures once whatever b.N is.
func BenchmarkNodePortPPS(b *testing.B) {
	cfg, err := ppsConfigFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	sandbox.RequireRoot(b)
	pass, err := xdpPassProgram()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pass.Close() })
	c := cluster.StartT(b, cluster.Options{})
	if err := createPPSService(b.Context(), c.Clientset()); err != nil {
		b.Fatal(err)
	}
	var results []ppsResult
	for round := range cfg.rounds {
		for _, row := range cfg.rows {
			b.Run(row.name, func(b *testing.B) {
				r := measurePPS(b, c, pass, row, cfg)
				r.round = round
				results = append(results, r)
				b.ReportMetric(r.rate(), "pkt/s")
			})
		}
	}
	table := ppsSummary(cfg, results)
	b.Log("\n" + table)
	fmt.Print(table)
}

// createPPSService creates the UDP NodePort Service and its EndpointSlice
// with the one endpoint, pod b1 on node-b, which the testbed gives the same
// address every time (rpsPodIP).
func createPPSService(ctx context.Context, cs kubernetes.Interface) error {
	if err := builders.CreateNamespace(ctx, cs, ppsNamespace); err != nil {
		return err
	}
	svc := builders.Service(ppsNamespace, ppsService, builders.ClusterIP(""),
		builders.Ports(builders.Port("udp", 90, corev1.ProtocolUDP, intstr.FromInt32(ppsTargetPort))), builders.NodePort(ppsNodePort),
		func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster })
	_, err := builders.CreateService(ctx, cs, svc, builders.SliceFor(svc, builders.Endpoint(rpsPodIP.String(), "node-b")))
	return err
}

// measurePPS runs one row on a fresh testbed.
func measurePPS(b *testing.B, c *cluster.Cluster, pass *ebpf.Program, row rpsRow, cfg ppsConfig) ppsResult {
	r := ppsResult{row: row, loadBefore: loadAverage()}
	tb := testbed.New(b, c, testbed.Options{
		Nodes: []testbed.NodeSpec{
			{Name: "node-a"},
			{Name: "node-b", Pods: []string{ppsPod}},
		},
		ExternalClients: []string{"ext"},
	})
	nodeA, pod, ext, router := tb.Nodes[0], tb.Nodes[1].Pods[0], tb.External[0], tb.Sandbox.Router
	if pod.IP != rpsPodIP {
		b.Fatalf("pod %s has address %s; the Service's endpoint is %s", pod.Name, pod.IP, rpsPodIP)
	}
	sink, err := openUDPSink(pod.Host, ppsTargetPort)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sink.Close)

	// The router's ends of the client's and node-a's veths take XDP_TX
	// frames only with an XDP program of their own.
	toClient, err := passOnPeer(pass, router, ext.Host)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = toClient.Close() })
	toNodeA, err := passOnPeer(pass, router, nodeA.Host)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = toNodeA.Close() })
	dst := netip.AddrPortFrom(nodeA.IP, ppsNodePort)
	if row.bypass {
		dst = netip.AddrPortFrom(pod.IP, ppsTargetPort)
	}
	frame, ifindex, err := clientFrame(router, ext.Host, dst)
	if err != nil {
		b.Fatal(err)
	}
	gen, err := newFrameSource(frame, ifindex)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gen.Close)

	var proxies []*testbed.Proxy
	for _, n := range tb.Nodes {
		if !row.bypass {
			proxies = append(proxies, tb.StartProxy(b, n, testbed.ProxyOptions{Kind: row.kind, Args: row.args, LegacyIPTables: row.legacyIPTables}))
		}
	}
	fail := func(format string, args ...any) {
		b.Helper()
		log := "no proxy runs"
		if len(proxies) > 0 {
			log = "node-a's proxy log:\n" + proxies[0].LogTail(40)
		}
		b.Fatalf("%s: %s\n%s", row.name, fmt.Sprintf(format, args...), log)
	}

	// The first frames wait for the nodes' neighbour entries and create the
	// flow; a frame that arrives intact proves the path, checksums included.
	start := time.Now()
	for {
		if _, err := gen.send(ext.NS, 16, time.Now().Add(time.Second)); err != nil {
			fail("%v", err)
		}
		time.Sleep(20 * time.Millisecond)
		from, err := sink.receive(ppsPayload)
		if err == nil {
			r.readyAfter, r.seenFrom = time.Since(start), from
			break
		}
		if !errors.Is(err, errNothingReceived) {
			fail("%v", err)
		}
		if time.Since(start) > ppsReadyBound {
			fail("no frame reached pod %s within %s", pod.Name, ppsReadyBound)
		}
	}
	if _, err := gen.send(ext.NS, ppsWarmupFrames, time.Now().Add(cfg.limit)); err != nil {
		fail("warm-up: %v", err)
	}
	if _, err := waitStable(pod.Host, ppsDrainBound); err != nil {
		fail("%v", err)
	}
	if err := sink.drain(ppsPayload); err != nil {
		fail("%v", err)
	}

	before, err := readSNMP(pod.Host)
	if err != nil {
		fail("%v", err)
	}
	t0 := time.Now()
	r.sent, err = gen.send(ext.NS, cfg.frames, t0.Add(cfg.limit))
	r.seconds = time.Since(t0).Seconds()
	r.via = gen.via()
	if err != nil {
		fail("%v", err)
	}
	after, err := waitStable(pod.Host, ppsDrainBound)
	if err != nil {
		fail("%v", err)
	}
	r.delivered = after.delivered() - before.delivered()
	// What queued on the socket must be the frames as sent: a check of the
	// translation under load, not only of the first frame. The kernel
	// verifies their UDP checksums as they are read.
	if err := sink.drain(ppsPayload); err != nil {
		fail("%v", err)
	}
	if read, err := readSNMP(pod.Host); err != nil {
		fail("%v", err)
	} else if bad := read.udp["InCsumErrors"] - before.udp["InCsumErrors"]; bad > 0 {
		fail("%d frames reached the pod with a bad checksum", bad)
	}
	if r.delivered == 0 {
		fail("none of %d frames reached pod %s", r.sent, pod.Name)
	}
	for _, p := range proxies {
		if !p.Running() {
			b.Fatalf("%s on %s: %v", row.name, p.Node.Spec.Name, p.ExitError())
		}
	}
	if row.kind == testbed.EbpfProxy && len(proxies) > 0 {
		r.events = bpfEvents(b.Context(), proxies[0], "tc_", "xdp_")
	}
	r.loadAfter = loadAverage()
	return r
}

// bpfEvents renders ebpf-proxy's non-zero event counters
// (ebpfproxy_bpf_events_total) whose names start with one of prefixes.
func bpfEvents(ctx context.Context, p *testbed.Proxy, prefixes ...string) string {
	fams, err := p.Metrics(ctx)
	if err != nil {
		return err.Error()
	}
	f, ok := fams["ebpfproxy_bpf_events_total"]
	if !ok {
		return "no ebpfproxy_bpf_events_total"
	}
	var out []string
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != "event" || m.GetCounter().GetValue() == 0 {
				continue
			}
			for _, prefix := range prefixes {
				if strings.HasPrefix(l.GetValue(), prefix) {
					out = append(out, fmt.Sprintf("%s=%.0f", l.GetValue(), m.GetCounter().GetValue()))
					break
				}
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// ppsStats are one row's figures over the rounds.
type ppsStats struct {
	rates, ratios, loss []float64
}

func ppsRowStats(rs []ppsResult, row string) ppsStats {
	base := map[int]ppsResult{}
	for _, r := range rs {
		if r.row.name == ppsBaseline {
			base[r.round] = r
		}
	}
	var s ppsStats
	for _, r := range rs {
		if r.row.name != row {
			continue
		}
		s.rates = append(s.rates, r.rate())
		if r.sent > 0 {
			s.loss = append(s.loss, 1-float64(r.delivered)/float64(r.sent))
		}
		if b, ok := base[r.round]; ok && b.rate() > 0 {
			s.ratios = append(s.ratios, r.rate()/b.rate())
		}
	}
	return s
}

// ppsSummary renders the results as a table, the ratios against the
// baseline, and the bench: lines. With several rounds a rate is the median
// of the rounds (their range follows it), a ratio the median of the rounds'
// ratios, each against the baseline of its own round.
func ppsSummary(cfg ppsConfig, rs []ppsResult) string {
	var sb strings.Builder
	host, _ := os.Hostname()
	via := "BPF_PROG_TEST_RUN live frames"
	if len(rs) > 0 && rs[0].via != "" {
		via = rs[0].via
	}
	fmt.Fprintf(&sb, "nodeport-pps: external client → node-a:%d/udp (NodePort) → pod on node-b; %d 64-byte frames of one flow per row "+
		"(sent by %s, batch %d, limit %s); %d round(s); %s, %d cores, kernel %s, %s\n",
		ppsNodePort, cfg.frames, via, ppsBatch, cfg.limit, cfg.rounds, host, runtime.NumCPU(), kernelRelease(), time.Now().UTC().Format(time.RFC3339))
	w := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "proxy\tdelivered pkt/s\tvs iptables\tlost\tpod saw\tfirst frame after\tload avg before/after")
	for _, row := range cfg.rows {
		s := ppsRowStats(rs, row.name)
		if len(s.rates) == 0 {
			continue
		}
		rate := fmt.Sprintf("%.0f", median(s.rates))
		if len(s.rates) > 1 {
			rate += fmt.Sprintf(" (%.0f–%.0f)", slices.Min(s.rates), slices.Max(s.rates))
		}
		ratio := "-"
		if len(s.ratios) > 0 {
			ratio = fmt.Sprintf("%.2fx", median(s.ratios))
		}
		var seen, ready, load []string
		for _, r := range rs {
			if r.row.name == row.name {
				if a := r.seenFrom.Addr().String(); !slices.Contains(seen, a) {
					seen = append(seen, a)
				}
				ready = append(ready, ms(r.readyAfter))
				load = append(load, r.loadBefore+"/"+r.loadAfter)
			}
		}
		lost := fmt.Sprintf("%.1f%%", 100*median(s.loss))
		if len(s.loss) > 1 {
			lost += fmt.Sprintf(" (%.1f–%.1f)", 100*slices.Min(s.loss), 100*slices.Max(s.loss))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.label, rate, ratio, lost,
			strings.Join(seen, ","), strings.Join(ready, ", "), strings.Join(load, ", "))
	}
	w.Flush()
	for _, r := range rs {
		if r.events != "" {
			fmt.Fprintf(&sb, "%s, round %d, node-a's events: %s\n", r.row.label, r.round+1, r.events)
		}
	}
	for _, row := range cfg.rows {
		if s := ppsRowStats(rs, row.name); len(s.rates) > 0 {
			sb.WriteString(benchLine("pps_"+benchName(row.name), "pps", median(s.rates)))
		}
	}
	for _, row := range cfg.rows {
		if row.name == ppsBaseline {
			continue
		}
		s := ppsRowStats(rs, row.name)
		if len(s.ratios) == 0 {
			continue
		}
		sb.WriteString(benchLine("pps_"+benchName(row.name)+"_vs_"+ppsBaseline, "ratio", median(s.ratios)))
	}
	return sb.String()
}

// benchLine renders one figure as a bench: line, with its target when
// test/benchreport/figures has one (pps_xdp_vs_iptables,
// pps_tc_vs_iptables).
func benchLine(name, unit string, v float64) string {
	f, ok := figures.ByName(name)
	if !ok {
		f = figures.Figure{Name: name, Unit: unit}
	}
	return f.Line(v) + "\n"
}

// benchName makes a row name fit a bench: line's NAME.
func benchName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// kernelRelease is the running kernel's release.
func kernelRelease() string {
	data, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(data))
}
