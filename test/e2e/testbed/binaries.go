package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// AgentBinaryEnv names a prebuilt ebpf-proxy binary; `make e2e` builds
// bin/ebpf-proxy once and sets it.
const AgentBinaryEnv = "EBPF_PROXY_BIN"

var (
	buildOnce sync.Once
	buildDir  string
	builtBin  string
	buildErr  error
)

// AgentBinary returns the ebpf-proxy binary under test: $EBPF_PROXY_BIN, or
// one built from this source tree once per test binary (Main removes it).
func AgentBinary() (string, error) {
	if p := os.Getenv(AgentBinaryEnv); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("%s=%s: %w", AgentBinaryEnv, p, err)
		}
		return abs, nil
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "ebpf-proxy-e2e-bin-")
		if buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "ebpf-proxy")
		cmd := exec.Command("go", "build", "-o", builtBin, "github.com/ebpf-proxy/ebpf-proxy/cmd/ebpf-proxy")
		cmd.Dir = moduleDir()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build ebpf-proxy (or set %s): %v\n%s", AgentBinaryEnv, err, out)
		}
	})
	return builtBin, buildErr
}

// moduleDir is the repository root, found from this source file, so that a
// test binary run from any directory builds the agent of its own tree.
func moduleDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "."
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Main must be called by TestMain of every package that uses a testbed:
// it runs a client probe and exits when the binary was started as one (see
// sandbox.Main), else runs the tests and removes the agent binary it built.
func Main(m *testing.M) {
	sandbox.Main()
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
