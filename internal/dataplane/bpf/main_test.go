package bpf_test

import (
	"os"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestMain lets the test binary serve as the sandbox's probe and server
// processes.
func TestMain(m *testing.M) {
	sandbox.Main()
	os.Exit(m.Run())
}
