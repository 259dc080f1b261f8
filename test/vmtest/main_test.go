package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/vm"
)

func TestWritableDirs(t *testing.T) {
	work := t.TempDir()
	b001 := filepath.Join(work, "b001")
	cover := filepath.Join(b001, "gocoverdir")
	other := filepath.Join(work, "profiles")
	for _, d := range []string{b001, cover, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{
			name: "plain go test -exec run shares nothing",
			args: []string{b001 + "/x.test", "-test.paniconexit0", "-test.timeout=10m0s", "-test.v=true"},
		},
		{
			name: "cover profile, test log and cover dir share their one outermost directory",
			args: []string{b001 + "/x.test", "-test.coverprofile=" + b001 + "/_cover_.out", "-test.testlogfile=" + b001 + "/testlog.txt", "-test.gocoverdir=" + cover},
			want: []string{b001},
		},
		{
			name: "separate value, double dash and relative path",
			args: []string{"./x.test", "--test.cpuprofile", "profiles/cpu.out", "-test.outputdir=" + other},
			want: []string{other},
		},
		{
			name: "GOCOVERDIR from the environment",
			args: []string{"./x.test"},
			env:  []string{"HOME=/root", "GOCOVERDIR=" + cover},
			want: []string{cover},
		},
		{
			name: "directories that do not exist are not shared",
			args: []string{"./x.test", "-test.coverprofile=" + filepath.Join(work, "gone", "c.out")},
		},
		{
			name: "flags of the command itself are not test flags",
			args: []string{"cp", "-coverprofile=" + b001 + "/c.out", "test.coverprofile=" + b001},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := writableDirs(tt.args, tt.env, work)
			if !slices.Equal(got, tt.want) {
				t.Errorf("writableDirs = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestGuestEnvMarksTheGuest(t *testing.T) {
	got := guestEnv([]string{"PATH=/usr/bin", "EBPF_PROXY_VMTEST=", "HOME=/root"})
	want := []string{"PATH=/usr/bin", "HOME=/root", "EBPF_PROXY_VMTEST=1"}
	if !slices.Equal(got, want) {
		t.Errorf("guestEnv = %q, want %q", got, want)
	}
}

func TestVerdict(t *testing.T) {
	tests := []struct {
		name     string
		code     int
		timedOut bool
		output   string
		want     string
	}{
		{"passing tests", 0, false, "=== RUN   TestA\n--- PASS: TestA (0.00s)\n--- SKIP: TestB (0.00s)\nPASS\n", stateOK},
		{"every test skipped", 0, false, "=== RUN   TestA\n    a_test.go:1: no IPVS here\n--- SKIP: TestA (0.00s)\nPASS\n", stateSkip},
		{"skipped subtests of a passing test", 0, false, "    --- SKIP: TestA/x (0.00s)\n--- PASS: TestA (0.00s)\nPASS\n", stateOK},
		{"no tests to run", 0, false, "testing: warning: no tests to run\nPASS\n", stateOK},
		{"failure", 1, false, "--- FAIL: TestA (0.00s)\nFAIL\n", stateFail},
		{"panic in a test", 2, false, "panic: boom\n", stateFail},
		{"killed at the deadline", 137, true, "=== RUN   TestA\n", stateTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := verdict(tt.code, tt.timedOut, []byte(tt.output)); got != tt.want {
				t.Errorf("verdict = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestPrintMatrix(t *testing.T) {
	pkgs := []string{"test/vmtest/ipvs", "test/vmtest/smoke"}
	cols := []*column{
		{release: "6.1.0-56-amd64", about: "Debian", cells: []cell{{state: stateOK, elapsed: 2100 * time.Millisecond}, {state: stateOK, elapsed: time.Second}}},
		{release: "6.12.117+deb12-amd64", about: "Debian", cells: []cell{{state: stateFail, elapsed: time.Second}, {state: stateVMPanic}},
			notes: []string{"modules unavailable: ip_vs_mh"}},
		{release: "6.18.44", about: "host", cells: []cell{{state: stateSkip, elapsed: 10 * time.Millisecond}, {state: stateOK, elapsed: time.Second}}},
	}
	cols[0].retried = true
	var b bytes.Buffer
	printMatrix(&b, pkgs, cols)
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	wantTail := []string{
		"vmtest: kernel=6.1.0-56-amd64 passed=2 failed=0 retried=1",
		"vmtest: kernel=6.12.117+deb12-amd64 passed=0 failed=2",
		"vmtest: kernel=6.18.44 passed=2 failed=0",
	}
	if got := lines[len(lines)-3:]; !slices.Equal(got, wantTail) {
		t.Errorf("summary lines =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantTail, "\n"))
	}
	for _, want := range []string{
		"test/vmtest/ipvs   ok 2.1s", "FAIL 1.0s", "VM-PANIC", "skip 0.0s",
		"vmtest: 6.12.117+deb12-amd64: modules unavailable: ip_vs_mh",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("matrix lacks %q:\n%s", want, out)
		}
	}
}

// A guest panic is told from other VM failures, also when it happens at
// boot, for the matrix to retry it once.
func TestGuestPanicked(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&vm.PanicError{Message: "Kernel panic - not syncing: Fatal exception in interrupt"}, true},
		{fmt.Errorf("run: %w", &vm.PanicError{Message: "Kernel panic - not syncing: Oops: int3"}), true},
		{&vm.BootError{Stage: "boot", Reason: "guest agent stopped", Console: "Oops: int3\nKernel panic - not syncing: Fatal exception"}, true},
		{&vm.BootError{Stage: "boot", Reason: "initramfs: no /init"}, false},
		{&vm.TimeoutError{Timeout: time.Minute, Stage: "jobs"}, false},
	} {
		if got := guestPanicked(tc.err); got != tc.want {
			t.Errorf("guestPanicked(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

// The retry's results replace those of the jobs it ran, and only those.
func TestMergeRetry(t *testing.T) {
	first := &vm.Result{Jobs: []vm.JobResult{{Ran: true, ExitCode: 0}, {Ran: false}, {Ran: false}},
		Wall: time.Minute, Problems: []string{"Oops: int3"}}
	retry := &vm.Result{Jobs: []vm.JobResult{{Ran: true, ExitCode: 1}, {Ran: true, ExitCode: 0}}, Wall: 30 * time.Second}
	got := mergeRetry(first, []int{1, 2}, retry)
	want := []vm.JobResult{{Ran: true, ExitCode: 0}, {Ran: true, ExitCode: 1}, {Ran: true, ExitCode: 0}}
	if !slices.Equal(got.Jobs, want) || got.Wall != 90*time.Second || len(got.Problems) != 1 {
		t.Errorf("merged %+v, want jobs %+v, wall 1m30s and the first run's problem", got, want)
	}
	if first.Jobs[1].Ran {
		t.Error("mergeRetry changed the first run's results")
	}
	if got := mergeRetry(first, []int{1, 2}, nil); !slices.Equal(got.Jobs, first.Jobs) {
		t.Errorf("a retry that never ran changed the results: %+v", got.Jobs)
	}
}

// --only gives a pattern's packages to the kernels it names; a package no
// rule matches runs on every kernel, and so does one whose rule names no
// kernel of the matrix, so that no rule drops a package from every VM.
func TestOnlyRulesAssignKernels(t *testing.T) {
	var rules onlyRules
	for _, bad := range []string{"./test/vmtest/smoke", "=6.1", "./test/vmtest/smoke=", "./x=,"} {
		if err := rules.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	// The patterns are go list's, from the package's directory.
	for _, r := range []string{"./smoke=6.1", "./kernel=6.12,6.1", "./vm=5.10", "./ipvs=host"} {
		if err := rules.Set(r); err != nil {
			t.Fatalf("Set(%q): %v", r, err)
		}
	}
	if got, want := rules.String(), "./smoke=6.1 ./kernel=6.12,6.1 ./vm=5.10 ./ipvs=host"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	ctx := t.Context()
	pkgs, err := listPackages(ctx, []string{"./..."})
	if err != nil {
		t.Fatal(err)
	}
	mf := &matrixFlags{only: rules}
	if err := mf.assignKernels(ctx, pkgs, []string{"6.1", "6.12"}); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]bool{ // runs on 6.1, on 6.12
		"test/vmtest/smoke":  {true, false},
		"test/vmtest/kernel": {true, true},
		"test/vmtest/vm":     {true, true},
		"test/vmtest/ipvs":   {false, false},
	}
	for _, p := range pkgs {
		w, ok := want[p.name]
		if !ok {
			continue
		}
		delete(want, p.name)
		if got := [2]bool{p.runsOn("6.1"), p.runsOn("6.12")}; got != w {
			t.Errorf("%s runs on 6.1, 6.12: %v, want %v", p.name, got, w)
		}
	}
	if len(want) > 0 {
		t.Errorf("packages not listed: %v", want)
	}
	bad := &matrixFlags{only: onlyRules{{pattern: "./no/such/package", kernels: []string{"6.1"}}}}
	if err := bad.assignKernels(ctx, pkgs, []string{"6.1"}); err == nil {
		t.Error("a rule whose pattern matches nothing was accepted")
	}
}

// A package given to other kernels counts neither as passed nor as failed,
// and shows as "-".
func TestCellsRunElsewhereAreNotCounted(t *testing.T) {
	c := &column{release: "6.12", cells: []cell{{state: stateOK, elapsed: time.Second}, {state: stateElsewhere}, {state: stateFail}}}
	if p, f := c.counts(); p != 1 || f != 1 {
		t.Errorf("counts() = %d passed, %d failed, want 1, 1", p, f)
	}
	var b bytes.Buffer
	printMatrix(&b, []string{"a", "b", "c"}, []*column{c})
	if !regexp.MustCompile(`(?m)^b +-$`).MatchString(b.String()) {
		t.Errorf("the table does not show the package run elsewhere as -:\n%s", b.String())
	}
	b.Reset()
	printFailures(&b, []string{"a", "b", "c"}, []*column{c})
	if strings.Contains(b.String(), "--- b on") {
		t.Errorf("a package run elsewhere is reported as failed:\n%s", b.String())
	}
}

// --run narrows a package's tests in the VMs and only there; an
// expression go test could not compile, or a second one for the same
// package, is refused.
func TestRunRulesNarrowTheVMsTests(t *testing.T) {
	var rules runRules
	for _, bad := range []string{"./smoke", "=Test", "./smoke=", "./smoke=Test(", "./smoke=TestA/(b"} {
		if err := rules.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if err := rules.Set("./smoke=IPVS|TestX/^(a|b/c)$"); err != nil {
		t.Fatal(err)
	}
	if got, want := splitRun("IPVS|TestX/^(a|b/c)$/[/]x"), []string{"IPVS|TestX", "^(a|b/c)$", "[/]x"}; !slices.Equal(got, want) {
		t.Errorf("splitRun = %q, want %q", got, want)
	}
	ctx := t.Context()
	pkgs, err := listPackages(ctx, []string{"./..."})
	if err != nil {
		t.Fatal(err)
	}
	mf := &matrixFlags{run: rules}
	if err := mf.assignKernels(ctx, pkgs, []string{"6.1"}); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pkgs {
		vm, host := strings.Join(mf.testArgs(p, true), " "), strings.Join(mf.testArgs(p, false), " ")
		if strings.Contains(host, "-test.run") {
			t.Errorf("%s on the host: %s", p.name, host)
		}
		if p.name != "test/vmtest/smoke" {
			if strings.Contains(vm, "-test.run") {
				t.Errorf("%s, matched by no rule, in a VM: %s", p.name, vm)
			}
			continue
		}
		found = true
		if !strings.HasSuffix(vm, " -test.run=IPVS|TestX/^(a|b/c)$") {
			t.Errorf("%s in a VM: %s", p.name, vm)
		}
	}
	if !found {
		t.Fatal("test/vmtest/smoke not listed")
	}
	mf.run = append(mf.run, runRule{pattern: "./smoke", run: "Other"})
	if err := mf.assignKernels(ctx, pkgs, []string{"6.1"}); err == nil {
		t.Error("two expressions for one package accepted")
	}
}
