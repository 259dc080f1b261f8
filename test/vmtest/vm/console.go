package vm

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/guest"
)

// Console is what the serial console of one VM run says about its outcome.
type Console struct {
	// Stage1 is set once the initramfs has the root ready.
	Stage1 bool
	// Ready is set once the guest agent has finished set-up.
	Ready bool
	// Done is set after the agent ran the last job.
	Done bool
	// SetupError is the initramfs's or the agent's reason for giving up.
	SetupError string
	// Missing lists requested modules the kernel does not have.
	Missing []string
	// Jobs holds the outcome of each job that finished, by index.
	Jobs map[int]JobResult
	// Panic is the kernel's "Kernel panic - not syncing" line, if any.
	Panic string
	// Problems are kernel oopses, BUGs and WARNINGs: the VM went on, but a
	// test that caused one deserves a look.
	Problems []string
}

var (
	jobLine = regexp.MustCompile(`vmtest-guest: job=(\d+) exit=(-?\d+) elapsed=(\d+)ms( timeout)?`)
	// Lines the kernel prints when something is wrong inside it.
	problemLine = regexp.MustCompile(`\b(BUG: |Oops: |WARNING: CPU: |general protection fault|Kernel BUG at|watchdog: BUG: soft lockup|INFO: task .* blocked for more than)`)
)

// ParseConsole reads the console output of a run. Markers are found
// anywhere in a line, since a kernel message can precede them on the
// same line.
func ParseConsole(out []byte) Console {
	c := Console{Jobs: map[int]JobResult{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		switch {
		case strings.Contains(line, guest.MarkerStage1):
			c.Stage1 = true
		case strings.Contains(line, guest.MarkerReady):
			c.Ready = true
		case strings.Contains(line, guest.MarkerDone):
			c.Done = true
		case strings.Contains(line, guest.MarkerStage1Error):
			c.SetupError = after(line, guest.MarkerStage1Error)
		case strings.Contains(line, guest.MarkerError):
			// The first reason is the cause; later ones are
			// consequences, such as a failed power-off.
			if c.SetupError == "" {
				c.SetupError = after(line, guest.MarkerError)
			}
		case strings.Contains(line, guest.MarkerMissing):
			c.Missing = strings.Fields(after(line, guest.MarkerMissing))
		case strings.Contains(line, "Kernel panic - not syncing"):
			if c.Panic == "" {
				c.Panic = strings.TrimSpace(line[strings.Index(line, "Kernel panic"):])
			}
		default:
			if m := jobLine.FindStringSubmatch(line); m != nil {
				i, _ := strconv.Atoi(m[1])
				code, _ := strconv.Atoi(m[2])
				ms, _ := strconv.Atoi(m[3])
				c.Jobs[i] = JobResult{
					Ran:      true,
					ExitCode: code,
					Elapsed:  time.Duration(ms) * time.Millisecond,
					TimedOut: m[4] != "",
				}
			} else if problemLine.MatchString(line) {
				c.Problems = append(c.Problems, strings.TrimSpace(line))
			}
		}
	}
	return c
}

func after(line, marker string) string {
	return strings.TrimSpace(line[strings.Index(line, marker)+len(marker):])
}

// Outcome turns what the console said into the run's error: nil when every
// job ran (whatever its exit code), and otherwise a *PanicError (the kernel
// panicked while jobs ran), a *TimeoutError or a *BootError (the guest never
// got ready, a panic during boot included), so that a broken VM is never
// mistaken for a failing test. timedOut reports that the host killed QEMU at the
// deadline; exitErr is QEMU's own failure, if any.
func (c Console) Outcome(jobs int, timedOut bool, timeout time.Duration, exitErr error, console []byte) error {
	tail := Tail(console, 40)
	switch {
	case c.Panic != "" && c.Ready:
		return &PanicError{Message: c.Panic, Console: tail}
	case c.Panic != "":
		// Before the guest is ready no job has run: the kernel could
		// not boot with this initramfs, or the agent died as PID 1.
		return &BootError{Stage: c.stage(jobs), Reason: c.Panic, Console: tail}
	case timedOut:
		return &TimeoutError{Timeout: timeout, Stage: c.stage(jobs), Console: tail}
	case c.SetupError != "":
		return &BootError{Stage: c.stage(jobs), Reason: c.SetupError, Console: tail}
	case !c.Ready:
		reason := "the VM stopped before the guest was ready"
		if exitErr != nil {
			reason = fmt.Sprintf("qemu: %v", exitErr)
		}
		return &BootError{Stage: c.stage(jobs), Reason: reason, Console: tail}
	case !c.Done || len(c.Jobs) < jobs:
		reason := "the VM stopped before the last job finished"
		if exitErr != nil {
			reason = fmt.Sprintf("qemu: %v", exitErr)
		}
		return &BootError{Stage: c.stage(jobs), Reason: reason, Console: tail}
	}
	return nil
}

// stage names how far the run got, for error messages.
func (c Console) stage(jobs int) string {
	switch {
	case !c.Stage1:
		return "kernel and initramfs"
	case !c.Ready:
		return "guest set-up"
	case len(c.Jobs) < jobs:
		return fmt.Sprintf("job %d of %d", len(c.Jobs)+1, jobs)
	default:
		return "power-off"
	}
}

// Tail returns the last n lines of console output.
func Tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
