package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/kernel"
)

// RunIfAgent runs the agent and never returns when this process is one:
// PID 1 of a guest, started as "PROGRAM guest SPEC". Every program that calls
// vm.Run must call it first thing (in main, or in TestMain for a test),
// because vm.Run boots its own executable as the agent.
func RunIfAgent() {
	if os.Getpid() == 1 && len(os.Args) == 3 && os.Args[1] == "guest" {
		Main(os.Args[2])
		os.Exit(1)
	}
}

// Main runs the agent as PID 1 of the guest and powers the VM off when the
// jobs are done or set-up fails. It never returns.
func Main(specPath string) {
	defer powerOff()
	defer func() {
		// A panic in PID 1 would panic the kernel and be reported as a
		// kernel panic; report it as the agent's failure instead.
		if r := recover(); r != nil {
			fmt.Printf("\n%s%v\n", MarkerError, r)
		}
	}()
	if err := agent(specPath); err != nil {
		fmt.Printf("\n%s%v\n", MarkerError, err)
	}
}

func powerOff() {
	unix.Sync()
	// Returns only on failure; the kernel then panics when PID 1 exits,
	// which still ends the VM.
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	fmt.Printf("\n%spower off: %v\n", MarkerError, err)
}

// stdPath is the PATH of the agent and the default of jobs; the initramfs's
// PATH names only busybox's directory.
const stdPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func agent(specPath string) error {
	os.Setenv("PATH", stdPath)
	data, err := os.ReadFile(specPath)
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("parse spec %s: %w", specPath, err)
	}
	if err := setup(&spec); err != nil {
		return err
	}
	missing := loadModules(spec.Modules)
	if len(missing) > 0 {
		fmt.Printf("\n%s%s\n", MarkerMissing, strings.Join(missing, " "))
	}
	fmt.Printf("\n%s\n", MarkerReady)
	for i, job := range spec.Jobs {
		code, elapsed, timedOut := runJob(job)
		fmt.Printf("\n%s\n", JobMarker(i, code, elapsed, timedOut))
		reapOrphans()
	}
	fmt.Printf("\n%s\n", MarkerDone)
	return nil
}

type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	// optional mounts are conveniences (debugfs for bpftool); their
	// failure is reported but does not stop the run.
	optional bool
}

// setup mounts what the initramfs left out: the kernel-facing file systems
// tests use (bpffs, cgroup2) at their usual places, a fresh /run so that the
// host's runtime state (/run/netns, pid files) does not leak in, and the
// unpacked kernel's modules and config.
func setup(spec *Spec) error {
	const nosuidNodev = unix.MS_NOSUID | unix.MS_NODEV
	mounts := []mount{
		{"tmpfs", "/run", "tmpfs", nosuidNodev, "mode=0755", false},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620", true},
		{"tmpfs", "/dev/shm", "tmpfs", nosuidNodev, "mode=1777", true},
		{"bpffs", "/sys/fs/bpf", "bpf", nosuidNodev | unix.MS_NOEXEC, "mode=0700", false},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", nosuidNodev | unix.MS_NOEXEC, "", false},
		{"debugfs", "/sys/kernel/debug", "debugfs", nosuidNodev | unix.MS_NOEXEC, "", true},
		{"tracefs", "/sys/kernel/tracing", "tracefs", nosuidNodev | unix.MS_NOEXEC, "", true},
		{spec.ModulesDir, "/lib/modules/" + spec.Release, "", unix.MS_BIND | unix.MS_RDONLY, "", false},
		{spec.BootDir, "/boot", "", unix.MS_BIND | unix.MS_RDONLY, "", false},
	}
	for _, s := range spec.Shares {
		mounts = append(mounts, mount{s.Tag, s.Path, "9p", 0, "trans=virtio,version=9p2000.L,msize=262144", false})
	}
	for _, m := range mounts {
		if err := m.mount(); err != nil {
			if m.optional {
				fmt.Printf("\nvmtest-guest: optional %v\n", err)
				continue
			}
			return err
		}
	}
	if err := unix.Sethostname([]byte("vmtest")); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	// A new kernel's loopback is down; tests in the initial namespace
	// expect 127.0.0.1 to work as it does on any host.
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set loopback up: %w", err)
	}
	return nil
}

func (m mount) mount() error {
	if err := os.MkdirAll(m.target, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", m.target, err)
	}
	flags := m.flags
	if err := unix.Mount(m.source, m.target, m.fstype, flags&^unix.MS_RDONLY, m.data); err != nil {
		return fmt.Errorf("mount %s %s on %s: %w", m.fstype, m.source, m.target, err)
	}
	// A bind mount ignores MS_RDONLY until it is remounted.
	if flags&unix.MS_BIND != 0 && flags&unix.MS_RDONLY != 0 {
		if err := unix.Mount("", m.target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", m.target, err)
		}
	}
	return nil
}

// loadModules loads the requested modules and returns the ones that are
// neither loaded nor built in afterwards. Loading dominates the guest's
// set-up under software emulation, and most of that was the cost of
// starting modprobe (and, on 6.12, of decompressing .ko.xz in user space):
// so modprobe only resolves the dependencies, once for all modules, and the
// agent inserts the files itself, letting the kernel decompress them.
func loadModules(modules []string) (missing []string) {
	if len(modules) == 0 {
		return nil
	}
	if err := insertModules(modules); err != nil {
		fmt.Printf("\nvmtest-guest: inserting modules directly failed (%v); using modprobe\n", err)
		cmd := exec.Command("modprobe", append([]string{"-a", "-q"}, modules...)...)
		cmd.Stdout = os.Stdout
		cmd.Stderr = os.Stdout
		// A name modprobe cannot load shows up as missing below.
		_ = cmd.Run()
	}
	builtin := builtinModules()
	for _, m := range modules {
		name := strings.ReplaceAll(m, "-", "_")
		if _, err := os.Stat(filepath.Join("/sys/module", name)); err != nil && !builtin[name] {
			missing = append(missing, m)
		}
	}
	return missing
}

// insertModules inserts the modules and their dependencies with
// finit_module. Modules the kernel lacks are skipped; they show up as
// missing.
func insertModules(modules []string) error {
	cmd := exec.Command("modprobe", append([]string{"--show-depends", "-a"}, modules...)...)
	// modprobe exits non-zero when a name is unknown, after listing the
	// others.
	out, _ := cmd.Output()
	files, err := kernel.ParseShowDepends(out)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := insertModule(f); err != nil {
			return err
		}
	}
	return nil
}

func insertModule(m kernel.ModuleFile) error {
	fd, err := unix.Open(m.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", m.Path, err)
	}
	defer unix.Close(fd)
	flags := 0
	if !strings.HasSuffix(m.Path, ".ko") {
		flags = unix.MODULE_INIT_COMPRESSED_FILE
	}
	err = unix.FinitModule(fd, m.Params, flags)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("insert %s: %w", m.Path, err)
	}
	return nil
}

// builtinModules reads the names of the modules built into the running
// kernel; not all of them appear in /sys/module.
func builtinModules() map[string]bool {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil
	}
	data, err := os.ReadFile(filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:]), "modules.builtin"))
	if err != nil {
		return nil
	}
	names := map[string]bool{}
	for _, line := range strings.Fields(string(data)) {
		base := filepath.Base(line)
		names[strings.ReplaceAll(strings.TrimSuffix(base, ".ko"), "-", "_")] = true
	}
	return names
}

// runJob runs one job in its own process group and returns its exit code
// (126 and 127 as a shell does when the command cannot be run, 128+signal
// when it was killed) and how long it ran.
func runJob(job Job) (code int, elapsed time.Duration, timedOut bool) {
	var killed atomic.Bool
	defer func() { timedOut = killed.Load() }()
	stdout, stderr, closeOut, err := openOutputs(job)
	if err != nil {
		fmt.Printf("\n%sjob output: %v\n", MarkerError, err)
		return 126, 0, false
	}
	defer closeOut()
	if len(job.Args) == 0 {
		fmt.Fprintln(stderr, "vmtest: empty command")
		return 127, 0, false
	}

	cmd := exec.Command(job.Args[0], job.Args[1:]...)
	if !strings.Contains(job.Args[0], "/") {
		// exec.Command looked the name up in the agent's PATH; the
		// job's own PATH is the one that counts.
		path, err := lookPath(job.Args[0], job.Env)
		if err != nil {
			fmt.Fprintf(stderr, "vmtest: %v\n", err)
			return 127, 0, false
		}
		cmd.Path = path
		cmd.Err = nil
	}
	cmd.Dir = job.Dir
	cmd.Env = job.Env
	if cmd.Env == nil {
		// Not the agent's own environment, which the kernel made up.
		cmd.Env = []string{"PATH=" + stdPath, "HOME=/root"}
	}
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	start := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "vmtest: %v\n", err)
		if errors.Is(err, os.ErrNotExist) {
			return 127, 0, false
		}
		return 126, 0, false
	}
	pgid := cmd.Process.Pid
	var timer *time.Timer
	if job.Timeout > 0 {
		timer = time.AfterFunc(job.Timeout, func() {
			killed.Store(true)
			_ = unix.Kill(-pgid, unix.SIGKILL)
		})
	}
	err = cmd.Wait()
	elapsed = time.Since(start)
	if timer != nil {
		timer.Stop()
	}
	// Whatever the job left running in its group must not run into the
	// next job.
	_ = unix.Kill(-pgid, unix.SIGKILL)

	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, elapsed, false
	case errors.As(err, &exitErr):
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), elapsed, false
		}
		return exitErr.ExitCode(), elapsed, false
	default:
		fmt.Fprintf(stderr, "vmtest: wait: %v\n", err)
		return 126, elapsed, false
	}
}

func openOutputs(job Job) (stdout, stderr *os.File, closeAll func(), err error) {
	open := func(path string) (*os.File, error) {
		if path == "" {
			return os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		}
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	}
	if stdout, err = open(job.Stdout); err != nil {
		return nil, nil, nil, err
	}
	if job.Stderr == job.Stdout {
		return stdout, stdout, func() { stdout.Close() }, nil
	}
	if stderr, err = open(job.Stderr); err != nil {
		stdout.Close()
		return nil, nil, nil, err
	}
	return stdout, stderr, func() { stdout.Close(); stderr.Close() }, nil
}

// lookPath finds name in the PATH of env.
func lookPath(name string, env []string) (string, error) {
	path := stdPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found in PATH", name)
}

// reapOrphans collects processes that jobs left behind and that the kernel
// re-parented to PID 1. It runs only between jobs, so that it never takes
// the exit status of a job that exec.Cmd.Wait is waiting for.
func reapOrphans() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
