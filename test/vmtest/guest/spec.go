// Package guest is stage two of a vmtest guest: the agent that runs as PID 1
// after the initramfs has switched to the overlay root. It finishes the
// guest's set-up (bpffs, cgroup2, the kernel's modules, loopback), runs the
// jobs the host asked for and powers the VM off.
//
// The host and the agent share the run directory (read-write over 9p, at the
// same path on both sides). The host writes spec.json there; the agent writes
// each job's output to the files the spec names, and reports progress and exit
// codes as marker lines on the serial console, which the host parses (see
// package vm). The console is the one channel that still works when the guest
// is in trouble, so the outcome is always read from it.
package guest

import (
	"fmt"
	"time"
)

// Spec is what the host asks of the agent.
type Spec struct {
	// Release is the kernel release the VM boots, for /lib/modules.
	Release string `json:"release"`
	// ModulesDir is the unpacked kernel package's /lib/modules/<release>;
	// the agent bind-mounts it over the guest's so that modprobe works.
	ModulesDir string `json:"modulesDir"`
	// BootDir is the unpacked package's /boot, bind-mounted for tools
	// that read the kernel config (bpftool feature).
	BootDir string `json:"bootDir"`
	// Modules are loaded before the first job. Modules the kernel does
	// not have are reported on the console, not treated as an error:
	// tests that need one fail by themselves.
	Modules []string `json:"modules"`
	// Shares are extra read-write 9p shares to mount.
	Shares []Share `json:"shares,omitempty"`
	// Jobs run one after the other.
	Jobs []Job `json:"jobs"`
}

// Share is a read-write 9p share that QEMU exports under Tag and the agent
// mounts at Path, the same path as on the host.
type Share struct {
	// Tag is QEMU's mount_tag of the share.
	Tag string `json:"tag"`
	// Path is the host directory, and where the guest mounts it.
	Path string `json:"path"`
}

// Job is one command to run in the guest.
type Job struct {
	// Args is the command and its arguments. A relative command is
	// resolved against Dir, a bare name through PATH in Env.
	Args []string `json:"args"`
	// Dir is the working directory.
	Dir string `json:"dir"`
	// Env is the complete environment; nil means PATH and HOME only.
	Env []string `json:"env"`
	// Timeout kills the job's process group; zero means none.
	Timeout time.Duration `json:"timeout"`
	// Stdout is the file in the run directory that receives the job's
	// standard output; empty discards it.
	Stdout string `json:"stdout"`
	// Stderr receives the standard error. When it is the same file as
	// Stdout, both streams go to one descriptor and keep their order.
	Stderr string `json:"stderr"`
}

// Console markers. Each is printed on a line of its own; the host searches
// for them anywhere in a line because a kernel message can precede them.
const (
	// MarkerStage1 is printed by the initramfs once the root is ready.
	MarkerStage1 = "vmtest-stage1: ok"
	// MarkerStage1Error prefixes the initramfs's reason for giving up.
	MarkerStage1Error = "vmtest-stage1: error: "
	// MarkerReady is printed once the guest is set up; a failure before
	// it is a boot failure, not a failure of any job.
	MarkerReady = "vmtest-guest: ready"
	// MarkerError prefixes the agent's reason for giving up.
	MarkerError = "vmtest-guest: error: "
	// MarkerMissing lists requested modules the kernel does not have.
	MarkerMissing = "vmtest-guest: modules unavailable: "
	// MarkerDone is printed after the last job.
	MarkerDone = "vmtest-guest: done"
)

// JobMarker formats the line that reports the end of job i. code is the exit
// status (128+signal for a job killed by a signal).
func JobMarker(i, code int, elapsed time.Duration, timedOut bool) string {
	s := fmt.Sprintf("vmtest-guest: job=%d exit=%d elapsed=%dms", i, code, elapsed.Milliseconds())
	if timedOut {
		s += " timeout"
	}
	return s
}
