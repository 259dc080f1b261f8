package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/kernel"
	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/vm"
)

// errNoPackages: the patterns match no package with tests.
var errNoPackages = errors.New("no packages with tests")

// pkg is a package with tests, compiled once for every column.
type pkg struct {
	importPath string
	// name is the import path relative to the module, for the table.
	name string
	dir  string
	// bin is the compiled test binary; empty when the build failed.
	bin      string
	buildErr string
	// kernels are the --kernels specs whose VMs run it; empty for all.
	kernels []string
	// vmRun is the -test.run of its runs in the VMs (a --run rule);
	// empty runs every test. The host runs every test.
	vmRun string
}

type matrixFlags struct {
	vmFlags
	kernels    string
	host       bool
	out        string
	jobTimeout time.Duration
	buildFlags string
	// timeoutSet: --timeout was given; otherwise a VM's deadline grows
	// with the number of test binaries it runs (vmDeadline).
	timeoutSet bool
	// only are the --only rules, in the order given.
	only onlyRules
	// run are the --run rules, in the order given.
	run runRules
}

// runRule narrows the tests of the packages of a go list pattern in the
// VMs to those a go test -run expression selects: those whose behaviour
// depends on the kernel's version, when the rest, run on the host's
// kernel, would repeat there what the host shows at several times the
// cost.
type runRule struct {
	pattern, run string
}

// runRules is the repeatable --run flag: PATTERN=REGEXP.
type runRules []runRule

func (r *runRules) String() string {
	var parts []string
	for _, x := range *r {
		parts = append(parts, x.pattern+"="+x.run)
	}
	return strings.Join(parts, " ")
}

func (r *runRules) Set(v string) error {
	pattern, run, ok := strings.Cut(v, "=")
	if !ok || pattern == "" || run == "" {
		return fmt.Errorf("want PATTERN=REGEXP, got %q", v)
	}
	// go test splits the expression at slashes outside brackets and
	// parentheses, one part per level of subtests; a part that does not
	// compile would fail every test binary it is given to.
	for _, part := range splitRun(run) {
		if _, err := regexp.Compile(part); err != nil {
			return fmt.Errorf("--run %s: %w", v, err)
		}
	}
	*r = append(*r, runRule{pattern: pattern, run: run})
	return nil
}

// splitRun splits a -run expression as go test does: at each slash that
// is outside brackets and parentheses.
func splitRun(run string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(run); i++ {
		switch run[i] {
		case '[', '(':
			depth++
		case ']', ')':
			depth--
		case '\\':
			i++
		case '/':
			if depth == 0 {
				parts = append(parts, run[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, run[start:])
}

// onlyRule gives the packages of a go list pattern to some of the
// matrix's kernels (as named in --kernels), or to none of them with the
// name hostOnly; the host column runs every package.
type onlyRule struct {
	pattern string
	kernels []string
}

// hostOnly, as a rule's kernel, keeps its packages out of every VM: they
// run on the host's kernel alone.
const hostOnly = "host"

// onlyRules is the repeatable --only flag: PATTERN=KERNEL[,KERNEL...].
type onlyRules []onlyRule

func (r *onlyRules) String() string {
	var parts []string
	for _, x := range *r {
		parts = append(parts, x.pattern+"="+strings.Join(x.kernels, ","))
	}
	return strings.Join(parts, " ")
}

func (r *onlyRules) Set(v string) error {
	pattern, list, ok := strings.Cut(v, "=")
	kernels := strings.FieldsFunc(list, func(c rune) bool { return c == ',' })
	if !ok || pattern == "" || len(kernels) == 0 {
		return fmt.Errorf("want PATTERN=KERNEL[,KERNEL...], got %q", v)
	}
	*r = append(*r, onlyRule{pattern: pattern, kernels: kernels})
	return nil
}

// assignKernels sets each package's kernels from the --only rules: the
// kernels of every rule whose pattern matches it and names a kernel of
// the matrix. A package no rule matches, or whose rules name none of the
// matrix's kernels, runs on all of them: a rule that names kernels never
// drops a package from every VM. Only a rule that names hostOnly does.
func (mf *matrixFlags) assignKernels(ctx context.Context, pkgs []*pkg, specs []string) error {
	for _, r := range mf.only {
		matched, err := listPackages(ctx, []string{r.pattern})
		if err != nil {
			return fmt.Errorf("--only %s=%s: %w", r.pattern, strings.Join(r.kernels, ","), err)
		}
		var named []string
		for _, k := range r.kernels {
			if k == hostOnly || slices.Contains(specs, k) {
				named = append(named, k)
			}
		}
		if len(named) == 0 {
			continue
		}
		for _, m := range matched {
			for _, p := range pkgs {
				if p.importPath == m.importPath {
					p.kernels = append(p.kernels, named...)
				}
			}
		}
	}
	for _, r := range mf.run {
		matched, err := listPackages(ctx, []string{r.pattern})
		if err != nil {
			return fmt.Errorf("--run %s=%s: %w", r.pattern, r.run, err)
		}
		for _, m := range matched {
			for _, p := range pkgs {
				if p.importPath != m.importPath {
					continue
				}
				if p.vmRun != "" && p.vmRun != r.run {
					return fmt.Errorf("--run: %s has two expressions, %q and %q", p.name, p.vmRun, r.run)
				}
				p.vmRun = r.run
			}
		}
	}
	return nil
}

// runsOn reports whether p runs in the VM of kernel spec.
func (p *pkg) runsOn(spec string) bool {
	return len(p.kernels) == 0 || spec != hostOnly && slices.Contains(p.kernels, spec)
}

// vmDeadline is the default deadline of a VM that runs n test binaries:
// boot plus a generous allowance per binary. The packages' own run times
// under TCG add up to several minutes and grow with the suite, and a busy
// host stretches them by half again, so a fixed deadline made the matrix
// fail for want of time while every test was passing. A binary that hangs
// is still stopped by its own --job-timeout. The allowance is 150 s: CI's
// machine ran the guests' packages 2 to 2.7 times as long as a quiet one
// (loader 155 s against 60, sandbox 42 against 17), and at 90 s its 6.12
// guest met the deadline of 20 binaries, 32 minutes, with every package it
// had run passing. Then 200 s: with 150 s, a 6.1 guest of 15 binaries
// (39.5 minutes) ran for 38 minutes when every package passed, and met
// the deadline on a day the host had 50 % steal time.
func vmDeadline(n int) time.Duration {
	return 2*time.Minute + time.Duration(n)*200*time.Second
}

func matrixMain(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("vmtest matrix", flag.ContinueOnError)
	var mf matrixFlags
	mf.register(fs)
	fs.StringVar(&mf.kernels, "kernels", "6.1 6.12", "kernels to run on, space-separated series or releases")
	fs.BoolVar(&mf.host, "host", true, "also run on the host kernel")
	fs.StringVar(&mf.out, "out", "", "directory for test binaries and logs (default: a new temporary directory, removed when everything passes)")
	// 20 minutes: a machine of CI's kind ran internal/fallback/iptables
	// for 480 s in both guests (CI's: 222 s), and 8 minutes stopped it
	// on 6.1 with every test it had run passing; test/modes took 472 s
	// on 6.1 in one run and 722 s, past 12 minutes, in a later run on the
	// same machine, when the guests ran everything a third slower. A hung
	// binary is still stopped, and the VM's deadline (vmDeadline) still
	// bounds them all.
	fs.DurationVar(&mf.jobTimeout, "job-timeout", 20*time.Minute, "deadline for one test binary")
	fs.StringVar(&mf.buildFlags, "build-flags", "", "extra flags for go test -c, space-separated")
	fs.Var(&mf.run, "run", "PATTERN=REGEXP: in the VMs, run only the tests of the packages of a go list pattern that go test -run REGEXP selects (the host runs them all); repeatable")
	fs.Var(&mf.only, "only", "PATTERN=KERNEL[,KERNEL...]: run the packages of a go list pattern only in the VMs of those kernels (as in --kernels), or in none with \"host\" (the host runs every package); repeatable")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "timeout" {
			mf.timeoutSet = true
		}
	})
	patterns := fs.Args()
	if len(patterns) == 0 {
		patterns = []string{"./test/vmtest/..."}
	}
	start := time.Now()

	pkgs, err := listPackages(ctx, patterns)
	if err != nil {
		return harnessError(err)
	}
	// Other runs may be going on at the same time on a shared machine:
	// each gets its own directory unless told otherwise.
	out, removeOut := mf.out, false
	if out == "" {
		if out, err = os.MkdirTemp("", "ebpf-proxy-vmtest-"); err != nil {
			return harnessError(err)
		}
		removeOut = true
	}
	binDir, logDir := filepath.Join(out, "bin"), filepath.Join(out, "logs")
	for _, d := range []string{binDir, logDir} {
		if err := os.RemoveAll(d); err != nil {
			return harnessError(err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return harnessError(err)
		}
	}
	defer os.RemoveAll(binDir)

	// Kernels download and unpack while the test binaries compile.
	specs := strings.Fields(mf.kernels)
	if err := mf.assignKernels(ctx, pkgs, specs); err != nil {
		return harnessError(err)
	}
	for _, p := range pkgs {
		if p.vmRun != "" {
			fmt.Fprintf(os.Stderr, "vmtest: in the VMs %s runs only the tests of -run %s; the host runs them all\n", p.name, p.vmRun)
		}
	}
	kernels := make([]*kernel.Kernel, len(specs))
	kernelErrs := make([]error, len(specs))
	var wg sync.WaitGroup
	cache := &kernel.Cache{Dir: mf.cache, Log: os.Stderr}
	for i, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kernels[i], kernelErrs[i] = cache.Get(ctx, spec)
		}()
	}
	buildStart := time.Now()
	buildAll(ctx, pkgs, binDir, strings.Fields(mf.buildFlags))
	fmt.Fprintf(os.Stderr, "vmtest: compiled %d test binaries in %.1fs\n", len(pkgs), time.Since(buildStart).Seconds())
	wg.Wait()
	if ctx.Err() != nil {
		return harnessError(ctx.Err())
	}

	cols := make([]*column, 0, len(specs)+1)
	for i, spec := range specs {
		c := &column{release: spec}
		if kernels[i] != nil {
			c.release = kernels[i].Release
		}
		cols = append(cols, c)
	}
	var host *column
	if mf.host {
		host = &column{release: hostRelease()}
		cols = append(cols, host)
	}
	for i, c := range cols[:len(specs)] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if kernelErrs[i] != nil {
				c.about = "not run: " + kernelErrs[i].Error()
				c.cells = notRun(pkgs, stateNotRun)
				return
			}
			mf.runVM(ctx, c, specs[i], kernels[i], pkgs, filepath.Join(logDir, c.release))
		}()
	}
	if host != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mf.runHost(ctx, host, pkgs, filepath.Join(logDir, "host-"+host.release))
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return harnessError(ctx.Err())
	}

	names := make([]string, len(pkgs))
	for i, p := range pkgs {
		names[i] = p.name
	}
	failed := false
	for _, c := range cols {
		if _, n := c.counts(); n > 0 {
			failed = true
		}
	}
	printFailures(os.Stdout, names, cols)
	logs := "logs in " + logDir
	if removeOut && !failed {
		os.RemoveAll(out)
		logs = "all passed, logs removed"
	}
	fmt.Printf("vmtest: %d packages on %d kernels in %.1fs; %s\n", len(pkgs), len(cols), time.Since(start).Seconds(), logs)
	printMatrix(os.Stdout, names, cols)
	if failed {
		return 1
	}
	return 0
}

// listPackages resolves the patterns to the packages that have tests.
func listPackages(ctx context.Context, patterns []string) ([]*pkg, error) {
	const format = `{{.ImportPath}}	{{.Dir}}	{{.Module.Path}}	{{len .TestGoFiles}}	{{len .XTestGoFiles}}`
	cmd := exec.CommandContext(ctx, "go", append([]string{"list", "-f", format}, patterns...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", strings.Join(patterns, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	var pkgs []*pkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			return nil, fmt.Errorf("go list: unexpected line %q", sc.Text())
		}
		if f[3] == "0" && f[4] == "0" {
			continue
		}
		name := strings.TrimPrefix(strings.TrimPrefix(f[0], f[2]), "/")
		if name == "" {
			name = "."
		}
		pkgs = append(pkgs, &pkg{importPath: f[0], name: name, dir: f[1]})
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("%w in %s", errNoPackages, strings.Join(patterns, " "))
	}
	return pkgs, nil
}

// buildAll compiles the test binaries, two at a time: each go test -c links
// a whole binary, and the machine has two cores. CGO_ENABLED=0 makes them
// independent of the C library, as in CI.
func buildAll(ctx context.Context, pkgs []*pkg, binDir string, flags []string) {
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, p := range pkgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			bin := filepath.Join(binDir, strings.ReplaceAll(p.name, "/", "_")+".test")
			args := append(append([]string{"test", "-c", "-o", bin}, flags...), p.importPath)
			var out []byte
			var err error
			// A second try costs a few seconds for a real compile
			// error and rides over a build cache that another go
			// command on a shared machine was trimming ("could not
			// import io/fs (open : no such file or directory)").
			for try := 0; try < 2 && ctx.Err() == nil; try++ {
				cmd := exec.CommandContext(ctx, "go", args...)
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
				if out, err = cmd.CombinedOutput(); err == nil {
					p.bin = bin
					return
				}
			}
			p.buildErr = fmt.Sprintf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}()
	}
	wg.Wait()
}

// testParallel is the -test.parallel of every test binary. Go's default is
// the number of CPUs, one in a guest, which ran the parallel tests (the
// behaviour tables: probes between namespaces, half of them waiting out a
// timeout to see a drop) one at a time; they wait far more than they
// compute.
const testParallel = 4

// testArgs are the arguments of p's test binary; inVM adds the -test.run
// of its --run rule.
func (mf *matrixFlags) testArgs(p *pkg, inVM bool) []string {
	args := []string{p.bin, "-test.v", "-test.paniconexit0", "-test.timeout=" + mf.jobTimeout.String(),
		"-test.parallel=" + strconv.Itoa(testParallel)}
	if inVM && p.vmRun != "" {
		args = append(args, "-test.run="+p.vmRun)
	}
	return args
}

// runVM runs in one VM every package that runs on kernel spec.
func (mf *matrixFlags) runVM(ctx context.Context, c *column, spec string, k *kernel.Kernel, pkgs []*pkg, logDir string) {
	c.cells = make([]cell, len(pkgs))
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		c.about = "not run: " + err.Error()
		c.cells = notRun(pkgs, stateNotRun)
		return
	}
	cfg, err := mf.config(ctx, k, os.Stderr)
	if err != nil {
		c.about = "not run: " + err.Error()
		c.cells = notRun(pkgs, stateNotRun)
		return
	}
	c.about = fmt.Sprintf("Debian %s %s in QEMU (%s)", k.Package, k.DebVersion, cfg.Accel)
	env := guestEnv(os.Environ())
	var jobs []vm.Job
	var idx []int
	var logs []*os.File
	for i, p := range pkgs {
		if !p.runsOn(spec) {
			c.cells[i].state = stateElsewhere
			continue
		}
		c.cells[i].log = filepath.Join(logDir, strings.ReplaceAll(p.name, "/", "_")+".log")
		if p.bin == "" {
			c.cells[i].state = stateBuild
			_ = os.WriteFile(c.cells[i].log, []byte(p.buildErr), 0o644)
			continue
		}
		f, err := os.Create(c.cells[i].log)
		if err != nil {
			c.cells[i].state = stateNotRun
			continue
		}
		logs = append(logs, f)
		jobs = append(jobs, vm.Job{
			Args:    mf.testArgs(p, true),
			Dir:     p.dir,
			Env:     env,
			Timeout: mf.jobTimeout + 30*time.Second,
			Stdout:  f,
			Stderr:  f,
		})
		idx = append(idx, i)
	}
	if !mf.timeoutSet {
		cfg.Timeout = vmDeadline(len(jobs))
	}
	res, err := vm.Run(ctx, cfg, jobs)
	for _, f := range logs {
		f.Close()
	}
	if res != nil && guestPanicked(err) {
		// The emulator, not the code under test, panics a guest now
		// and then (../shared/notes/vmtest.md: TCG's cross-modifying
		// code race with the kernel's text patching). The jobs the
		// panic cut short run once more in a fresh VM with one vCPU; a
		// panic that comes again fails the column as before.
		res, err = mf.retryUnfinished(ctx, c, cfg, jobs, idx, res, err)
	}
	vmState := ""
	if err != nil {
		vmState = vmFailureState(err)
		c.notes = append(c.notes, err.Error())
		if tail := vm.ConsoleTail(err); tail != "" {
			c.notes = append(c.notes, "console tail:\n"+tail)
		}
	}
	if res == nil {
		res = &vm.Result{Jobs: make([]vm.JobResult, len(jobs))}
	}
	for j, i := range idx {
		jr := res.Jobs[j]
		if !jr.Ran {
			// The VM failed under the first job that did not
			// finish; the ones after it never started.
			c.cells[i].state = vmState
			if c.cells[i].state == "" {
				c.cells[i].state = stateNotRun
			}
			vmState = stateNotRun
			continue
		}
		out, _ := os.ReadFile(c.cells[i].log)
		c.cells[i].state = verdict(jr.ExitCode, jr.TimedOut, out)
		c.cells[i].elapsed = jr.Elapsed
	}
	if len(res.Missing) > 0 {
		c.notes = append(c.notes, "modules unavailable: "+strings.Join(res.Missing, " "))
	}
	for _, p := range res.Problems {
		c.notes = append(c.notes, "kernel logged: "+p)
	}
	c.notes = append(c.notes, fmt.Sprintf("VM wall time %.1fs, QEMU CPU time %.1fs", res.Wall.Seconds(), res.CPU.Seconds()))
}

// guestPanicked reports whether a run failed with a guest kernel panic,
// at boot or under a job.
func guestPanicked(err error) bool {
	var pe *vm.PanicError
	var be *vm.BootError
	return errors.As(err, &pe) || errors.As(err, &be) && strings.Contains(be.Console, "Kernel panic")
}

// retryUnfinished runs once more, in a fresh VM with one vCPU, the jobs of
// first that did not finish because the guest panicked (err), each with a
// new log that says so, and returns the results merged: the retry's for
// those jobs, its error, the first run's wall time added. The column's
// notes say the retry happened, whatever its outcome.
func (mf *matrixFlags) retryUnfinished(ctx context.Context, c *column, cfg vm.Config, jobs []vm.Job, idx []int,
	first *vm.Result, err error) (*vm.Result, error) {
	var again []vm.Job
	var which []int
	var logs []*os.File
	for j, jr := range first.Jobs {
		if jr.Ran {
			continue
		}
		f, ferr := os.Create(c.cells[idx[j]].log)
		if ferr != nil {
			return first, err
		}
		fmt.Fprintf(f, "vmtest: the first run of this job ended in a guest panic (%v); this is the retry\n", err)
		job := jobs[j]
		job.Stdout, job.Stderr = f, f
		again = append(again, job)
		which = append(which, j)
		logs = append(logs, f)
	}
	if len(again) == 0 {
		return first, err
	}
	c.notes = append(c.notes, fmt.Sprintf("guest panicked (%v): %d job(s) run again in a fresh VM with one vCPU", err, len(again)))
	if tail := vm.ConsoleTail(err); tail != "" {
		c.notes = append(c.notes, "console tail of the panic:\n"+tail)
	}
	fmt.Fprintf(os.Stderr, "vmtest: %s: guest panicked (%v); running %d job(s) again\n", c.release, err, len(again))
	cfg.CPUs = 1
	if !mf.timeoutSet {
		cfg.Timeout = vmDeadline(len(again))
	}
	res, err2 := vm.Run(ctx, cfg, again)
	for _, f := range logs {
		f.Close()
	}
	c.retried = true
	return mergeRetry(first, which, res), err2
}

// mergeRetry is first with the results of the jobs which that retry (nil
// if its VM never ran) ran again in their place.
func mergeRetry(first *vm.Result, which []int, retry *vm.Result) *vm.Result {
	merged := *first
	merged.Jobs = slices.Clone(first.Jobs)
	if retry != nil {
		for k, j := range which {
			if k < len(retry.Jobs) {
				merged.Jobs[j] = retry.Jobs[k]
			}
		}
		merged.Wall += retry.Wall
		merged.Problems = append(slices.Clone(first.Problems), retry.Problems...)
	}
	return &merged
}

func vmFailureState(err error) string {
	var (
		pe *vm.PanicError
		te *vm.TimeoutError
		be *vm.BootError
	)
	switch {
	case errors.As(err, &pe):
		return stateVMPanic
	case errors.As(err, &te):
		return stateVMTimeout
	case errors.As(err, &be):
		return stateVMBoot
	}
	return stateNotRun
}

// runHost runs every package on the host kernel, one after the other, as
// go test would, without EBPF_PROXY_VMTEST.
func (mf *matrixFlags) runHost(ctx context.Context, c *column, pkgs []*pkg, logDir string) {
	c.about = "the host's kernel, no VM"
	c.cells = make([]cell, len(pkgs))
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		c.about = "not run: " + err.Error()
		c.cells = notRun(pkgs, stateNotRun)
		return
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvVMTest+"=") {
			env = append(env, kv)
		}
	}
	for i, p := range pkgs {
		c.cells[i].log = filepath.Join(logDir, strings.ReplaceAll(p.name, "/", "_")+".log")
		if p.bin == "" {
			c.cells[i].state = stateBuild
			_ = os.WriteFile(c.cells[i].log, []byte(p.buildErr), 0o644)
			continue
		}
		c.cells[i] = mf.runHostJob(ctx, p, env, c.cells[i].log)
	}
}

func (mf *matrixFlags) runHostJob(ctx context.Context, p *pkg, env []string, logPath string) cell {
	c := cell{log: logPath}
	f, err := os.Create(logPath)
	if err != nil {
		c.state = stateNotRun
		return c
	}
	defer f.Close()
	jobCtx, cancel := context.WithTimeout(ctx, mf.jobTimeout+30*time.Second)
	defer cancel()
	args := mf.testArgs(p, false)
	cmd := exec.CommandContext(jobCtx, args[0], args[1:]...)
	cmd.Dir = p.dir
	cmd.Env = env
	cmd.Stdout = f
	cmd.Stderr = f
	// Kill the whole group at the deadline: tests start servers and
	// helper processes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err = cmd.Run()
	c.elapsed = time.Since(start)
	code := 0
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
		if code < 0 {
			code = 128 + int(syscall.SIGKILL)
		}
	default:
		fmt.Fprintf(f, "vmtest: %v\n", err)
		code = 126
	}
	out, _ := os.ReadFile(logPath)
	c.state = verdict(code, errors.Is(jobCtx.Err(), context.DeadlineExceeded), out)
	return c
}

func notRun(pkgs []*pkg, state string) []cell {
	cells := make([]cell, len(pkgs))
	for i := range cells {
		cells[i].state = state
	}
	return cells
}

func hostRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "host"
	}
	return unix.ByteSliceToString(uts.Release[:])
}
