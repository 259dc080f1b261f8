package testbed

import (
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
)

// Main must be called by TestMain of every package that uses a testbed
// (agent.Main): probes re-execute the test binary, and the agent binary it
// built, unless $EBPF_PROXY_BIN named one (`make e2e` sets it), is removed
// after the run.
func Main(m *testing.M) { agent.Main(m) }
