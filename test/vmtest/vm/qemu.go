// Package vm boots a prepared kernel in QEMU with the host's root file system
// shared read-only (a tmpfs overlay on top takes the guest's writes), runs
// jobs inside through the guest agent and reports their exit codes and
// output. A kernel panic, a boot failure and a timeout are returned as
// *PanicError, *BootError and *TimeoutError, never as a job's exit code.
package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/guest"
	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/kernel"
)

// Accelerators QEMU can use.
const (
	// AccelTCG is software emulation: slow, but it works everywhere.
	AccelTCG = "tcg"
	// AccelKVM is hardware virtualisation; see ChooseAccel.
	AccelKVM = "kvm"
)

// DefaultModules are loaded in every guest before the first job: what the
// dataplanes and their tests use (veth pairs, bridges, TC and XDP programs,
// IPVS with kube-proxy's schedulers, iptables through both backends, ipsets,
// SCTP for its Services).
// A module the kernel lacks is reported, not fatal.
var DefaultModules = []string{
	"veth", "bridge", "dummy",
	"sch_ingress", "cls_bpf",
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sh", "ip_vs_mh",
	"nf_conntrack", "nf_nat", "nf_conntrack_netlink",
	"nf_tables", "nft_compat", "nft_chain_nat", "nft_ct", "nft_masq", "nft_nat", "nft_reject_inet",
	"ip_tables", "ip6_tables", "iptable_filter", "iptable_nat", "iptable_mangle", "iptable_raw",
	"ip6table_filter", "ip6table_nat", "ip6table_mangle",
	"xt_conntrack", "xt_comment", "xt_mark", "xt_MASQUERADE", "xt_addrtype", "xt_multiport",
	"xt_statistic", "xt_nat", "xt_set", "ipt_REJECT", "ip6t_REJECT",
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet",
	"ip_set_hash_net", "ip_set_bitmap_port",
	"sctp",
}

// Config describes one VM.
type Config struct {
	// Kernel is the prepared kernel to boot.
	Kernel *kernel.Kernel
	// Accel is AccelTCG or AccelKVM.
	Accel string
	// CPUs is the number of guest CPUs; default 1. Under software
	// emulation a second vCPU buys nothing on a 2-core machine that runs
	// two guests and the host's tests at once: its thread competes for
	// the same cores, a descheduled vCPU stalls the other in IPIs and TCG's
	// exclusive sections (the guest kernels logged soft lockups of 20 to
	// 50 s and tests timed out), and multi-threaded TCG panics now and then
	// when the kernel patches its text. The kernel matrix ran in 741 s
	// (6.1) and 406 s (6.12) with one vCPU against 1404 s and 1260 s with
	// two.
	CPUs int
	// MemoryMB is the guest's memory; default 1536. The guest's root is
	// an overlay whose upper layer is RAM, so whatever the tests write
	// stays in memory; with 512 MiB the 6.1 guest compacted memory for
	// tens of seconds at a time late in the matrix (a soft lockup of
	// kcompactd, an agent's start taking two minutes instead of five
	// seconds).
	MemoryMB int
	// Timeout bounds the whole run, boot included; default 10 minutes.
	Timeout time.Duration
	// Modules are loaded before the first job; see DefaultModules.
	Modules []string
	// Tap, if set, gives the guest a virtio network card (eth0, once the
	// guest has loaded virtio_net: list it in Modules) on the host's tap
	// device of that name, which must exist in QEMU's network namespace.
	// Without it the guest has no network card. The card's MAC address
	// is made from the tap's name (TapMAC), so that guests on taps of one
	// bridge differ, and a guest keeps its address from run to run.
	Tap string
	// RWDirs are host directories the guest may write to (through extra
	// 9p shares at the same paths), for output such as cover profiles
	// that must come back to the host. All other writes stay in the
	// guest.
	RWDirs []string
	// Console, if set, receives the serial console as it comes.
	Console io.Writer
	// KeepRunDir leaves the run directory (spec, outputs, console.log)
	// in place for debugging; its path is in Result.RunDir.
	KeepRunDir bool
	// QEMU is the emulator binary; default qemu-system-x86_64.
	QEMU string
	// BIOS is the firmware; default /usr/share/qemu/qboot.rom, which
	// boots an ELF kernel faster than SeaBIOS.
	BIOS string
}

// Job is a command to run in the guest.
type Job struct {
	// Args is the command and its arguments.
	Args []string
	// Dir is the working directory, a host path (the guest sees the
	// host's files at the same paths).
	Dir string
	// Env is the complete environment of the command; nil means PATH and
	// HOME only.
	Env []string
	// Timeout bounds the job inside the guest; zero means none.
	Timeout time.Duration
	// Stdout receives the job's standard output, line by line, while it
	// runs. Nil discards.
	Stdout io.Writer
	// Stderr receives the standard error. When it is the same writer as
	// Stdout, the two streams keep their relative order.
	Stderr io.Writer
}

// JobResult is the outcome of one job.
type JobResult struct {
	// Ran is false for jobs the VM never finished.
	Ran bool
	// ExitCode is the job's exit status; 128+N when signal N killed it.
	ExitCode int
	// Elapsed is the job's run time, measured in the guest.
	Elapsed time.Duration
	// TimedOut is set when the agent killed the job at Job.Timeout.
	TimedOut bool
}

// Result is the outcome of a run.
type Result struct {
	// Jobs holds one result per job, in order.
	Jobs []JobResult
	// Console is the serial console output.
	Console []byte
	// Missing lists requested modules the kernel does not have.
	Missing []string
	// Problems are kernel oopses and warnings seen on the console.
	Problems []string
	// Wall is the time from starting QEMU to its exit.
	Wall time.Duration
	// CPU is the processor time QEMU used (user and system). Near Wall,
	// the guest's single vCPU was busy throughout: running its tests
	// side by side would not make it faster, doing less work would.
	CPU time.Duration
	// RunDir is the run directory, if kept.
	RunDir string
}

// Run boots the VM, runs the jobs one after the other and powers it off.
// The returned Result is valid also with an error, holding the jobs that
// finished before the VM failed. The guest agent is the calling program
// itself, which must call guest.RunIfAgent at start.
func Run(ctx context.Context, cfg Config, jobs []Job) (*Result, error) {
	if cfg.Kernel == nil {
		return nil, errors.New("vm: no kernel")
	}
	cfg.setDefaults()
	runDir, err := os.MkdirTemp("", "vmtest-run-")
	if err != nil {
		return nil, fmt.Errorf("vm: run directory: %w", err)
	}
	res := &Result{Jobs: make([]JobResult, len(jobs))}
	defer func() {
		if cfg.KeepRunDir {
			res.RunDir = runDir
			_ = os.WriteFile(filepath.Join(runDir, "console.log"), res.Console, 0o644)
		} else {
			os.RemoveAll(runDir)
		}
	}()
	// The initramfs reads the path from the kernel command line, which
	// is split on white space.
	if strings.ContainsAny(runDir, " \t\n") {
		return res, fmt.Errorf("vm: run directory %q contains white space", runDir)
	}

	spec, forwarders, err := prepare(runDir, cfg, jobs)
	defer func() {
		for _, f := range forwarders {
			f.close()
		}
	}()
	if err != nil {
		return res, err
	}
	args, err := qemuArgs(cfg, runDir, spec.Shares)
	if err != nil {
		return res, err
	}

	runCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, cfg.QEMU, args...)
	// QEMU's stdio serial would put a terminal on stdin into raw mode.
	cmd.Stdin = nil
	console := &syncBuffer{tee: cfg.Console}
	cmd.Stdout = console
	cmd.Stderr = console
	cmd.WaitDelay = 5 * time.Second

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("vm: start %s: %w", cfg.QEMU, err)
	}
	stopTail := make(chan struct{})
	tailDone := make(chan struct{})
	go func() {
		defer close(tailDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopTail:
				return
			case <-tick.C:
				for _, f := range forwarders {
					f.poll(false)
				}
			}
		}
	}()
	waitErr := cmd.Wait()
	res.Wall = time.Since(start)
	if ps := cmd.ProcessState; ps != nil {
		res.CPU = ps.UserTime() + ps.SystemTime()
	}
	close(stopTail)
	<-tailDone
	for _, f := range forwarders {
		f.poll(true)
	}

	res.Console = console.Bytes()
	if ctx.Err() != nil {
		return res, fmt.Errorf("vm: %w", ctx.Err())
	}
	timedOut := errors.Is(runCtx.Err(), context.DeadlineExceeded)
	c := ParseConsole(res.Console)
	res.Missing = c.Missing
	res.Problems = c.Problems
	for i, jr := range c.Jobs {
		if i >= 0 && i < len(res.Jobs) {
			res.Jobs[i] = jr
		}
	}
	var exitErr error
	if waitErr != nil && !timedOut {
		exitErr = waitErr
	}
	return res, c.Outcome(len(jobs), timedOut, cfg.Timeout, exitErr, res.Console)
}

func (cfg *Config) setDefaults() {
	if cfg.Accel == "" {
		cfg.Accel = AccelTCG
	}
	if cfg.CPUs <= 0 {
		cfg.CPUs = 1
	}
	if cfg.MemoryMB <= 0 {
		cfg.MemoryMB = 1536
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.BIOS == "" {
		cfg.BIOS = "/usr/share/qemu/qboot.rom"
	}
}

// prepare writes the agent, the spec and empty output files into the run
// directory and returns the spec and the forwarders that copy the guest's
// output to the jobs' writers; the caller closes the forwarders, also those
// returned with an error.
func prepare(runDir string, cfg Config, jobs []Job) (*guest.Spec, []*forwarder, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("vm: find own executable for the guest agent: %w", err)
	}
	if err := copyFile(self, filepath.Join(runDir, "vmtest-guest"), 0o755); err != nil {
		return nil, nil, fmt.Errorf("vm: copy guest agent: %w", err)
	}
	spec := &guest.Spec{
		Release:    cfg.Kernel.Release,
		ModulesDir: cfg.Kernel.ModulesDir,
		BootDir:    cfg.Kernel.BootDir,
		Modules:    cfg.Modules,
	}
	for i, dir := range cfg.RWDirs {
		if !filepath.IsAbs(dir) {
			return nil, nil, fmt.Errorf("vm: writable directory %q is not absolute", dir)
		}
		spec.Shares = append(spec.Shares, guest.Share{Tag: fmt.Sprintf("rw%d", i), Path: filepath.Clean(dir)})
	}
	outDir := filepath.Join(runDir, "out")
	if err := os.Mkdir(outDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("vm: output directory: %w", err)
	}
	var fwd []*forwarder
	output := func(name string, w io.Writer) (string, error) {
		if w == nil {
			return "", nil
		}
		path := filepath.Join(outDir, name)
		f, err := newForwarder(path, w)
		if err != nil {
			return "", err
		}
		fwd = append(fwd, f)
		return path, nil
	}
	for i, j := range jobs {
		gj := guest.Job{Args: j.Args, Dir: j.Dir, Env: j.Env, Timeout: j.Timeout}
		if gj.Stdout, err = output(fmt.Sprintf("%d.stdout", i), j.Stdout); err != nil {
			return nil, fwd, err
		}
		if sameWriter(j.Stdout, j.Stderr) {
			gj.Stderr = gj.Stdout
		} else if gj.Stderr, err = output(fmt.Sprintf("%d.stderr", i), j.Stderr); err != nil {
			return nil, fwd, err
		}
		spec.Jobs = append(spec.Jobs, gj)
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, fwd, err
	}
	if err := os.WriteFile(filepath.Join(runDir, "spec.json"), data, 0o644); err != nil {
		return nil, fwd, fmt.Errorf("vm: write spec: %w", err)
	}
	return spec, fwd, nil
}

// qemuArgs builds QEMU's command line: no devices but the serial console,
// the 9p shares, the host's root read-only as "root", the run directory
// read-write as "run", and the network card of Config.Tap.
func qemuArgs(cfg Config, runDir string, shares []guest.Share) ([]string, error) {
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none",
		"-serial", "stdio", "-no-reboot",
		"-machine", "q35",
		"-smp", fmt.Sprint(cfg.CPUs),
		"-m", fmt.Sprintf("%dM", cfg.MemoryMB),
	}
	switch cfg.Accel {
	case AccelTCG:
		// The plain x86-64 model, not "max" (which offers the guest
		// every extension TCG emulates, AVX among them): test/tcpkt's
		// fuzz and flow tests ran in 115 s instead of 135 s on Debian's
		// 6.12, the two VMs side by side.
		args = append(args, "-accel", "tcg,thread=multi", "-cpu", "qemu64")
	case AccelKVM:
		args = append(args, "-accel", "kvm", "-cpu", "host")
	default:
		return nil, fmt.Errorf("vm: unknown accelerator %q", cfg.Accel)
	}
	if _, err := os.Stat(cfg.BIOS); err == nil {
		args = append(args, "-bios", cfg.BIOS)
	}
	cmdline := strings.Join([]string{
		"console=ttyS0", "panic=-1", "quiet", "loglevel=3", "mitigations=off",
		// TCG derives every vCPU's TSC from the host's clock: no
		// clocksource watchdog may move the guest to the HPET (an
		// emulated device read on every clock read) should a busy
		// host's delays fool it. A safeguard; not seen to happen.
		"tsc=reliable",
		"vmtest.run=" + runDir,
	}, " ")
	args = append(args,
		"-kernel", cfg.Kernel.Vmlinux,
		"-initrd", cfg.Kernel.Initramfs,
		"-append", cmdline,
		"-virtfs", virtfs("/", "root", true),
		"-virtfs", virtfs(runDir, "run", false),
	)
	for _, s := range shares {
		args = append(args, "-virtfs", virtfs(s.Path, s.Tag, false))
	}
	if cfg.Tap != "" {
		if strings.ContainsAny(cfg.Tap, ",=") {
			return nil, fmt.Errorf("vm: tap device name %q", cfg.Tap)
		}
		args = append(args,
			"-netdev", "tap,id=net0,ifname="+cfg.Tap+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net0,mac="+TapMAC(cfg.Tap).String())
	}
	return args, nil
}

// TapMAC is the MAC address of the network card of a guest on the tap
// device named tap: QEMU's own prefix, 52:54:00, and three bytes of a hash
// of the name (QEMU would give every guest 52:54:00:12:34:56).
func TapMAC(tap string) net.HardwareAddr {
	h := fnv.New32a()
	_, _ = h.Write([]byte(tap))
	s := h.Sum32()
	return net.HardwareAddr{0x52, 0x54, 0x00, byte(s >> 16), byte(s >> 8), byte(s)}
}

func virtfs(path, tag string, readonly bool) string {
	// QEMU option values escape a comma by doubling it.
	s := "local,path=" + strings.ReplaceAll(path, ",", ",,") + ",mount_tag=" + tag +
		",security_model=none,multidevs=remap"
	if readonly {
		s += ",readonly=on"
	}
	return s
}

// sameWriter reports whether a and b are the same writer, without the
// run-time panic of == on writers of uncomparable types.
func sameWriter(a, b io.Writer) bool {
	if a == nil || b == nil || reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// syncBuffer collects QEMU's output, which the console parser reads after
// the run, and copies it to tee as it comes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	tee io.Writer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tee != nil {
		_, _ = b.tee.Write(p)
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// forwarder copies what the guest appends to an output file in the run
// directory to a writer, whole lines at a time, so that lines of two
// streams sharing one writer never interleave mid-line.
type forwarder struct {
	f       *os.File
	w       io.Writer
	pending []byte
	buf     []byte
}

func newForwarder(path string, w io.Writer) (*forwarder, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("vm: output file: %w", err)
	}
	return &forwarder{f: f, w: w, buf: make([]byte, 64*1024)}, nil
}

// poll forwards the complete lines written since the last call; final also
// forwards an unterminated last line.
func (f *forwarder) poll(final bool) {
	for {
		n, _ := f.f.Read(f.buf)
		if n == 0 {
			break
		}
		f.pending = append(f.pending, f.buf[:n]...)
	}
	cut := bytes.LastIndexByte(f.pending, '\n') + 1
	if final {
		cut = len(f.pending)
	}
	if cut > 0 {
		_, _ = f.w.Write(f.pending[:cut])
		f.pending = f.pending[cut:]
	}
}

func (f *forwarder) close() { f.f.Close() }
