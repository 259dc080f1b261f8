package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Result is what one proxy's run of the suite came to, read from ginkgo's
// JSON report (--ginkgo.json-report).
type Result struct {
	// Proxy is the proxy the cluster ran: kube-proxy or ebpf-proxy.
	Proxy string
	// Mode is ebpf-proxy's --proxy-mode when the run is of the specs that
	// ask for one of kube-proxy's modes (ModeSpecific); "" for the run of
	// the selection, in deploy/'s mode.
	Mode string
	// Passed, Failed and Skipped count the selected specs by outcome; a
	// spec skipped at run time (one node where it wants two) is Skipped,
	// one that the focus and skip expressions left out is not counted.
	// Failed counts every way of failing: failed, timed out, panicked,
	// aborted.
	Passed, Failed, Skipped int
	// Failures are the names of the failed specs, in the order they ran.
	Failures []string
	// PassedSpecs are the names of the passed specs, and SkippedSpecs
	// those skipped at run time with the reason, for the comparison of
	// two proxies' runs.
	PassedSpecs  []string
	SkippedSpecs map[string]string
	// SetupFailures are failures outside any spec (the suite's setup,
	// which fails every spec after it unrun): the run says nothing of
	// the proxy then.
	SetupFailures []string
	// SkipReasons counts the reasons of the run-time skips.
	SkipReasons map[string]int
	// Interrupted names the spec that a stopped run (Ctrl-C, a timeout
	// of the whole suite) cut short: neither passed nor failed.
	Interrupted []string
}

// Ran is the number of specs that ran to a verdict.
func (r Result) Ran() int { return r.Passed + r.Failed }

// specReport is the part of ginkgo's types.SpecReport that the summary
// reads; its JSON form is ginkgo's own.
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	NumAttempts             int
	Failure                 struct {
		Message string
	}
}

// suiteReport is one suite of a JSON report, which is a list of them.
type suiteReport struct {
	SuiteDescription string
	SpecReports      []specReport
}

// SpecName is the spec's full name as ginkgo prints it and --ginkgo.focus
// matches it: its containers' texts and its own, space-separated.
func (s specReport) SpecName() string {
	return strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")
}

// ReadReport reads the JSON report at path, a run of the suite with proxy.
func ReadReport(proxy, path string) (Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Result{}, err
	}
	var suites []suiteReport
	if err := json.Unmarshal(b, &suites); err != nil {
		return Result{}, fmt.Errorf("%s: %w", path, err)
	}
	r := Result{Proxy: proxy, SkipReasons: map[string]int{}, SkippedSpecs: map[string]string{}}
	for _, s := range suites {
		for _, spec := range s.SpecReports {
			r.add(spec)
		}
	}
	return r, nil
}

func (r *Result) add(spec specReport) {
	if spec.LeafNodeType != "It" {
		// The suite's own nodes (SynchronizedBeforeSuite, the report
		// writers): only their failures matter.
		if failedState(spec.State) {
			r.SetupFailures = append(r.SetupFailures, fmt.Sprintf("%s: %s", spec.LeafNodeType, firstLine(spec.Failure.Message)))
		}
		return
	}
	switch {
	case spec.State == "passed":
		r.Passed++
		r.PassedSpecs = append(r.PassedSpecs, spec.SpecName())
	case spec.State == "skipped" || spec.State == "pending":
		// A spec the filters left out was never attempted; one that
		// skipped itself (e2eskipper) was, once.
		if spec.NumAttempts > 0 {
			r.Skipped++
			r.SkipReasons[firstLine(spec.Failure.Message)]++
			r.SkippedSpecs[spec.SpecName()] = firstLine(spec.Failure.Message)
		}
	case spec.State == "interrupted":
		r.Interrupted = append(r.Interrupted, spec.SpecName())
	case failedState(spec.State):
		r.Failed++
		r.Failures = append(r.Failures, spec.SpecName())
	}
}

func failedState(s string) bool {
	switch s {
	case "failed", "timedout", "panicked", "interrupted", "aborted":
		return true
	}
	return false
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// modeSkips are the reasons with which specs skip themselves when they ask
// for one of kube-proxy's modes (they read /proxyMode), and the mode of
// ebpf-proxy that serves them.
var modeSkips = map[string]string{
	// "should update metric for tracking accepted packets destined for
	// localhost nodeports".
	"test requires iptables proxy mode": "iptables",
}

// ModeSpecific returns, by mode, the specs that kube-proxy passed in
// reference and that skipped themselves in ours because they ask for that
// mode of kube-proxy (modeSkips).
func ModeSpecific(reference, ours Result) map[string][]string {
	out := map[string][]string{}
	for _, name := range reference.PassedSpecs {
		why, skipped := ours.SkippedSpecs[name]
		if !skipped {
			continue
		}
		for reason, mode := range modeSkips {
			if strings.Contains(why, reason) {
				out[mode] = append(out[mode], name)
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Summary writes the failed specs of each result, a spec that failed with
// every proxy named an environment limit (the node, not the proxy, fails
// it), the specs kube-proxy passed that skipped themselves with ebpf-proxy
// (the suite decides from the proxy it finds: its /proxyMode), each with
// the reason and, for those that ask for a mode of kube-proxy, how they
// fared with ebpf-proxy in that mode, then one line per run of the
// selection (the runs of such specs alone have none):
//
//	conformance: proxy=P ran=N passed=P failed=F skipped=S
//
// It returns whether the proxies under test passed: no setup failed,
// ebpf-proxy failed no spec that kube-proxy passed (or, without a
// kube-proxy run to compare with, no spec at all), and passed in the mode
// they ask for those that skipped themselves for want of it.
func Summary(w io.Writer, results []Result) bool {
	failedBy := map[string]int{}
	for _, r := range results {
		for _, f := range r.Failures {
			failedBy[f]++
		}
	}
	limit := func(name string) bool { return len(results) > 1 && failedBy[name] == len(results) }
	ok := true
	var reference *Result
	modeRuns := map[string]Result{}
	for i := range results {
		switch {
		case results[i].Proxy == "kube-proxy":
			reference = &results[i]
		case results[i].Mode != "":
			modeRuns[results[i].Mode] = results[i]
		}
	}
	for _, r := range results {
		for _, f := range r.SetupFailures {
			fmt.Fprintf(w, "conformance: %s: suite setup failed: %s\n", r.Proxy, f)
			ok = false
		}
		for _, name := range r.Interrupted {
			fmt.Fprintf(w, "conformance: %s: interrupted, not counted: %s\n", r.Proxy, name)
			ok = false
		}
		if len(r.Failures) == 0 {
			continue
		}
		fmt.Fprintf(w, "conformance: failed with %s (%d):\n", r.label(), len(r.Failures))
		for _, f := range r.Failures {
			note := ""
			if limit(f) {
				note = "  [environment limit: fails with every proxy]"
			}
			fmt.Fprintf(w, "  %s%s\n", f, note)
			if r.Proxy == "ebpf-proxy" && (reference == nil || !slices.Contains(reference.Failures, f)) {
				ok = false
			}
		}
	}
	for _, r := range results {
		if r.Proxy != "ebpf-proxy" || r.Mode != "" || reference == nil {
			continue
		}
		// Each spec that asks for a mode of kube-proxy must pass with
		// ebpf-proxy in that mode: not run, or skipped there, fails the
		// comparison as a failure does (named above).
		var only []string
		for _, mode := range sortedKeys(ModeSpecific(*reference, r)) {
			for _, name := range ModeSpecific(*reference, r)[mode] {
				m, ran := modeRuns[mode]
				switch {
				case !ran:
					fmt.Fprintf(w, "conformance: not run with ebpf-proxy --proxy-mode=%s: %s\n", mode, name)
					ok = false
				case slices.Contains(m.PassedSpecs, name), slices.Contains(m.Failures, name):
				default:
					fmt.Fprintf(w, "conformance: skipped with ebpf-proxy --proxy-mode=%s too: %s  [%s]\n", mode, name, m.SkippedSpecs[name])
					ok = false
				}
			}
		}
		for _, name := range reference.PassedSpecs {
			why, skipped := r.SkippedSpecs[name]
			if !skipped {
				continue
			}
			note := fmt.Sprintf("skipped with ebpf-proxy: %s", why)
			for mode, m := range modeRuns {
				if slices.Contains(m.PassedSpecs, name) {
					note += fmt.Sprintf("; passed with ebpf-proxy --proxy-mode=%s", mode)
				}
			}
			only = append(only, fmt.Sprintf("  %s  [%s]", name, note))
		}
		if len(only) > 0 {
			fmt.Fprintf(w, "conformance: passed with kube-proxy, skipped itself with ebpf-proxy (%d):\n", len(only))
			for _, l := range only {
				fmt.Fprintln(w, l)
			}
		}
	}
	for _, r := range results {
		if r.Mode != "" {
			continue
		}
		fmt.Fprintf(w, "conformance: proxy=%s ran=%d passed=%d failed=%d skipped=%d\n", r.Proxy, r.Ran(), r.Passed, r.Failed, r.Skipped)
	}
	return ok
}

// label names the run in the summary: the proxy, with its mode for a run
// of the specs that ask for one.
func (r Result) label() string {
	if r.Mode == "" {
		return r.Proxy
	}
	return fmt.Sprintf("%s --proxy-mode=%s", r.Proxy, r.Mode)
}
