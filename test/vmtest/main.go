// Command vmtest runs commands and test binaries inside QEMU on Debian's
// kernels, so that the BPF programs, the fallbacks (IPVS, which the CI host
// lacks) and their tests are checked on the kernels operators run.
//
// Run a command or a test binary on one kernel:
//
//	go run ./test/vmtest --kernel 6.1 -- ./x.test -test.v
//	go test -exec "go run $PWD/test/vmtest --kernel 6.12 --" ./internal/loader
//
// go test -exec starts the runner in the package's directory, so name it by
// absolute path or import path there, or build it once with go build.
// --kernel is a series (6.1, 6.12: the newest Debian package of it) or an
// exact release (6.1.0-56-amd64). The command runs as root in the guest, in
// the current directory, with the current environment plus
// EBPF_PROXY_VMTEST=1; its output and exit code are passed through. The guest
// sees the host's files read-only at the same paths (a tmpfs overlay takes
// its writes); directories that test flags such as -test.coverprofile write
// to are shared read-write so that the files come back.
//
// Run the kernel matrix (see vmtest.mk):
//
//	go run ./test/vmtest matrix --kernels "6.1 6.12" -- ./internal/... ./test/vmtest/...
//
// Fetch and prepare kernels only:
//
//	go run ./test/vmtest fetch 6.1 6.12
//
// Exit codes other than the command's own: 120 the runner could not prepare
// the run, 121 the VM failed to boot (or its agent failed), 122 the guest
// kernel panicked, 124 the run timed out.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/guest"
	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/kernel"
	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/vm"
)

// EnvVMTest is set to 1 in the guest's environment so that tests can tell
// that they run inside the VM, where every privileged feature is expected to
// work.
const EnvVMTest = "EBPF_PROXY_VMTEST"

func main() {
	guest.RunIfAgent()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var code int
	switch {
	case len(os.Args) > 1 && os.Args[1] == "fetch":
		code = fetchMain(ctx, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "matrix":
		code = matrixMain(ctx, os.Args[2:])
	default:
		code = runMain(ctx, os.Args[1:])
	}
	stop()
	os.Exit(code)
}

// vmFlags are the flags shared by the run and matrix commands.
type vmFlags struct {
	cache    string
	timeout  time.Duration
	cpus     int
	memory   int
	accel    string
	modules  string
	more     string
	verbose  bool
	keep     bool
	qemuPath string
	tap      string
}

func (f *vmFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.cache, "cache", kernel.DefaultDir(), "kernel cache directory (default from $EBPF_PROXY_CACHE)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Minute, "deadline for one VM, boot included")
	fs.IntVar(&f.cpus, "cpus", 1, "guest CPUs (one: see vm.Config.CPUs)")
	fs.IntVar(&f.memory, "memory", 1536, "guest memory in MiB (see vm.Config.MemoryMB)")
	fs.StringVar(&f.accel, "accel", "auto", "auto (KVM if a probe boot works, else TCG), tcg or kvm")
	fs.StringVar(&f.modules, "modules", strings.Join(vm.DefaultModules, ","), "comma-separated modules to load in the guest (\"\" for none)")
	fs.StringVar(&f.more, "add-modules", "", "comma-separated modules to load besides those of --modules")
	fs.BoolVar(&f.verbose, "v", false, "copy the guest's serial console to stderr")
	fs.BoolVar(&f.keep, "keep", false, "keep the run directory (spec, outputs, console.log) for debugging")
	fs.StringVar(&f.qemuPath, "qemu", "qemu-system-x86_64", "QEMU binary")
	fs.StringVar(&f.tap, "tap", "", "give the guest a virtio network card on this host tap device (it must exist in the runner's network namespace; load virtio_net with --modules)")
}

func (f *vmFlags) config(ctx context.Context, k *kernel.Kernel, log io.Writer) (vm.Config, error) {
	cfg := vm.Config{
		Kernel:     k,
		CPUs:       f.cpus,
		MemoryMB:   f.memory,
		Timeout:    f.timeout,
		KeepRunDir: f.keep,
		Tap:        f.tap,
		QEMU:       f.qemuPath,
	}
	for _, m := range strings.Split(f.modules+","+f.more, ",") {
		if m = strings.TrimSpace(m); m != "" {
			cfg.Modules = append(cfg.Modules, m)
		}
	}
	if f.verbose {
		cfg.Console = os.Stderr
	}
	switch f.accel {
	case "auto":
		cfg.Accel = vm.ChooseAccel(ctx, k, f.qemuPath, f.cache, log)
	case vm.AccelTCG, vm.AccelKVM:
		cfg.Accel = f.accel
	default:
		return cfg, fmt.Errorf("--accel %q: want auto, tcg or kvm", f.accel)
	}
	return cfg, nil
}

func runMain(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("vmtest", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: vmtest [flags] -- command [args...]\n       vmtest fetch [kernel...]\n       vmtest matrix [flags] -- packages...\nflags:")
		fs.PrintDefaults()
	}
	var vf vmFlags
	vf.register(fs)
	kernelSpec := fs.String("kernel", "6.1", "kernel series (6.1, 6.12) or release (6.1.0-56-amd64)")
	var rw multiFlag
	fs.Var(&rw, "rw", "host directory the guest may write to (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	command := fs.Args()
	if len(command) == 0 {
		fs.Usage()
		return 2
	}
	cwd, err := os.Getwd()
	if err != nil {
		return harnessError(err)
	}

	cache := &kernel.Cache{Dir: vf.cache, Log: os.Stderr}
	k, err := cache.Get(ctx, *kernelSpec)
	if err != nil {
		return harnessError(err)
	}
	cfg, err := vf.config(ctx, k, os.Stderr)
	if err != nil {
		return harnessError(err)
	}
	env := guestEnv(os.Environ())
	cfg.RWDirs = outermost(append(writableDirs(command, env, cwd), rw...))

	job := vm.Job{Args: command, Dir: cwd, Env: env, Stdout: os.Stdout, Stderr: os.Stderr}
	if sameFile(os.Stdout, os.Stderr) {
		// go test gives its test binaries one pipe for both streams;
		// keep them in one file in the guest too, so their order holds.
		job.Stderr = os.Stdout
	}
	res, err := vm.Run(ctx, cfg, []vm.Job{job})
	if res != nil {
		for _, p := range res.Problems {
			fmt.Fprintf(os.Stderr, "vmtest: kernel %s logged: %s\n", k.Release, p)
		}
		if res.RunDir != "" {
			fmt.Fprintf(os.Stderr, "vmtest: run directory kept at %s\n", res.RunDir)
		}
		fmt.Fprintf(os.Stderr, "vmtest: kernel %s: VM wall time %.1fs, QEMU CPU time %.1fs\n", k.Release, res.Wall.Seconds(), res.CPU.Seconds())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmtest: kernel %s: %v\n", k.Release, err)
		if tail := vm.ConsoleTail(err); tail != "" && !vf.verbose {
			fmt.Fprintf(os.Stderr, "vmtest: console tail:\n%s\n", tail)
		}
		return vm.ExitCode(err)
	}
	return res.Jobs[0].ExitCode
}

func fetchMain(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("vmtest fetch", flag.ContinueOnError)
	cacheDir := fs.String("cache", kernel.DefaultDir(), "kernel cache directory (default from $EBPF_PROXY_CACHE)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	specs := fs.Args()
	if len(specs) == 0 {
		specs = []string{"6.1", "6.12"}
	}
	cache := &kernel.Cache{Dir: *cacheDir, Log: os.Stderr}
	for _, spec := range specs {
		start := time.Now()
		k, err := cache.Get(ctx, spec)
		if err != nil {
			return harnessError(err)
		}
		fmt.Printf("vmtest: kernel=%s upstream=%s package=%s dir=%s (%.1fs)\n",
			k.Release, k.Upstream(), k.Package, k.Dir, time.Since(start).Seconds())
	}
	return 0
}

func harnessError(err error) int {
	fmt.Fprintf(os.Stderr, "vmtest: %v\n", err)
	return vm.ExitHarness
}

// guestEnv is the host's environment for a command in the guest: the same,
// so that the command behaves as it would on the host, plus the marker that
// tells tests they run inside the VM.
func guestEnv(host []string) []string {
	env := make([]string, 0, len(host)+1)
	for _, kv := range host {
		if !strings.HasPrefix(kv, EnvVMTest+"=") {
			env = append(env, kv)
		}
	}
	return append(env, EnvVMTest+"=1")
}

// fileFlags are test binary flags that name a file the binary writes and the
// go command reads afterwards; dirFlags name such directories.
var (
	fileFlags = []string{"coverprofile", "cpuprofile", "memprofile", "blockprofile", "mutexprofile", "trace", "testlogfile"}
	dirFlags  = []string{"outputdir", "gocoverdir"}
)

// writableDirs returns the host directories that the command's test flags
// (and GOCOVERDIR) write to, so that the guest can write there and the go
// command finds the files. Relative paths are taken from cwd; directories
// that do not exist, and directories inside another one returned, are left
// out.
func writableDirs(args, env []string, cwd string) []string {
	var dirs []string
	add := func(p string, isFile bool) {
		if p == "" {
			return
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if isFile {
			p = filepath.Dir(p)
		}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			dirs = append(dirs, filepath.Clean(p))
		}
	}
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || !strings.HasPrefix(name, "test.") {
			continue
		}
		name = strings.TrimPrefix(name, "test.")
		isFile, isDir := slices.Contains(fileFlags, name), slices.Contains(dirFlags, name)
		if !isFile && !isDir {
			continue
		}
		if !hasValue && i+1 < len(args) {
			i++
			value = args[i]
		}
		add(value, isFile)
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GOCOVERDIR="); ok {
			add(v, false)
		}
	}
	return outermost(dirs)
}

// outermost drops duplicates and directories inside another listed one: a
// 9p share covers everything below it.
func outermost(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		covered := false
		for _, o := range dirs {
			if o != d && strings.HasPrefix(d, strings.TrimSuffix(o, "/")+"/") {
				covered = true
				break
			}
		}
		if !covered && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

func sameFile(a, b *os.File) bool {
	sa, errA := a.Stat()
	sb, errB := b.Stat()
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }

func (m *multiFlag) Set(v string) error {
	if !filepath.IsAbs(v) {
		abs, err := filepath.Abs(v)
		if err != nil {
			return err
		}
		v = abs
	}
	*m = append(*m, v)
	return nil
}
