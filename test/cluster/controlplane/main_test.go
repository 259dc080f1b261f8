package main

import "testing"

// Bad arguments are refused before anything is created.
func TestBadArgumentsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--logs", "/tmp/x", "--", "true"},                                                  // no --dir
		{"--dir", "/tmp/x", "--logs", "/tmp/y"},                                             // no command
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--node-address", "10.0.0.1", "--", "true"}, // node outside the prefix
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--host-address", "192.168.50.1", "--", "true"},
		{"--dir", "/tmp/x", "--logs", "/tmp/y", "--pod-cidr", "10.244.0.0", "--", "true"},
		{"--no-such-flag"},
	} {
		if code := run(args); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
	}
}
