package main

import (
	"strings"
	"testing"
)

func TestFailedTestsNamesTheFailuresNotTheTail(t *testing.T) {
	log := strings.Join([]string{
		"=== RUN   TestA",
		"=== RUN   TestA/sub",
		"    a_test.go:5: connection to 10.96.0.1:80 timed out",
		"=== RUN   TestA/other",
		"    a_test.go:9: only a log line of a passing subtest",
		"--- FAIL: TestA (1.00s)",
		"    --- FAIL: TestA/sub (1.00s)",
		"    --- PASS: TestA/other (0.00s)",
		"=== RUN   TestB",
		"    b_test.go:1: fine",
		"--- PASS: TestB (0.00s)",
		"FAIL",
		"",
	}, "\n")
	// The layout of a real -test.v log: subtests' results follow their
	// parent's.
	got, err := failedTests([]byte(log))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a_test.go:5: connection to 10.96.0.1:80 timed out", "--- FAIL: TestA/sub", "--- FAIL: TestA "} {
		if !strings.Contains(got, want) {
			t.Errorf("failure report lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"passing subtest", "b_test.go", "=== RUN"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("failure report holds %q from a passing test:\n%s", unwanted, got)
		}
	}

	none, err := failedTests([]byte("=== RUN   TestB\n--- PASS: TestB (0.00s)\nPASS\n"))
	if err != nil || none != "" {
		t.Errorf("a passing log reported %q, %v", none, err)
	}
}
