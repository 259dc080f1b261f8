//go:build vmtest_e2e

package vm

// End-to-end tests of the runner: they boot real VMs (about ten seconds
// each under software emulation) and need the kernel cache and QEMU, so they
// are built only with -tags vmtest_e2e (make vmtest-selftest).

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/guest"
	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/kernel"
)

var kernelFlag = flag.String("vmtest.kernel", "6.1", "kernel series or release to boot")

func TestMain(m *testing.M) {
	// vm.Run boots this test binary as the guest agent.
	guest.RunIfAgent()
	os.Exit(m.Run())
}

func testKernel(t *testing.T) *kernel.Kernel {
	t.Helper()
	c := &kernel.Cache{Dir: kernel.DefaultDir(), Log: os.Stderr}
	k, err := c.Get(context.Background(), *kernelFlag)
	if err != nil {
		t.Fatalf("kernel %s: %v", *kernelFlag, err)
	}
	return k
}

func TestJobsReportExitCodesOutputAndDeadlines(t *testing.T) {
	k := testKernel(t)
	shared, private := t.TempDir(), t.TempDir()
	var out0, err0, out1, both3 bytes.Buffer
	jobs := []Job{
		{Args: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}, Dir: "/", Stdout: &out0, Stderr: &err0},
		{Args: []string{"sleep", "100"}, Dir: "/", Timeout: 2 * time.Second, Stdout: &out1, Stderr: &out1},
		{Args: []string{"sh", "-c", "echo guest > shared/f && echo guest > " + private + "/f"}, Dir: filepath.Dir(shared)},
		{Args: []string{"sh", "-c", "pwd; echo $EBPF_PROXY_VMTEST_E2E; uname -r"}, Dir: shared, Env: []string{"PATH=/usr/bin:/bin", "EBPF_PROXY_VMTEST_E2E=yes"}, Stdout: &both3, Stderr: &both3},
	}
	// The relative path of job 2 must resolve against its directory.
	jobs[2].Args[2] = strings.Replace(jobs[2].Args[2], "shared/f", filepath.Base(shared)+"/f", 1)

	res, err := Run(context.Background(), Config{Kernel: k, Modules: []string{"veth"}, RWDirs: []string{shared}, Timeout: 3 * time.Minute}, jobs)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, ConsoleTail(err))
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"job 0 exit code", res.Jobs[0].ExitCode, 7},
		{"job 0 stdout", out0.String(), "out\n"},
		{"job 0 stderr", err0.String(), "err\n"},
		{"job 1 killed at its deadline", res.Jobs[1].TimedOut, true},
		{"job 1 killed by SIGKILL", res.Jobs[1].ExitCode, 137},
		{"job 2 exit code", res.Jobs[2].ExitCode, 0},
		{"job 3 runs in its directory with its environment on the booted kernel", both3.String(), shared + "\nyes\n" + k.Release + "\n"},
		{"no module missing", len(res.Missing), 0},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %#v, want %#v", tt.name, tt.got, tt.want)
		}
	}
	if data, err := os.ReadFile(filepath.Join(shared, "f")); err != nil || string(data) != "guest\n" {
		t.Errorf("write to a read-write share did not reach the host: %q, %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(private, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("write outside the shares reached the host: %v", err)
	}
}

func TestKernelPanicIsReportedAsPanic(t *testing.T) {
	k := testKernel(t)
	_, err := Run(context.Background(), Config{Kernel: k, Timeout: 3 * time.Minute},
		[]Job{{Args: []string{"sh", "-c", "echo c > /proc/sysrq-trigger; sleep 60"}, Dir: "/"}})
	var pe *PanicError
	if !errors.As(err, &pe) || !strings.Contains(pe.Message, "sysrq triggered crash") {
		t.Fatalf("Run = %v, want a kernel panic from sysrq", err)
	}
	if ExitCode(err) != ExitKernelPanic {
		t.Errorf("ExitCode = %d, want %d", ExitCode(err), ExitKernelPanic)
	}
}

func TestDeadlineIsReportedAsTimeout(t *testing.T) {
	k := testKernel(t)
	_, err := Run(context.Background(), Config{Kernel: k, Timeout: 40 * time.Second},
		[]Job{{Args: []string{"sleep", "1000"}, Dir: "/"}})
	var te *TimeoutError
	if !errors.As(err, &te) || te.Stage != "job 1 of 1" {
		t.Fatalf("Run = %v, want a timeout during job 1 of 1", err)
	}
}

func TestBrokenGuestIsReportedAsBootFailure(t *testing.T) {
	k := *testKernel(t)
	k.ModulesDir = "/nonexistent/lib/modules"
	res, err := Run(context.Background(), Config{Kernel: &k, Timeout: 3 * time.Minute},
		[]Job{{Args: []string{"true"}, Dir: "/"}})
	var be *BootError
	if !errors.As(err, &be) || be.Stage != "guest set-up" || !strings.Contains(be.Reason, "/nonexistent/lib/modules") {
		t.Fatalf("Run = %v, want a boot failure in guest set-up naming the modules directory", err)
	}
	if res.Jobs[0].Ran {
		t.Errorf("job ran in a guest that failed to set up")
	}
}
