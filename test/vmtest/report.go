package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Cell states. Only stateOK and stateSkip count as passed.
const (
	stateOK = "ok"
	// stateSkip: the binary passed, but every top-level test skipped.
	// Tests skip only where their feature genuinely cannot exist, and
	// say why in the log.
	stateSkip = "skip"
	stateFail = "FAIL"
	// stateTimeout: the job ran past its deadline and was killed.
	stateTimeout = "TIMEOUT"
	// The VM failed under the job: not a verdict on the code under test.
	stateVMPanic   = "VM-PANIC"
	stateVMBoot    = "VM-BOOT-FAIL"
	stateVMTimeout = "VM-TIMEOUT"
	// stateBuild: the test binary did not compile.
	stateBuild = "BUILD-FAIL"
	// stateNotRun: the column could not start (no kernel).
	stateNotRun = "NOT-RUN"
	// stateElsewhere: a --only rule gives the package to other kernels
	// of the matrix; neither passed nor failed.
	stateElsewhere = "-"
)

// cell is one package on one kernel.
type cell struct {
	state   string
	elapsed time.Duration
	log     string
}

func (c cell) passed() bool { return c.state == stateOK || c.state == stateSkip }

func (c cell) String() string {
	if c.elapsed == 0 {
		return c.state
	}
	return fmt.Sprintf("%s %.1fs", c.state, c.elapsed.Seconds())
}

// verdict classifies a test binary's run from its exit code and its -test.v
// output.
func verdict(exitCode int, timedOut bool, output []byte) string {
	switch {
	case timedOut:
		return stateTimeout
	case exitCode != 0:
		return stateFail
	}
	passed, skipped := topLevelResults(output)
	if passed == 0 && skipped > 0 {
		return stateSkip
	}
	return stateOK
}

// topLevelResults counts the "--- PASS" and "--- SKIP" lines of top-level
// tests in -test.v output; subtests are indented.
func topLevelResults(output []byte) (passed, skipped int) {
	sc := bufio.NewScanner(bytes.NewReader(output))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "--- PASS: "):
			passed++
		case strings.HasPrefix(line, "--- SKIP: "):
			skipped++
		}
	}
	return passed, skipped
}

// column is one kernel of the matrix.
type column struct {
	// release is the kernel release, the column's name.
	release string
	// about says where the kernel came from, for the legend.
	about string
	cells []cell
	// notes are printed under the table: missing modules, kernel
	// warnings, the VM's wall time.
	notes []string
	// retried: the guest panicked and the jobs it cut short ran again.
	retried bool
}

func (c *column) counts() (passed, failed int) {
	for _, x := range c.cells {
		if x.state == stateElsewhere {
			continue
		}
		if x.passed() {
			passed++
		} else {
			failed++
		}
	}
	return passed, failed
}

// printMatrix writes the legend, the table of packages by kernel, the notes
// and one summary line per kernel, last, in the form CI greps for.
func printMatrix(w io.Writer, pkgs []string, cols []*column) {
	for _, c := range cols {
		fmt.Fprintf(w, "vmtest: column %s: %s\n", c.release, c.about)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "package")
	for _, c := range cols {
		fmt.Fprintf(tw, "\t%s", c.release)
	}
	fmt.Fprintln(tw)
	for i, p := range pkgs {
		fmt.Fprint(tw, p)
		for _, c := range cols {
			fmt.Fprintf(tw, "\t%s", c.cells[i])
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	for _, c := range cols {
		for _, n := range c.notes {
			fmt.Fprintf(w, "vmtest: %s: %s\n", c.release, n)
		}
	}
	for _, c := range cols {
		passed, failed := c.counts()
		retried := ""
		if c.retried {
			retried = " retried=1"
		}
		fmt.Fprintf(w, "vmtest: kernel=%s passed=%d failed=%d%s\n", c.release, passed, failed, retried)
	}
}
