package sockterm_test

import (
	"os"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestMain lets the sandbox's client probes, which re-execute this binary,
// run.
func TestMain(m *testing.M) {
	sandbox.Main()
	os.Exit(m.Run())
}
