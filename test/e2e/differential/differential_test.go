package differential

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// PendingEnv set to 1 also runs the scenarios marked Pending: known
// differences of ebpf-proxy that await a decision.
const PendingEnv = "EBPF_PROXY_E2E_PENDING"

// selected reports whether scenario sc runs in this test.
func selected(sc Scenario) bool {
	return runnable(sc) && (sc.Pending == "" || os.Getenv(PendingEnv) == "1")
}

// runnable reports whether scenario sc is chosen and this kernel can run
// it (an SCTP scenario needs SCTP).
func runnable(sc Scenario) bool {
	return chosen(sc) && (!sc.usesSCTP() || sctpUnavailable() == nil)
}

// SCTPEnv set to "require" makes a kernel without SCTP fail the test
// instead of leaving the SCTP scenarios out with a line saying so: the run
// in the VM guests (make differential-sctp) sets it.
const SCTPEnv = "EBPF_PROXY_E2E_SCTP"

// sctpUnavailable reports why this kernel cannot open SCTP sockets (this
// machine's has no sctp module; Debian's 6.1 and 6.12 have it), or nil.
var sctpUnavailable = sync.OnceValue(func() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("this kernel cannot open SCTP sockets: %w (no sctp module)", err)
	}
	return unix.Close(fd)
})

// KindsEnv, when set, is a comma-separated list of the kinds to run
// (testbed.Kind values): a subset of kinds, which must hold the reference
// (testbed.KubeProxyIPTables) and the BPF mode (testbed.EbpfProxy). The
// guests' SCTP run uses it: each kind costs minutes there.
const KindsEnv = "EBPF_PROXY_E2E_KINDS"

// kindsToRun returns the kinds this run compares: kinds, or those of
// KindsEnv.
func kindsToRun() ([]testbed.Kind, error) {
	v := os.Getenv(KindsEnv)
	if v == "" {
		return kinds, nil
	}
	var out []testbed.Kind
	for _, name := range strings.Split(v, ",") {
		k := testbed.Kind(strings.TrimSpace(name))
		if !slices.Contains(kinds, k) {
			return nil, fmt.Errorf("%s: unknown kind %q (kinds: %v)", KindsEnv, k, kinds)
		}
		out = append(out, k)
	}
	for _, need := range []testbed.Kind{testbed.KubeProxyIPTables, testbed.EbpfProxy} {
		if !slices.Contains(out, need) {
			return nil, fmt.Errorf("%s=%s leaves out %s, which every run compares", KindsEnv, v, need)
		}
	}
	return out, nil
}

// ScenariosEnv, when set, is a regular expression: only the scenarios whose
// name it matches run, to iterate on a few (the summary counts only them).
const ScenariosEnv = "EBPF_PROXY_E2E_SCENARIOS"

func chosen(sc Scenario) bool {
	expr := os.Getenv(ScenariosEnv)
	if expr == "" {
		return true
	}
	ok, err := regexp.MatchString(expr, sc.Name)
	return err == nil && ok
}

// OutDirEnv names a directory where TestDifferential writes report.txt (every
// scenario with every verdict) and summary.txt (the differential line).
const OutDirEnv = "EBPF_PROXY_E2E_OUT"

// Concurrency of a run: API writes and probes (each probe is a process).
// Probes mostly wait (a DROP costs its attempts' timeouts), so twelve at a
// time keep two cores far from busy: the suite took 322 s with 12 against
// 514 s with 6, the cluster test's VM running beside it, same verdicts.
const (
	applyWorkers = 8
	probeWorkers = 12
)

// kinds are the proxies every scenario runs against; iptables mode is the
// reference (upstream's default), nftables mode where upstream is heading;
// then ebpf-proxy in BPF mode and in its fallback modes (fallbacks).
var kinds = []testbed.Kind{testbed.KubeProxyIPTables, testbed.KubeProxyNFTables, testbed.EbpfProxy, testbed.EbpfProxyIPTables, testbed.EbpfProxyNFTables,
	testbed.EbpfProxyPods}

// agentUser is the identity ebpf-proxy runs as: bound to the ClusterRole
// of deploy/rbac.yaml alone.
const agentUser = "ebpf-proxy-differential"

// createMeshPod creates the Pod object of the meshed pod p, running on node
// with p's addresses, in namespace ns, annotated to opt out of the socket
// hooks (k8swatch.SocketLBAnnotation), as a meshed workload is under the
// BPF mode's default --socket-lb-scope=all; no proxy but ebpf-proxy's BPF
// mode reads it. The namespace gets its default ServiceAccount first,
// which admission wants and no controller makes here.
func createMeshPod(ctx context.Context, cs kubernetes.Interface, ns, node string, p *sandbox.Pod) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	noToken := false
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: meshPod, Annotations: map[string]string{k8swatch.SocketLBAnnotation: k8swatch.SocketLBDisabled}},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &noToken,
			Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create the meshed pod's Pod: %w", err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.IP.String(),
		PodIPs: []corev1.PodIP{{IP: p.IP.String()}, {IP: p.IP6.String()}}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("the meshed pod's addresses: %w", err)
	}
	return nil
}

// The meshed pod (Probe.Mesh): its outbound TCP is redirected to its
// sidecar on meshPort, whose own connections carry meshMark.
const (
	meshPod  = "m1"
	meshPort = 15001
	meshMark = 1337
)

// upstreamFeatureGates are set on upstream kube-proxy and its API server:
// none at 1.37, which has on by default everything ebpf-proxy implements
// (node hints, PreferSameTrafficDistribution, are GA and locked on since
// 1.35).
var upstreamFeatureGates = map[string]bool{}

// verdicts of one run: [scenario][step][probe]; a scenario not run is nil.
type verdicts [][][]string

// of returns scenario si's verdicts, nil when the run did not reach it (a
// run that failed has none at all).
func (v verdicts) of(si int) [][]string {
	if si >= len(v) {
		return nil
	}
	return v[si]
}

func testbedOptions() testbed.Options {
	var sctpPorts []uint16
	if sctpUnavailable() == nil {
		sctpPorts = podSCTPPorts
	}
	return testbed.Options{
		Nodes: []testbed.NodeSpec{
			{Name: selfA, Zone: "zone-a", Pods: []string{"a1", "a2", meshPod}},
			// node-b's Node lists its IPv4 address alone, as on a
			// dual-stack cluster whose kubelet there has a single
			// --node-ip: every IPv6 probe through node-b compares how
			// the proxies serve IPv6 on a node the API calls IPv4-only.
			{Name: selfB, Zone: "zone-b", Pods: []string{"b1", "b2"}, IPv4Only: true},
		},
		TCPPorts:        podTCPPorts,
		UDPPorts:        podUDPPorts,
		SCTPPorts:       sctpPorts,
		ExternalClients: []string{ext, ext2},
	}
}

// TestDifferential runs every scenario against each kind of proxy on one
// API server, one testbed per kind, and compares ebpf-proxy's verdicts with
// upstream's.
func TestDifferential(t *testing.T) {
	if err := check(scenarios); err != nil {
		t.Fatal(err)
	}
	if expr := os.Getenv(ScenariosEnv); expr != "" {
		if _, err := regexp.Compile(expr); err != nil {
			t.Fatalf("%s: %v", ScenariosEnv, err)
		}
	}
	toRun, err := kindsToRun()
	if err != nil {
		t.Fatal(err)
	}
	var sctpLeftOut []string
	for _, sc := range scenarios {
		if chosen(sc) && !runnable(sc) {
			sctpLeftOut = append(sctpLeftOut, sc.Name)
		}
	}
	if len(sctpLeftOut) > 0 && os.Getenv(SCTPEnv) == "require" {
		t.Fatalf("%s=require: %v", SCTPEnv, sctpUnavailable())
	}
	gates := make([]string, 0, len(upstreamFeatureGates))
	for k, v := range upstreamFeatureGates {
		gates = append(gates, fmt.Sprintf("%s=%t", k, v))
	}
	start := time.Now()
	var apiArgs []string
	if len(gates) > 0 {
		apiArgs = append(apiArgs, "--feature-gates="+strings.Join(gates, ","))
	}
	c := cluster.StartT(t, cluster.Options{APIServerArgs: apiArgs, Users: []cluster.User{{Name: agentUser}}})
	// ebpf-proxy runs with the rights its DaemonSet gives it, upstream
	// kube-proxy with its own (system:node-proxier).
	if _, err := cluster.BindDeployedRole(t.Context(), c.Clientset(), agentUser); err != nil {
		t.Fatal(err)
	}

	runs := map[testbed.Kind]verdicts{}
	for i, kind := range kinds {
		if !slices.Contains(toRun, kind) {
			continue
		}
		ok := t.Run("run/"+string(kind), func(t *testing.T) {
			runs[kind] = runKind(t, c, kind, i)
		})
		// A run left out with -run is no failure.
		if kind.Upstream() && !ok {
			t.Fatalf("the %s reference run failed; nothing to compare with", kind)
		}
	}

	var report strings.Builder
	var n, match, mismatch, unsupported int
	// pods tallies the BPF mode translating pods per packet, judged as
	// the BPF mode is.
	var pods struct{ n, match, mismatch, unsupported int }
	var disagreements, pending, deviations []string
	tallies := newFallbackTallies(runs)
	for si, sc := range scenarios {
		if !runnable(sc) {
			continue // SCTP where the kernel lacks it: sctpLeftOut
		}
		if !selected(sc) {
			pending = append(pending, fmt.Sprintf("%q (%s)", sc.Name, sc.Pending))
			continue
		}
		n++
		status, text, disagree := compare(si, sc, runs, testbed.EbpfProxy)
		switch status {
		case "match":
			match++
		case "mismatch":
			mismatch++
		default:
			unsupported++
		}
		if disagree {
			disagreements = append(disagreements, sc.Name)
		}
		if status == "match" && strings.Contains(text, "documented deviation") {
			why := sc.KeepsSource
			if why == "" {
				why = "endpoints on the receiving node see the client, not the node's bridge address"
			}
			deviations = append(deviations, fmt.Sprintf("%q (%s)", sc.Name, why))
		}
		fmt.Fprintf(&report, "%s\n", text)
		var fallbackMismatches []string
		if runs[testbed.EbpfProxyPods] != nil {
			pods.n++
			st, text, _ := compare(si, sc, runs, testbed.EbpfProxyPods)
			switch st {
			case "match":
				pods.match++
			case "mismatch":
				pods.mismatch++
				fallbackMismatches = append(fallbackMismatches, text)
			default:
				pods.unsupported++
			}
			fmt.Fprintf(&report, "%s\n", text)
		}
		for _, f := range tallies {
			if m := f.judge(si, sc, runs); m != "" {
				fallbackMismatches = append(fallbackMismatches, m)
				fmt.Fprintf(&report, "%s\n", m)
			}
		}
		t.Run("compare/"+sc.Name, func(t *testing.T) {
			if status == "mismatch" {
				t.Errorf("ebpf-proxy differs from upstream kube-proxy:\n%s", text)
			} else {
				t.Logf("%s", text)
			}
			for _, m := range fallbackMismatches {
				t.Errorf("ebpf-proxy's fallback, or its BPF mode with pods per packet, differs from upstream kube-proxy:\n%s", m)
			}
		})
	}
	summary := fmt.Sprintf("differential: scenarios=%d match=%d mismatch=%d unsupported=%d", n, match, mismatch, unsupported)
	// One line per fallback mode before the final, BPF mode's, line.
	var fallbackLines strings.Builder
	for _, f := range tallies {
		fmt.Fprintf(&fallbackLines, "%s\n", f.summary())
		t.Log(f.summary())
	}
	podsLine := "differential (BPF, pods per packet): not run"
	if runs[testbed.EbpfProxyPods] != nil {
		podsLine = fmt.Sprintf("differential (BPF, pods per packet): scenarios=%d match=%d mismatch=%d unsupported=%d",
			pods.n, pods.match, pods.mismatch, pods.unsupported)
	}
	fmt.Fprintf(&fallbackLines, "%s\n", podsLine)
	t.Log(podsLine)
	if len(sctpLeftOut) > 0 {
		l := fmt.Sprintf("differential (SCTP): %d scenario(s) not run here: %v; make differential-sctp runs them in the 6.1 and 6.12 guests (make test does)",
			len(sctpLeftOut), sctpUnavailable())
		fmt.Fprintf(&fallbackLines, "%s\n", l)
		fmt.Fprintf(&report, "SCTP scenarios not run here: %s\n", strings.Join(sctpLeftOut, "; "))
		t.Log(l)
	}
	if len(pending) > 0 {
		fmt.Fprintf(&report, "pending, not run (%s=1 runs them): %s\n", PendingEnv, strings.Join(pending, "; "))
		t.Logf("pending scenarios, not run (%s=1 runs them): %s", PendingEnv, strings.Join(pending, "; "))
	}
	if len(deviations) > 0 {
		fmt.Fprintf(&report, "matching with the client's address kept where upstream masquerades (documented deviation): %s\n",
			strings.Join(deviations, "; "))
		t.Logf("%d scenario(s) match with the client's address kept where upstream masquerades: %s", len(deviations), strings.Join(deviations, "; "))
	}
	for _, f := range tallies {
		if l := f.knownLine(); l != "" {
			fmt.Fprintf(&report, "%s\n", l)
			t.Log(l)
		}
	}
	fmt.Fprintf(&report, "upstream iptables and nftables modes disagree in %d scenario(s): %s\n", len(disagreements), strings.Join(disagreements, "; "))
	fmt.Fprintf(&report, "run time %s\n%s%s\n", time.Since(start).Round(time.Second), fallbackLines.String(), summary)
	t.Log(summary)
	if dir := os.Getenv(OutDirEnv); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "report.txt"), []byte(report.String()), 0o644); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(fallbackLines.String()+summary+"\n"), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// compare judges one scenario for ebpf-proxy's BPF mode of kind (EbpfProxy,
// or EbpfProxyPods): "match" when every probe of every step got from it the
// verdict of upstream's iptables or nftables mode, "unsupported" when it
// lacks a feature the scenario needs, else "mismatch". The text lists every
// verdict.
func compare(si int, sc Scenario, runs map[testbed.Kind]verdicts, kind testbed.Kind) (status, text string, disagree bool) {
	ipt, nft, ebpf := runs[testbed.KubeProxyIPTables].of(si), runs[testbed.KubeProxyNFTables].of(si), runs[kind].of(si)
	if runs[testbed.KubeProxyNFTables] == nil {
		// Left out of this run (KindsEnv): iptables mode alone is the
		// reference.
		nft = ipt
	}
	lacking := missing(sc.Needs, agentFeatures(kind))
	label := "ebpf:    "
	if kind == testbed.EbpfProxyPods {
		label = "ebpf, pods per packet:"
	}
	status = "match"
	if len(lacking) > 0 {
		status = "unsupported (ebpf-proxy lacks " + strings.Join(lacking, ", ") + ")"
	}
	var b strings.Builder
	for st, step := range sc.Steps {
		fmt.Fprintf(&b, "  step %d: %s\n", st+1, step.Name)
		for pi, p := range step.Probes {
			up := at(ipt, st, pi)
			nf := at(nft, st, pi)
			fmt.Fprintf(&b, "    %s\n      iptables: %s\n", p, up)
			if nf != up {
				// Upstream's modes disagree: which one each fallback
				// follows shows too.
				disagree = true
				fmt.Fprintf(&b, "      nftables: %s\n", nf)
				for _, f := range fallbacks {
					if runs[f.kind] != nil {
						fmt.Fprintf(&b, "      %s fallback: %s\n", f.mode, at(runs[f.kind].of(si), st, pi))
					}
				}
			}
			if len(lacking) > 0 {
				continue
			}
			eb := at(ebpf, st, pi)
			mark := ""
			switch {
			case eb == up || eb == nf:
			case sc.KeepsSource != "" && (eb == unmasqueraded(up) || eb == unmasqueraded(nf)):
				mark = "   (source kept: documented deviation)"
			case eb == localUnmasqueraded(up) || eb == localUnmasqueraded(nf):
				// A backend on the node that received the traffic sees
				// the client where upstream masquerades it to the
				// node's bridge address (docs/architecture/differences.md).
				mark = "   (source kept for a local endpoint: documented deviation)"
			default:
				status = "mismatch"
				mark = "   <-- MISMATCH"
			}
			fmt.Fprintf(&b, "      %s %s%s\n", label, eb, mark)
		}
	}
	if kind == testbed.EbpfProxyPods {
		return status, fmt.Sprintf("scenario %q (pods per packet): %s\n%s", sc.Name, status, b.String()), disagree
	}
	return status, fmt.Sprintf("scenario %q: %s\n%s", sc.Name, status, b.String()), disagree
}

// nodeSeen matches an endpoint seeing one of the testbed's node addresses
// (a node's own, or its bridge's) in a verdict.
var nodeSeen = regexp.MustCompile(` sees (` + strings.Join(nodeNames(), "|") + `)(/br0)?([,}])`)

func nodeNames() []string {
	var out []string
	for _, n := range testbedOptions().Nodes {
		out = append(out, regexp.QuoteMeta(n.Name))
	}
	return out
}

// unmasqueraded is an upstream verdict as a proxy that keeps the client's
// address would give it.
func unmasqueraded(v string) string { return nodeSeen.ReplaceAllString(v, " sees client$3") }

// bridgeSeen matches an endpoint seeing a node's bridge address: upstream's
// masquerade of traffic to an endpoint on the same node.
var bridgeSeen = regexp.MustCompile(` sees (` + strings.Join(nodeNames(), "|") + `)/br0([,}])`)

// localUnmasqueraded is an upstream verdict as a proxy that keeps the
// client's address for endpoints on the receiving node gives it.
func localUnmasqueraded(v string) string { return bridgeSeen.ReplaceAllString(v, " sees client$2") }

func at(v [][]string, st, pi int) string {
	if v == nil {
		return "NOT RUN"
	}
	if st >= len(v) || v[st] == nil || pi >= len(v[st]) || v[st][pi] == "" {
		return "NOT RUN"
	}
	return v[st][pi]
}

// runKind runs every scenario the proxy kind supports on a fresh testbed and
// returns the verdicts, or nil if the run could not be made.
func runKind(t *testing.T, c *cluster.Cluster, kind testbed.Kind, index int) verdicts {
	ctx := t.Context()
	start := time.Now()
	tb := testbed.New(t, c, testbedOptions())
	opts := testbed.ProxyOptions{Kind: kind}
	if kind.Upstream() {
		opts.FeatureGates = upstreamFeatureGates
	} else {
		kubeconfig, err := c.Kubeconfig(agentUser)
		if err != nil {
			t.Fatal(err)
		}
		opts.Kubeconfig = kubeconfig
	}
	var proxies []*testbed.Proxy
	for _, n := range tb.Nodes {
		proxies = append(proxies, tb.StartProxy(t, n, opts))
	}
	t.Logf("%s run: testbed and proxies up after %s", kind, time.Since(start).Round(time.Millisecond))
	ns := "diff-" + string(kind)
	if err := builders.CreateNamespace(ctx, c.Clientset(), ns); err != nil {
		t.Fatal(err)
	}
	w := newWorld(kind, index, tb, ns)
	t.Cleanup(func() {
		if err := w.cleanup(context.Background()); err != nil {
			t.Error(err)
		}
	})
	mesh, _ := tb.Pod(meshPod)
	if err := createMeshPod(ctx, c.Clientset(), ns, selfA, mesh); err != nil {
		t.Fatal(err)
	}
	var err error
	if w.mesh, err = mesh.StartRedirectProxy(meshPort, meshMark); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.mesh.Close() })

	out := make(verdicts, len(scenarios))
	var active []int
	waves := 0
	for si, sc := range scenarios {
		if !selected(sc) || !kind.Upstream() && len(missing(sc.Needs, agentFeatures(kind))) > 0 {
			continue
		}
		active = append(active, si)
		out[si] = make([][]string, len(sc.Steps))
		waves = max(waves, len(sc.Steps))
		if err := w.addVIPs(si, sc.VIPs); err != nil {
			t.Fatalf("scenario %q: %v", sc.Name, err)
		}
	}

	for wave := range waves {
		waveStart := time.Now()
		var inWave []int
		for _, si := range active {
			if wave < len(scenarios[si].Steps) {
				inWave = append(inWave, si)
			}
		}
		parallel(len(inWave), applyWorkers, func(i int) {
			si := inWave[i]
			if err := w.apply(ctx, si, scenarios[si].Steps[wave]); err != nil {
				t.Errorf("scenario %q step %d: apply: %v", scenarios[si].Name, wave+1, err)
			}
		})
		if t.Failed() {
			return nil
		}
		ipv6 := slices.ContainsFunc(inWave, func(si int) bool { return scenarios[si].usesIPv6() })
		if err := w.barrier(ctx, wave, ipv6); err != nil {
			t.Fatalf("%s run, wave %d: %v", kind, wave+1, err)
		}
		// Every probe of the wave is a new connection under the wave's
		// rules, as for a real client (see FlushConntrack).
		keep := w.heldSources()
		for _, n := range tb.Nodes {
			if err := n.FlushConntrackExcept(keep); err != nil {
				t.Fatal(err)
			}
		}
		type job struct{ si, pi int }
		var jobs []job
		for _, si := range inWave {
			out[si][wave] = make([]string, len(scenarios[si].Steps[wave].Probes))
			for pi := range scenarios[si].Steps[wave].Probes {
				jobs = append(jobs, job{si, pi})
			}
		}
		outcomes := make([]outcome, len(jobs))
		parallel(len(jobs), probeWorkers, func(i int) {
			j := jobs[i]
			p := scenarios[j.si].Steps[wave].Probes[j.pi]
			o, err := w.observe(ctx, j.si, p)
			if err != nil {
				t.Errorf("scenario %q step %d: probe %s: %v", scenarios[j.si].Name, wave+1, p, err)
				o = outcome{final: "PROBE ERROR: " + err.Error()}
			}
			outcomes[i] = o
		})
		for i, j := range jobs {
			v, mixed := outcomes[i].verdict()
			if mixed != "" {
				t.Logf("%s run, scenario %q step %d: probe %s: %s", kind, scenarios[j.si].Name, wave+1, scenarios[j.si].Steps[wave].Probes[j.pi], mixed)
			}
			out[j.si][wave][j.pi] = v
		}
		t.Logf("%s run: wave %d done: %d scenarios, %d probes, in %s", kind, wave+1, len(inWave), len(jobs), time.Since(waveStart).Round(time.Millisecond))
	}
	for _, p := range proxies {
		if err := p.ExitError(); err != nil {
			t.Errorf("%s on %s died during the run: %v\n%s", kind, p.Node.Spec.Name, err, p.LogTail(30))
		}
	}
	return out
}

// parallel runs fn(0..n-1) on at most workers goroutines.
func parallel(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, workers) {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
