package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/vm"
)

// maxFailureLines bounds what printFailures shows of one failed cell.
const maxFailureLines = 120

// printFailures prints, for every failed cell, where its log is, the output
// of each failed test (its own lines, as `go tool test2json` attributes
// them) and the log's last lines, so that a CI log names the failed tests
// and their messages without the files. A -v log's tail alone shows only
// the tests that ran last, which usually passed.
func printFailures(w io.Writer, names []string, cols []*column) {
	for _, c := range cols {
		for i, x := range c.cells {
			if x.passed() || x.state == stateElsewhere {
				continue
			}
			fmt.Fprintf(w, "--- %s on %s: %s (log %s)\n", names[i], c.release, x.state, x.log)
			data, err := os.ReadFile(x.log)
			if err != nil || len(data) == 0 {
				continue
			}
			if failed, err := failedTests(data); err != nil {
				fmt.Fprintf(w, "    (no per-test output: %v)\n", err)
			} else if failed != "" {
				fmt.Fprintln(w, failed)
				fmt.Fprintln(w, "    ... the log's last lines:")
			}
			fmt.Fprintln(w, vm.Tail(data, 25))
		}
	}
}

// testEvent is the part of `go tool test2json`'s events failedTests reads.
type testEvent struct {
	Action string
	Test   string
	Output string
}

// failedTests returns the output lines of every test that failed in a
// -test.v log, test by test in the order they ended, bounded by
// maxFailureLines. It is empty when no test failed (a crash outside any
// test, or a timeout: the tail shows those).
func failedTests(log []byte) (string, error) {
	cmd := exec.Command("go", "tool", "test2json")
	cmd.Stdin = bytes.NewReader(log)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go tool test2json: %w", err)
	}
	output := make(map[string][]string)
	var failed []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var ev testEvent
		if err := dec.Decode(&ev); err != nil {
			return "", fmt.Errorf("go tool test2json output: %w", err)
		}
		if ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "output":
			line := strings.TrimRight(ev.Output, "\n")
			if strings.HasPrefix(strings.TrimSpace(line), "=== ") {
				continue
			}
			output[ev.Test] = append(output[ev.Test], line)
		case "fail":
			failed = append(failed, ev.Test)
		}
	}
	var b strings.Builder
	n := 0
	for _, name := range failed {
		for _, line := range output[name] {
			if n == maxFailureLines {
				fmt.Fprintf(&b, "    ... (more in the log)\n")
				return strings.TrimRight(b.String(), "\n"), nil
			}
			fmt.Fprintln(&b, line)
			n++
		}
	}
	return strings.TrimRight(b.String(), "\n"), nil
}
