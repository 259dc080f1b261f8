package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// Settings of BenchmarkNodePortRPS, from the environment.
const (
	envRPSDuration = "EBPF_PROXY_BENCH_RPS_DURATION" // measured time per phase, default 5s
	envRPSWorkers  = "EBPF_PROXY_BENCH_RPS_WORKERS"  // concurrent connections, default 8
	envRPSRows     = "EBPF_PROXY_BENCH_RPS_PROXIES"  // rows to run, default "iptables,ebpf,ebpf-iptables"
	// envRPSRounds repeats every row, interleaved (A B C A B C), so that a
	// change of the shared machine's load over the run favours no row;
	// default 1.
	envRPSRounds = "EBPF_PROXY_BENCH_RPS_ROUNDS"
)

// rpsRow is one proxy set-up of the benchmark; every node runs it.
type rpsRow struct {
	// name labels the row in the results and selects it in envRPSRows.
	name string
	kind testbed.Kind
	// args are appended to the proxy's command line, for example the
	// agent's --xdp mode.
	args []string
	// legacyIPTables runs upstream kube-proxy with iptables-legacy.
	legacyIPTables bool
	// label describes the row in the summary table.
	label string
	// bypass runs no proxy and sends the frames to the pod itself, past
	// node-a (BenchmarkNodePortPPS's bound).
	bypass bool
}

// rpsBaseline is the row every other is compared with: upstream
// kube-proxy's iptables mode, the kernel's iptables DNAT.
const rpsBaseline = "iptables"

// rpsRows are the rows the benchmark knows, the baseline first.
//
// Upstream's iptables mode runs with iptables-legacy, as in BenchmarkScale
// and as ebpf-proxy's own iptables fallback prefers; "iptables-nft" is the
// same through Debian's default iptables-nft, for comparison.
var rpsRows = []rpsRow{
	{name: rpsBaseline, kind: testbed.KubeProxyIPTables, legacyIPTables: true, label: "kube-proxy iptables (legacy)"},
	{name: "ebpf", kind: testbed.EbpfProxy, label: "ebpf-proxy TC"},
	{name: "ebpf-iptables", kind: testbed.EbpfProxyIPTables, label: "ebpf-proxy iptables fallback"},
	{name: "iptables-nft", kind: testbed.KubeProxyIPTables, label: "kube-proxy iptables (nft)"},
	{name: "nftables", kind: testbed.KubeProxyNFTables, label: "kube-proxy nftables"},
	{name: "ebpf-xdp-generic", kind: testbed.EbpfProxy, args: []string{"--xdp=generic"}, label: "ebpf-proxy XDP generic"},
}

var rpsDefaultRows = []string{rpsBaseline, "ebpf", "ebpf-iptables"}

type rpsConfig struct {
	duration        time.Duration
	workers, rounds int
	rows            []rpsRow
}

func rpsConfigFromEnv() (rpsConfig, error) {
	cfg := rpsConfig{duration: 5 * time.Second, workers: 8, rounds: 1}
	err := errors.Join(envDuration(envRPSDuration, &cfg.duration, 10*time.Minute),
		envInt(envRPSWorkers, &cfg.workers, 1, 256),
		envInt(envRPSRounds, &cfg.rounds, 1, 20))
	if err != nil {
		return cfg, err
	}
	cfg.rows, err = envRows(envRPSRows, rpsDefaultRows, rpsRows)
	return cfg, err
}

// The benchmark's Service and its address plan.
const (
	rpsNamespace  = "rps"
	rpsService    = "rps"
	rpsNodePort   = 30080
	rpsTargetPort = 8081
	rpsPod        = "b1"
	// rpsWarmup runs before each phase is counted: the first connections
	// fill caches and conntrack tables.
	rpsWarmup = time.Second
	// Bounds, not expectations.
	rpsReadyBound = time.Minute
	rpsIOTimeout  = time.Second
)

// rpsResult is one row's measurement.
type rpsResult struct {
	row        rpsRow
	round      int
	readyAfter time.Duration
	newConn    rpsPhase
	persistent rpsPhase
	// load is the machine's load average (1 min) before and after the
	// row: the machine is shared, and the figures mean little when it was
	// busy.
	loadBefore, loadAfter string
	// events are ebpf-proxy's TC counters on node-a after the row.
	events string
}

// BenchmarkNodePortRPS measures requests per second from a client outside
// the cluster through a NodePort on node-a to the Service's only endpoint,
// a pod on node-b: node-a DNATs and SNATs every connection to node-b. For
// each proxy of the table in turn, on a fresh testbed where every node runs
// it, the client's workers run for the same fixed time
//   - new-conn: a new TCP connection per request (connect, a small request,
//     a small answer, close): the proxy's new-flow path;
//   - persistent: request and answer over connections kept open: its
//     per-packet path;
//
// and the summary compares each proxy with upstream kube-proxy's iptables
// mode measured in the same run. It asserts no speed; it fails only if
// traffic does not flow. Run it with -benchtime 1x; it measures once
// whatever b.N is.
func BenchmarkNodePortRPS(b *testing.B) {
	cfg, err := rpsConfigFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	c := cluster.StartT(b, cluster.Options{})
	if err := createRPSService(b.Context(), c.Clientset()); err != nil {
		b.Fatal(err)
	}
	var results []rpsResult
	for round := range cfg.rounds {
		for _, row := range cfg.rows {
			b.Run(row.name, func(b *testing.B) {
				r := measureRPS(b, c, row, cfg)
				r.round = round
				results = append(results, r)
				b.ReportMetric(r.newConn.PerSecond(), "new-conn-req/s")
				b.ReportMetric(r.persistent.PerSecond(), "persistent-req/s")
			})
		}
	}
	table := rpsSummary(cfg, results)
	b.Log("\n" + table)
	fmt.Println(table)
}

// createRPSService creates the NodePort Service and its EndpointSlice with
// the one endpoint, pod b1 on node-b. The testbed gives b1 the same address
// every time (the first pod of node 2), so one Service serves every row.
func createRPSService(ctx context.Context, cs kubernetes.Interface) error {
	if err := builders.CreateNamespace(ctx, cs, rpsNamespace); err != nil {
		return err
	}
	svc := builders.Service(rpsNamespace, rpsService, builders.ClusterIP(""),
		builders.Ports(builders.Port("tcp", 80, corev1.ProtocolTCP, intstr.FromInt32(rpsTargetPort))), builders.NodePort(rpsNodePort),
		func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster })
	_, err := builders.CreateService(ctx, cs, svc, builders.SliceFor(svc, builders.Endpoint(rpsPodIP.String(), "node-b")))
	return err
}

// rpsPodIP is the address the sandbox gives the first pod of node 2.
var rpsPodIP = netip.MustParseAddr("10.244.2.10")

// measureRPS runs one row on a fresh testbed.
func measureRPS(b *testing.B, c *cluster.Cluster, row rpsRow, cfg rpsConfig) rpsResult {
	r := rpsResult{row: row, loadBefore: loadAverage()}
	tb := testbed.New(b, c, testbed.Options{
		Nodes: []testbed.NodeSpec{
			{Name: "node-a"},
			{Name: "node-b", Pods: []string{rpsPod}},
		},
		ExternalClients: []string{"ext"},
	})
	nodeA, pod, ext := tb.Nodes[0], tb.Nodes[1].Pods[0], tb.External[0]
	if pod.IP != rpsPodIP {
		b.Fatalf("pod %s has address %s; the Service's endpoint is %s", pod.Name, pod.IP, rpsPodIP)
	}
	startRPSServer(b, pod.Host, rpsServerConfig{Port: rpsTargetPort, Name: pod.Name, Threads: 2*cfg.workers + 2})
	// Without these, the new-connection phase would run out of source
	// ports: every connection leaves a TIME_WAIT socket on the client for
	// a minute. The client's namespace only.
	if err := setNetnsSysctls(ext.NS, map[string]string{
		"net/ipv4/ip_local_port_range": "1024\t65535",
		"net/ipv4/tcp_tw_reuse":        "1",
	}); err != nil {
		b.Fatal(err)
	}
	var proxies []*testbed.Proxy
	for _, n := range tb.Nodes {
		proxies = append(proxies, tb.StartProxy(b, n, testbed.ProxyOptions{Kind: row.kind, Args: row.args, LegacyIPTables: row.legacyIPTables}))
	}
	res, err := runRPSClient(b.Context(), ext, rpsClientConfig{
		Target:     netip.AddrPortFrom(nodeA.IP, rpsNodePort),
		Expect:     string(rpsResponse(pod.Name, nodeA.IP)),
		Workers:    cfg.workers,
		ReadyBound: rpsReadyBound,
		Warmup:     rpsWarmup,
		Duration:   cfg.duration,
		IOTimeout:  rpsIOTimeout,
	})
	if err != nil {
		b.Fatalf("%s: %v", row.name, err)
	}
	if res.Error != "" {
		b.Fatalf("%s: %s (failed attempts: %v)\nnode-a's proxy log:\n%s", row.name, res.Error, res.ReadyErrors, proxies[0].LogTail(40))
	}
	if len(res.Phases) != 2 {
		b.Fatalf("%s: the client reported %d phases, want 2", row.name, len(res.Phases))
	}
	r.readyAfter, r.persistent, r.newConn = res.ReadyAfter, res.Phases[0], res.Phases[1]
	for _, p := range res.Phases {
		// Most requests failing is a broken path, not a figure.
		if p.Requests == 0 || p.ErrorCount() > p.Requests {
			b.Fatalf("%s, %s: %d requests answered, %d failed: %v\nnode-a's proxy log:\n%s", row.name, p.Mode, p.Requests,
				p.ErrorCount(), p.Errors, proxies[0].LogTail(40))
		}
		if p.ErrorCount() > 0 {
			b.Logf("%s, %s: %d of %d requests failed: %v", row.name, p.Mode, p.ErrorCount(), p.ErrorCount()+p.Requests, p.Errors)
		}
	}
	for _, p := range proxies {
		if !p.Running() {
			b.Fatalf("%s on %s: %v", row.name, p.Node.Spec.Name, p.ExitError())
		}
	}
	if row.kind == testbed.EbpfProxy {
		r.events = tcEvents(b.Context(), proxies[0])
	}
	r.loadAfter = loadAverage()
	return r
}

// tcEvents renders the non-zero TC event counters of ebpf-proxy on node-a
// (ebpfproxy_bpf_events_total): a translation that fails shows there.
func tcEvents(ctx context.Context, p *testbed.Proxy) string {
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
			if l.GetName() == "event" && strings.HasPrefix(l.GetValue(), "tc_") && m.GetCounter().GetValue() > 0 {
				out = append(out, fmt.Sprintf("%s=%.0f", l.GetValue(), m.GetCounter().GetValue()))
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// startRPSServer starts the server child in h's namespace and waits until
// it listens; it is killed in b.Cleanup, before the testbed goes.
func startRPSServer(b *testing.B, h *sandbox.Host, cfg rpsServerConfig) {
	b.Helper()
	cmd, err := rpsChild(roleServer, cfg)
	if err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := h.NS.Start(cmd); err != nil {
		b.Fatalf("start the server in %s: %v", h.Name, err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- strings.TrimSpace(line)
	}()
	select {
	case line := <-ready:
		if line != rpsServerReady {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			b.Fatalf("server in %s did not start: %q %s", h.Name, line, stderr.String())
		}
	case <-time.After(30 * time.Second):
		b.Fatalf("server in %s did not listen within 30s", h.Name)
	}
}

// runRPSClient runs the client child in ext's namespace and returns its
// report. The child ends by itself; a bound covers a child that hangs.
func runRPSClient(ctx context.Context, ext *sandbox.Client, cfg rpsClientConfig) (rpsClientResult, error) {
	var res rpsClientResult
	cmd, err := rpsChild(roleClient, cfg)
	if err != nil {
		return res, err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := ext.NS.Start(cmd); err != nil {
		return res, fmt.Errorf("start the client in %s: %w", ext.Name, err)
	}
	bound := cfg.ReadyBound + 2*(cfg.Warmup+cfg.Duration+cfg.IOTimeout) + 30*time.Second
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return res, ctx.Err()
	case <-time.After(bound):
		_ = cmd.Process.Kill()
		<-done
		return res, fmt.Errorf("the client did not finish within %s: %s", bound, stderr.String())
	}
	if err != nil {
		return res, fmt.Errorf("client: %w: %s", err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return res, fmt.Errorf("decode the client's report %q: %w", stdout.String(), err)
	}
	return res, nil
}

// rpsChild prepares the re-execution of this test binary as role.
func rpsChild(role string, cfg any) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), rpsRoleEnv+"="+role, rpsConfigEnv+"="+string(body),
		// Asynchronous preemption signals would interrupt the blocking
		// socket calls with EINTR.
		"GODEBUG=asyncpreemptoff=1")
	// Killed with the test binary; its own process group keeps a Ctrl-C at
	// the terminal to the test binary, which cleans up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd, nil
}

// setNetnsSysctls writes sysctls inside ns only.
func setNetnsSysctls(ns *sandbox.Netns, kv map[string]string) error {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return ns.Do(func() error {
		for _, k := range keys {
			if err := os.WriteFile("/proc/sys/"+k, []byte(kv[k]+"\n"), 0o644); err != nil {
				return fmt.Errorf("set %s in netns %s: %w", k, ns.Name(), err)
			}
		}
		return nil
	})
}

// loadAverage is the machine's 1-minute load average.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(data)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// rpsSummary renders the results as a table and one line of ratios against
// the baseline per mode. With several rounds a rate is the median of the
// rounds (their range follows it), and a ratio the median of the rounds'
// ratios, each against the baseline of its own round.
func rpsSummary(cfg rpsConfig, rs []rpsResult) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "nodeport-rps: external client → node-a:%d (NodePort) → pod on node-b; %d workers, %s per phase after %s of warmup; %d round(s); %d cores\n",
		rpsNodePort, cfg.workers, cfg.duration, rpsWarmup, cfg.rounds, runtime.NumCPU())
	base := map[int]rpsResult{}
	for _, r := range rs {
		if r.row.name == rpsBaseline {
			base[r.round] = r
		}
	}
	rate := func(r rpsResult, mode string) float64 {
		if mode == modeNewConn {
			return r.newConn.PerSecond()
		}
		return r.persistent.PerSecond()
	}
	// stats are a row's median rate, its range and its median ratio.
	stats := func(row rpsRow, mode string) (rateText, ratioText string) {
		var rates, ratios []float64
		for _, r := range rs {
			if r.row.name != row.name {
				continue
			}
			rates = append(rates, rate(r, mode))
			if b, ok := base[r.round]; ok && rate(b, mode) > 0 {
				ratios = append(ratios, rate(r, mode)/rate(b, mode))
			}
		}
		if len(rates) == 0 {
			return "-", "-"
		}
		rateText = fmt.Sprintf("%.0f", median(rates))
		if len(rates) > 1 {
			rateText += fmt.Sprintf(" (%.0f–%.0f)", slices.Min(rates), slices.Max(rates))
		}
		ratioText = "-"
		if len(ratios) > 0 {
			ratioText = fmt.Sprintf("%.2fx", median(ratios))
		}
		return rateText, ratioText
	}
	phases := func(row rpsRow, mode string) rpsPhase {
		sum := rpsPhase{Errors: map[string]uint64{}}
		for _, r := range rs {
			if r.row.name != row.name {
				continue
			}
			p := r.persistent
			if mode == modeNewConn {
				p = r.newConn
			}
			sum.Requests += p.Requests
			for k, v := range p.Errors {
				sum.Errors[k] += v
			}
		}
		return sum
	}
	w := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "proxy\tnew-conn req/s\tvs iptables\tfailed\tpersistent req/s\tvs iptables\tfailed\tfirst answer after\tload avg before/after")
	for _, row := range cfg.rows {
		nRate, nRatio := stats(row, modeNewConn)
		pRate, pRatio := stats(row, modePersistent)
		var ready, load []string
		for _, r := range rs {
			if r.row.name == row.name {
				ready = append(ready, ms(r.readyAfter))
				load = append(load, r.loadBefore+"/"+r.loadAfter)
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.label, nRate, nRatio, failed(phases(row, modeNewConn)),
			pRate, pRatio, failed(phases(row, modePersistent)), strings.Join(ready, ", "), strings.Join(load, ", "))
	}
	w.Flush()
	for _, r := range rs {
		if r.events != "" {
			fmt.Fprintf(&sb, "%s, round %d, node-a's TC events: %s\n", r.row.label, r.round+1, r.events)
		}
	}
	if len(base) == 0 {
		fmt.Fprintf(&sb, "nodeport-rps: no ratios, the baseline %q did not run\n", rpsBaseline)
		return sb.String()
	}
	for _, mode := range []string{modeNewConn, modePersistent} {
		line := "nodeport-rps: " + mode
		for _, row := range cfg.rows {
			if row.name == rpsBaseline {
				continue
			}
			_, ratio := stats(row, mode)
			line += fmt.Sprintf(" %s/%s=%s", row.name, rpsBaseline, ratio)
		}
		sb.WriteString(line + "\n")
	}
	return sb.String()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// failed renders a phase's failures: their share and causes.
func failed(p rpsPhase) string {
	n := p.ErrorCount()
	if n == 0 {
		return "0"
	}
	causes := make([]string, 0, len(p.Errors))
	for k, v := range p.Errors {
		causes = append(causes, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(causes)
	return fmt.Sprintf("%.2f%% (%s)", 100*float64(n)/float64(n+p.Requests), strings.Join(causes, ", "))
}
