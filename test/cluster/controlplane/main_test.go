package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// Bad arguments are refused before anything is created.
func TestBadArgumentsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--logs", "/tmp/x", "--", "true"},                                                     // no --dir
		{"--dir", "/tmp/x", "--logs", "/tmp/y"},                                                // no command
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--host-address", "10.0.0.1/24", "--", "true"}, // the nodes outside it
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--host-address", "192.168.50.1", "--", "true"},
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--nodes", "0", "--", "true"},
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--nodes", "17", "--", "true"},
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--beside", "node2:", "--", "true"}, // a name, no command
		{"--no-such-flag"},
	} {
		if code := run(args); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
	}
}

func TestBesideTakesAnOptionalName(t *testing.T) {
	var l besideList
	for _, v := range []string{"node2: /bin/vmtest --tap node2-tap -- worker", "/usr/bin/testserver  outside --listen 1.2.3.4:5"} {
		if err := l.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if l[0].name != "node2" || !slices.Equal(l[0].args, []string{"/bin/vmtest", "--tap", "node2-tap", "--", "worker"}) ||
		l[1].name != "testserver" || !slices.Equal(l[1].args, []string{"/usr/bin/testserver", "outside", "--listen", "1.2.3.4:5"}) {
		t.Errorf("--beside parsed as %+v", l)
	}
}

// A command beside the main one that fails on its own is reported; one
// still running when the main command ends is told to stop, and its exit
// by that signal is no failure.
func TestBesideCommandsEndWithTheMainOne(t *testing.T) {
	env := []string{"PATH=/usr/bin:/bin"}
	failed, err := startBeside(besideCommand{name: "fails", args: []string{"sh", "-c", "exit 3"}}, env)
	if err != nil {
		t.Fatal(err)
	}
	<-failed.done
	running, err := startBeside(besideCommand{name: "runs", args: []string{"sleep", "600"}}, env)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := stopBeside([]*besideProcess{failed, running})
	if !strings.Contains(got, "fails failed") || strings.Contains(got, "runs") {
		t.Errorf("stopBeside = %q, want the command that failed on its own alone", got)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the running command took %v to stop after SIGTERM", d)
	}
	if stopBeside([]*besideProcess{running}) != "" {
		t.Errorf("stopping an ended command again reports a failure")
	}
}
