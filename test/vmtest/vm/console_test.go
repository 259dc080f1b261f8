package vm

import (
	"errors"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"
)

const (
	stage1 = "vmtest-stage1: ok\n"
	ready  = "\nvmtest-guest: ready\n"
	done   = "\nvmtest-guest: done\n[   10.1] reboot: Power down\n"
)

func TestParseConsoleJobs(t *testing.T) {
	tests := []struct {
		name    string
		console string
		want    map[int]JobResult
		missing []string
	}{
		{
			name:    "one passing job",
			console: stage1 + ready + "\nvmtest-guest: job=0 exit=0 elapsed=1482ms\n" + done,
			want:    map[int]JobResult{0: {Ran: true, ExitCode: 0, Elapsed: 1482 * time.Millisecond}},
		},
		{
			name: "failing, signalled and timed-out jobs keep their codes",
			console: stage1 + ready +
				"\nvmtest-guest: job=0 exit=1 elapsed=20ms\n" +
				"\nvmtest-guest: job=1 exit=137 elapsed=5ms\n" +
				"\nvmtest-guest: job=2 exit=137 elapsed=300000ms timeout\n" + done,
			want: map[int]JobResult{
				0: {Ran: true, ExitCode: 1, Elapsed: 20 * time.Millisecond},
				1: {Ran: true, ExitCode: 137, Elapsed: 5 * time.Millisecond},
				2: {Ran: true, ExitCode: 137, Elapsed: 300 * time.Second, TimedOut: true},
			},
		},
		{
			name:    "marker after a kernel message on the same line",
			console: stage1 + ready + "[    9.1] random: crng init donevmtest-guest: job=0 exit=3 elapsed=7ms\r\n" + done,
			want:    map[int]JobResult{0: {Ran: true, ExitCode: 3, Elapsed: 7 * time.Millisecond}},
		},
		{
			name:    "missing modules are listed",
			console: stage1 + "\nvmtest-guest: modules unavailable: ip_vs_mh act_bpf\n" + ready + done,
			want:    map[int]JobResult{},
			missing: []string{"ip_vs_mh", "act_bpf"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ParseConsole([]byte(tt.console))
			if !reflect.DeepEqual(c.Jobs, tt.want) {
				t.Errorf("jobs = %+v, want %+v", c.Jobs, tt.want)
			}
			if !reflect.DeepEqual(c.Missing, tt.missing) {
				t.Errorf("missing = %q, want %q", c.Missing, tt.missing)
			}
		})
	}
}

const panicTrace = `[    5.40] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000000
[    5.40] CPU: 1 PID: 1 Comm: init Not tainted 6.1.0-56-amd64 #1  Debian 6.1.192-2
[    5.40] Call Trace:
`

func TestOutcome(t *testing.T) {
	qemuAbort := &exec.ExitError{}
	tests := []struct {
		name     string
		console  string
		jobs     int
		timedOut bool
		exitErr  error
		// want is the error type, nil for a run that finished.
		want  any
		stage string
		match string
	}{
		{
			name:    "every job ran: no error, whatever the exit codes",
			console: stage1 + ready + "\nvmtest-guest: job=0 exit=1 elapsed=1ms\n\nvmtest-guest: job=1 exit=0 elapsed=1ms\n" + done,
			jobs:    2,
		},
		{
			name:    "panic while a job runs is a kernel panic, not a test failure",
			console: stage1 + ready + "[ 7.0] BUG: kernel NULL pointer dereference\n" + strings.Replace(panicTrace, "Attempted to kill init! exitcode=0x00000000", "Fatal exception in interrupt", 1),
			jobs:    1,
			want:    &PanicError{},
			match:   "Fatal exception in interrupt",
		},
		{
			name:    "panic wins over the deadline",
			console: stage1 + ready + panicTrace,
			jobs:    1, timedOut: true,
			want:  &PanicError{},
			match: "Attempted to kill init",
		},
		{
			name:    "panic before the guest is ready is a boot failure",
			console: "[ 1.0] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n",
			jobs:    1,
			want:    &BootError{},
			stage:   "kernel and initramfs",
			match:   "Unable to mount root fs",
		},
		{
			name:    "agent dying as PID 1 during set-up is a boot failure",
			console: stage1 + panicTrace,
			jobs:    1,
			want:    &BootError{},
			stage:   "guest set-up",
			match:   "Attempted to kill init",
		},
		{
			name:    "deadline during a job is a timeout naming the job",
			console: stage1 + ready + "\nvmtest-guest: job=0 exit=0 elapsed=1ms\n",
			jobs:    3, timedOut: true,
			want:  &TimeoutError{},
			stage: "job 2 of 3",
		},
		{
			name:    "deadline before the kernel reached the initramfs",
			console: "",
			jobs:    1, timedOut: true,
			want:  &TimeoutError{},
			stage: "kernel and initramfs",
		},
		{
			name:    "initramfs cannot mount the root",
			console: "vmtest-stage1: error: mount the host root over 9p\n[ 3.2] reboot: Power down\n",
			jobs:    1,
			want:    &BootError{},
			stage:   "kernel and initramfs",
			match:   "mount the host root over 9p",
		},
		{
			name:    "agent set-up failure is a boot failure",
			console: stage1 + "\nvmtest-guest: error: mount bpf bpffs on /sys/fs/bpf: no such device\n\nvmtest-guest: error: power off: operation not permitted\n",
			jobs:    1,
			want:    &BootError{},
			stage:   "guest set-up",
			match:   "mount bpf bpffs",
		},
		{
			name:    "QEMU fails before any output",
			console: "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\n",
			jobs:    1, exitErr: qemuAbort,
			want:  &BootError{},
			stage: "kernel and initramfs",
			match: "qemu:",
		},
		{
			name:    "VM stops in the middle of the jobs",
			console: stage1 + ready + "\nvmtest-guest: job=0 exit=0 elapsed=1ms\n[ 9.0] reboot: Power down\n",
			jobs:    2,
			want:    &BootError{},
			stage:   "job 2 of 2",
			match:   "before the last job finished",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ParseConsole([]byte(tt.console))
			err := c.Outcome(tt.jobs, tt.timedOut, time.Minute, tt.exitErr, []byte(tt.console))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Outcome = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Outcome = nil, want %T", tt.want)
			}
			var stage string
			switch want := tt.want.(type) {
			case *PanicError:
				if !errors.As(err, &want) {
					t.Fatalf("Outcome = %T %v, want %T", err, err, tt.want)
				}
			case *TimeoutError:
				if !errors.As(err, &want) {
					t.Fatalf("Outcome = %T %v, want %T", err, err, tt.want)
				}
				stage = want.Stage
			case *BootError:
				if !errors.As(err, &want) {
					t.Fatalf("Outcome = %T %v, want %T", err, err, tt.want)
				}
				stage = want.Stage
			}
			if tt.stage != "" && stage != tt.stage {
				t.Errorf("stage = %q, want %q", stage, tt.stage)
			}
			if !strings.Contains(err.Error(), tt.match) {
				t.Errorf("error %q does not contain %q", err, tt.match)
			}
		})
	}
}

func TestExitCodeSeparatesVMFailuresFromTestFailures(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"finished run", nil, 0},
		{"kernel panic", &PanicError{Message: "Kernel panic"}, ExitKernelPanic},
		{"timeout", &TimeoutError{Timeout: time.Second}, ExitTimeout},
		{"boot failure", &BootError{Stage: "kernel and initramfs"}, ExitBootFailure},
		{"wrapped boot failure", errors.Join(errors.New("kernel 6.1"), &BootError{}), ExitBootFailure},
		{"harness error", errors.New("no kernel"), ExitHarness},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ExitCode(tt.err); got != tt.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
	// Test binaries exit 0, 1 or 2; none of the VM codes collides.
	for _, code := range []int{ExitHarness, ExitBootFailure, ExitKernelPanic, ExitTimeout} {
		if code <= 2 || code == 126 || code == 127 || code > 125 {
			t.Errorf("VM exit code %d collides with a test or shell exit code", code)
		}
	}
}

func TestParseConsoleProblems(t *testing.T) {
	console := stage1 + ready +
		"[ 8.1] WARNING: CPU: 1 PID: 512 at net/core/filter.c:123 bpf_warn_invalid_xdp_action+0x5/0x10\n" +
		"[ 8.2] BUG: unable to handle page fault for address: 0000000000001234\n" +
		"[ 8.3] veth0: renamed from eth0\n" + done
	c := ParseConsole([]byte(console))
	if len(c.Problems) != 2 || !strings.Contains(c.Problems[0], "WARNING: CPU: 1") || !strings.Contains(c.Problems[1], "BUG: unable") {
		t.Errorf("problems = %q, want the WARNING and the BUG lines", c.Problems)
	}
}
