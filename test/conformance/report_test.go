package main

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// report writes a JSON report in ginkgo's form holding specs, as
// --ginkgo.json-report does, and returns its path.
func report(t *testing.T, specs string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(p, []byte(`[{"SuiteDescription":"Kubernetes e2e suite","SpecReports":[`+specs+`]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	setupPassed = `{"LeafNodeType":"SynchronizedBeforeSuite","State":"passed","NumAttempts":1}`
	basic       = `{"ContainerHierarchyTexts":["[sig-network] Services"],"LeafNodeType":"It","LeafNodeText":"should serve a basic endpoint from pods [Conformance]","State":"passed","NumAttempts":1}`
	twoNodes    = `{"ContainerHierarchyTexts":["[sig-network] Conntrack"],"LeafNodeType":"It","LeafNodeText":"should be able to preserve UDP traffic","State":"skipped","NumAttempts":1,"Failure":{"Message":"Requires at least 2 nodes (not 1)\nmore"}}`
	filtered    = `{"ContainerHierarchyTexts":["[sig-apps] Deployment"],"LeafNodeType":"It","LeafNodeText":"should roll","State":"skipped","NumAttempts":0}`
	affinity    = `{"ContainerHierarchyTexts":["[sig-network] Services"],"LeafNodeType":"It","LeafNodeText":"should have session affinity work for service with type clusterIP [LinuxOnly] [Conformance]","State":"failed","NumAttempts":1,"Failure":{"Message":"timed out"}}`
	latency     = `{"ContainerHierarchyTexts":["[sig-network] Service endpoints latency"],"LeafNodeType":"It","LeafNodeText":"should not be very high [Conformance]","State":"timedout","NumAttempts":1}`
)

func TestReadReportCountsSelectedSpecsByOutcome(t *testing.T) {
	r, err := ReadReport("ebpf-proxy", report(t, strings.Join([]string{setupPassed, basic, twoNodes, filtered, affinity, latency}, ",")))
	if err != nil {
		t.Fatal(err)
	}
	if r.Passed != 1 || r.Failed != 2 || r.Skipped != 1 || r.Ran() != 3 {
		t.Errorf("passed=%d failed=%d skipped=%d ran=%d, want 1 2 1 3", r.Passed, r.Failed, r.Skipped, r.Ran())
	}
	want := []string{
		"[sig-network] Services should have session affinity work for service with type clusterIP [LinuxOnly] [Conformance]",
		"[sig-network] Service endpoints latency should not be very high [Conformance]",
	}
	if !reflect.DeepEqual(r.Failures, want) {
		t.Errorf("failures %q, want %q", r.Failures, want)
	}
	if r.SkipReasons["Requires at least 2 nodes (not 1)"] != 1 || len(r.SkipReasons) != 1 {
		t.Errorf("skip reasons %v", r.SkipReasons)
	}
	if len(r.SetupFailures) != 0 {
		t.Errorf("setup failures %q", r.SetupFailures)
	}
}

func TestSummaryNamesEnvironmentLimitsAndJudgesEBPFProxyAgainstKubeProxy(t *testing.T) {
	kp, err := ReadReport("kube-proxy", report(t, strings.Join([]string{basic, latency, twoNodes}, ",")))
	if err != nil {
		t.Fatal(err)
	}
	ours, err := ReadReport("ebpf-proxy", report(t, strings.Join([]string{basic, latency, twoNodes}, ",")))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if !Summary(&b, []Result{kp, ours}) {
		t.Errorf("a spec failed by both proxies failed the run:\n%s", b.String())
	}
	out := b.String()
	if !strings.Contains(out, "should not be very high [Conformance]  [environment limit: fails with every proxy]") {
		t.Errorf("the spec both fail is not named an environment limit:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-2:]
	wantLast := []string{
		"conformance: proxy=kube-proxy ran=2 passed=1 failed=1 skipped=1",
		"conformance: proxy=ebpf-proxy ran=2 passed=1 failed=1 skipped=1",
	}
	if !reflect.DeepEqual(last, wantLast) {
		t.Errorf("last lines %q, want %q", last, wantLast)
	}

	// A spec only ebpf-proxy fails fails the run, and is no limit.
	ours2, err := ReadReport("ebpf-proxy", report(t, strings.Join([]string{affinity, latency}, ",")))
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if Summary(&b, []Result{kp, ours2}) {
		t.Errorf("a spec only ebpf-proxy fails passed the run:\n%s", b.String())
	}
	if strings.Contains(b.String(), "session affinity work for service with type clusterIP [LinuxOnly] [Conformance]  [environment") {
		t.Errorf("a spec one proxy passes is named an environment limit:\n%s", b.String())
	}

	// Alone, ebpf-proxy passes only without failures.
	b.Reset()
	if Summary(&b, []Result{ours}) {
		t.Errorf("ebpf-proxy alone with a failure passed:\n%s", b.String())
	}
}

func TestInterruptedSpecIsNotCounted(t *testing.T) {
	r, err := ReadReport("kube-proxy", report(t, basic+","+strings.Replace(latency, `"State":"timedout"`, `"State":"interrupted"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if r.Passed != 1 || r.Failed != 0 || len(r.Interrupted) != 1 {
		t.Errorf("passed=%d failed=%d interrupted=%q, want 1 0 and the latency spec", r.Passed, r.Failed, r.Interrupted)
	}
	var b strings.Builder
	if Summary(&b, []Result{r}) || !strings.Contains(b.String(), "interrupted, not counted: [sig-network] Service endpoints latency") {
		t.Errorf("an interrupted run passed, or its spec is not named:\n%s", b.String())
	}
}

func TestSetupFailureFailsTheRun(t *testing.T) {
	r, err := ReadReport("kube-proxy", report(t, `{"LeafNodeType":"SynchronizedBeforeSuite","State":"failed","NumAttempts":1,"Failure":{"Message":"nodes not ready\ndetails"}},`+
		strings.Replace(basic, `"State":"passed"`, `"State":"skipped"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"SynchronizedBeforeSuite: nodes not ready"}; !reflect.DeepEqual(r.SetupFailures, want) {
		t.Errorf("setup failures %q, want %q", r.SetupFailures, want)
	}
	var b strings.Builder
	if Summary(&b, []Result{r}) {
		t.Errorf("a failed setup passed:\n%s", b.String())
	}
}

func TestSkipExpressionJoinsTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "skips.txt")
	if err := os.WriteFile(p, []byte("# why\n\\[Feature:LoadBalancer\\]\n\n  # indented comment\nInternet connection\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := skipExpression(p, "extra")
	if err != nil {
		t.Fatal(err)
	}
	if want := `\[Feature:LoadBalancer\]|Internet connection|extra`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if err := os.WriteFile(p, []byte("(unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := skipExpression(p, ""); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("a bad expression: error %v, want one naming its line", err)
	}
}

func TestSpecProgressPrintsVerdicts(t *testing.T) {
	var b strings.Builder
	p := &specProgress{proxy: "kube-proxy", out: &b}
	for _, chunk := range []string{
		"some log\n------------------------------\nSSSS\n------------------------------\n",
		"[sig-network] Services should serve [Conformance] [sig-network, Conformance]\n  STEP: x\n• [12.3", "45 seconds]\n",
		"------------------------------\n[sig-network] Conntrack should preserve\n  I1206 skip\nS [SKIPPED] [0.512 seconds]\n",
		"------------------------------\nSSS\n------------------------------\n[sig-network] Services should fail\n  STEP: y\n• [FAILED] [61.000 seconds]\n",
		"[sig-network] Services should fail\n/path/file.go:12\n------------------------------\n",
	} {
		if _, err := p.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	p.flush()
	want := "conformance: kube-proxy: PASSED 12.345s [sig-network] Services should serve [Conformance] [sig-network, Conformance]\n" +
		"conformance: kube-proxy: FAILED 61.000s [sig-network] Services should fail\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestWithoutKindDropsTheDaemonSet(t *testing.T) {
	m := "# head\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kube-proxy\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: kube-proxy\n---\nkind: ServiceAccount\n"
	got, err := withoutKind(m, "DaemonSet")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(got, "DaemonSet") || !strings.Contains(got, "kind: ConfigMap") || !strings.Contains(got, "kind: ServiceAccount") {
		t.Errorf("got\n%s", got)
	}
	if _, err := withoutKind(m, "Deployment"); err == nil {
		t.Error("a manifest without the kind: no error")
	}
}

// A spec kube-proxy passed that skipped itself with ebpf-proxy (the suite
// looks for kube-proxy's pods, or asks /proxyMode) is named, with the
// reason, apart from the failures; it is not one of them.
func TestSummaryNamesSpecsThatRanWithKubeProxyOnly(t *testing.T) {
	restart := `{"ContainerHierarchyTexts":["[sig-network] Services"],"LeafNodeType":"It","LeafNodeText":"should work after restarting kube-proxy [Disruptive]","State":"%s","NumAttempts":1,"Failure":{"Message":"%s"}}`
	kp, err := ReadReport("kube-proxy", report(t, strings.Join([]string{basic, fmt.Sprintf(restart, "passed", "")}, ",")))
	if err != nil {
		t.Fatal(err)
	}
	ours, err := ReadReport("ebpf-proxy", report(t, strings.Join([]string{basic, fmt.Sprintf(restart, "skipped", "Skipped because component:kube-proxy is not running as pod.")}, ",")))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if !Summary(&out, []Result{kp, ours}) {
		t.Errorf("a spec that skipped itself failed the run:\n%s", out.String())
	}
	want := "conformance: passed with kube-proxy, skipped itself with ebpf-proxy (1):\n" +
		"  [sig-network] Services should work after restarting kube-proxy [Disruptive]  [skipped with ebpf-proxy: Skipped because component:kube-proxy is not running as pod.]\n" +
		"conformance: proxy=kube-proxy ran=2 passed=2 failed=0 skipped=0\n" +
		"conformance: proxy=ebpf-proxy ran=1 passed=1 failed=0 skipped=1\n"
	if out.String() != want {
		t.Errorf("summary:\n%s\nwant:\n%s", out.String(), want)
	}
}

// localhostNodePorts is the spec that asks for kube-proxy's iptables mode
// (it reads /proxyMode and route_localnet), as each run reports it.
const localhostNodePorts = `{"ContainerHierarchyTexts":["[sig-network] KubeProxy"],"LeafNodeType":"It","LeafNodeText":"should update metric for tracking accepted packets destined for localhost nodeports [Feature:KubeProxyNFAcct]","State":"%s","NumAttempts":1,"Failure":{"Message":"%s"}}`

const localhostName = "[sig-network] KubeProxy should update metric for tracking accepted packets destined for localhost nodeports [Feature:KubeProxyNFAcct]"

// A spec kube-proxy passed that skipped itself with ebpf-proxy for want of
// kube-proxy's iptables mode is run again with ebpf-proxy in that mode:
// passed there, the run passes and the summary says so; skipped there
// too, or not run, it fails; the summary lines stay one per run of the
// selection.
func TestModeSpecificSpecsRunWithEbpfProxyInThatMode(t *testing.T) {
	read := func(proxy, state, msg string) Result {
		t.Helper()
		r, err := ReadReport(proxy, report(t, strings.Join([]string{basic, fmt.Sprintf(localhostNodePorts, state, msg)}, ",")))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	kp := read("kube-proxy", "passed", "")
	ours := read("ebpf-proxy", "skipped", "test requires iptables proxy mode with route_localnet set")
	if got := ModeSpecific(kp, ours); !reflect.DeepEqual(got, map[string][]string{"iptables": {localhostName}}) {
		t.Fatalf("ModeSpecific = %v", got)
	}
	// Ginkgo matches the focus against the suite's description and the
	// spec's text, space-separated.
	if f := focusOn([]string{localhostName}); !regexp.MustCompile(f).MatchString("Kubernetes e2e suite "+localhostName) ||
		regexp.MustCompile(f).MatchString("Kubernetes e2e suite [sig-network] KubeProxy should set TCP CLOSE_WAIT timeout [Privileged]") {
		t.Errorf("focus %s selects the wrong specs", f)
	}
	mode := func(state, msg string) Result {
		r, err := ReadReport("ebpf-proxy", report(t, fmt.Sprintf(localhostNodePorts, state, msg)))
		if err != nil {
			t.Fatal(err)
		}
		r.Mode = "iptables"
		return r
	}
	lines := "conformance: proxy=kube-proxy ran=2 passed=2 failed=0 skipped=0\n" +
		"conformance: proxy=ebpf-proxy ran=1 passed=1 failed=0 skipped=1\n"
	for _, tc := range []struct {
		name string
		runs []Result
		ok   bool
		want string
	}{
		{"passed in iptables mode", []Result{kp, ours, mode("passed", "")}, true,
			"conformance: passed with kube-proxy, skipped itself with ebpf-proxy (1):\n" +
				"  " + localhostName + "  [skipped with ebpf-proxy: test requires iptables proxy mode with route_localnet set; passed with ebpf-proxy --proxy-mode=iptables]\n" + lines},
		{"skipped in iptables mode too", []Result{kp, ours, mode("skipped", "test requires iptables proxy mode with route_localnet set")}, false,
			"conformance: skipped with ebpf-proxy --proxy-mode=iptables too: " + localhostName + "  [test requires iptables proxy mode with route_localnet set]\n" +
				"conformance: passed with kube-proxy, skipped itself with ebpf-proxy (1):\n" +
				"  " + localhostName + "  [skipped with ebpf-proxy: test requires iptables proxy mode with route_localnet set]\n" + lines},
		{"failed in iptables mode", []Result{kp, ours, mode("failed", "metric not updated")}, false,
			"conformance: failed with ebpf-proxy --proxy-mode=iptables (1):\n  " + localhostName + "\n" +
				"conformance: passed with kube-proxy, skipped itself with ebpf-proxy (1):\n" +
				"  " + localhostName + "  [skipped with ebpf-proxy: test requires iptables proxy mode with route_localnet set]\n" + lines},
		{"not run in iptables mode", []Result{kp, ours}, false,
			"conformance: not run with ebpf-proxy --proxy-mode=iptables: " + localhostName + "\n" +
				"conformance: passed with kube-proxy, skipped itself with ebpf-proxy (1):\n" +
				"  " + localhostName + "  [skipped with ebpf-proxy: test requires iptables proxy mode with route_localnet set]\n" + lines},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if ok := Summary(&out, tc.runs); ok != tc.ok {
				t.Errorf("Summary = %v, want %v:\n%s", ok, tc.ok, out.String())
			}
			if out.String() != tc.want {
				t.Errorf("summary:\n%s\nwant:\n%s", out.String(), tc.want)
			}
		})
	}
}

// The overlay runs deploy/ in another mode by replacing its
// --proxy-mode=auto, after checking that it says so.
func TestOverlayRunsTheAgentInAMode(t *testing.T) {
	// A commit's short hash may be all digits: the tag must stay a string.
	c := &runConfig{out: t.TempDir(), deploy: "../../deploy", agentImage: "ebpf-proxy:2405537"}
	for _, mode := range []string{"", "iptables"} {
		dir, err := c.overlay(mode)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		k := string(b)
		if got := strings.Contains(k, "value: --proxy-mode=iptables"); got != (mode == "iptables") {
			t.Errorf("mode %q: the overlay sets iptables mode: %v\n%s", mode, got, k)
		}
		var parsed struct {
			Images []struct {
				NewName string `json:"newName"`
				NewTag  string `json:"newTag"`
			} `json:"images"`
		}
		if err := yaml.Unmarshal(b, &parsed); err != nil {
			t.Errorf("mode %q: the overlay does not parse as kustomize reads it: %v\n%s", mode, err, k)
		} else if len(parsed.Images) != 1 || parsed.Images[0].NewName != "ebpf-proxy" || parsed.Images[0].NewTag != "2405537" {
			t.Errorf("mode %q: the overlay's images are %+v, want ebpf-proxy:2405537", mode, parsed.Images)
		}
		if !strings.Contains(k, "path: /spec/template/metadata/labels/k8s-app") {
			t.Errorf("mode %q: the overlay lacks the pod label:\n%s", mode, k)
		}
	}
	// The patch's test op holds deploy/'s line as shipped.
	d, err := os.ReadFile("../../deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(d), "            - /ebpf-proxy\n") || !strings.Contains(string(d), "            - --proxy-mode=auto\n") {
		t.Error("deploy/daemonset.yaml no longer has --proxy-mode=auto where the overlay's patch expects it")
	}
}

func TestOverlayAddsTheAgentArgs(t *testing.T) {
	c := &runConfig{out: t.TempDir(), deploy: "../../deploy", agentImage: "ebpf-proxy:dev", agentArgs: []string{"--socket-lb-scope=node", "-v=3"}}
	dir, err := c.overlay("")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Patches []struct {
			Patch string `json:"patch"`
		} `json:"patches"`
	}
	if err := yaml.Unmarshal(b, &parsed); err != nil {
		t.Fatalf("the overlay does not parse: %v\n%s", err, b)
	}
	var ops []struct {
		Op, Path string
		Value    any
	}
	for _, p := range parsed.Patches {
		var these []struct {
			Op, Path string
			Value    any
		}
		if err := yaml.Unmarshal([]byte(p.Patch), &these); err != nil {
			t.Fatalf("a patch does not parse: %v\n%s", err, p.Patch)
		}
		ops = append(ops, these...)
	}
	var added []any
	for _, op := range ops {
		if op.Op == "add" && op.Path == "/spec/template/spec/containers/0/command/-" {
			added = append(added, op.Value)
		}
	}
	if len(added) != 2 || added[0] != "--socket-lb-scope=node" || added[1] != "-v=3" {
		t.Errorf("the overlay adds %v to the agent's command, want [--socket-lb-scope=node -v=3]\n%s", added, b)
	}
}
