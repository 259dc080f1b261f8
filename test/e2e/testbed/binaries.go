package testbed

import (
	"os"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// AgentBinaryEnv names a prebuilt ebpf-proxy binary; `make e2e` builds
// bin/ebpf-proxy once and sets it.
const AgentBinaryEnv = sandbox.AgentBinaryEnv

// AgentBinary returns the ebpf-proxy binary under test: $EBPF_PROXY_BIN, or
// one built from this source tree once per test binary (Main removes it).
func AgentBinary() (string, error) { return sandbox.AgentBinary() }

// Main must be called by TestMain of every package that uses a testbed:
// it runs a client probe and exits when the binary was started as one (see
// sandbox.Main), else runs the tests and removes the agent binary it built.
func Main(m *testing.M) {
	sandbox.Main()
	code := m.Run()
	sandbox.RemoveAgentBinary()
	os.Exit(code)
}
