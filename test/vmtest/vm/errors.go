package vm

import (
	"errors"
	"fmt"
	"time"
)

// Exit codes of the vmtest command for failures of the VM rather than of the
// command inside it. A command's own exit code is passed through unchanged;
// test binaries exit 0, 1 or 2, and a command that cannot be started in the
// guest gets 126 or 127 as from a shell.
const (
	// ExitHarness: the runner could not prepare the run (bad flags, no
	// kernel, no QEMU).
	ExitHarness = 120
	// ExitBootFailure: the VM never got to run the command, or its agent
	// failed.
	ExitBootFailure = 121
	// ExitKernelPanic: the guest kernel panicked.
	ExitKernelPanic = 122
	// ExitTimeout: the run did not finish within its deadline.
	ExitTimeout = 124
)

// BootError reports that the VM did not get to run the jobs: QEMU could not
// start, the kernel or initramfs failed, or the guest agent could not set the
// guest up or stopped early.
type BootError struct {
	// Stage is how far the run got.
	Stage string
	// Reason is the guest's or QEMU's explanation.
	Reason string
	// Console is the tail of the serial console.
	Console string
}

func (e *BootError) Error() string {
	return fmt.Sprintf("vm boot failure during %s: %s", e.Stage, e.Reason)
}

// PanicError reports a kernel panic in the guest.
type PanicError struct {
	// Message is the kernel's panic line.
	Message string
	// Console is the tail of the serial console, with the stack trace.
	Console string
}

func (e *PanicError) Error() string {
	return "vm kernel panic: " + e.Message
}

// TimeoutError reports that the run did not finish within its deadline and
// QEMU was killed.
type TimeoutError struct {
	// Timeout is the deadline that passed.
	Timeout time.Duration
	// Stage is how far the run got.
	Stage string
	// Console is the tail of the serial console.
	Console string
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("vm timeout after %s during %s", e.Timeout, e.Stage)
}

// ExitCode maps an error of Run to the vmtest command's exit code.
func ExitCode(err error) int {
	var (
		boot *BootError
		pe   *PanicError
		tmo  *TimeoutError
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &pe):
		return ExitKernelPanic
	case errors.As(err, &tmo):
		return ExitTimeout
	case errors.As(err, &boot):
		return ExitBootFailure
	default:
		return ExitHarness
	}
}

// ConsoleTail returns the console tail carried by a VM error, or "".
func ConsoleTail(err error) string {
	var (
		boot *BootError
		pe   *PanicError
		tmo  *TimeoutError
	)
	switch {
	case errors.As(err, &pe):
		return pe.Console
	case errors.As(err, &tmo):
		return tmo.Console
	case errors.As(err, &boot):
		return boot.Console
	}
	return ""
}
