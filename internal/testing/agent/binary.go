package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// BinaryEnv names a prebuilt ebpf-proxy binary. The Makefile builds
// bin/ebpf-proxy once and sets it, also for the VM runner, whose guests
// have no time to build one.
const BinaryEnv = "EBPF_PROXY_BIN"

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Binary returns the ebpf-proxy binary under test: $EBPF_PROXY_BIN, or one
// built from this source tree once per test binary (RemoveBinary removes
// it).
func Binary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("%s=%s: %w", BinaryEnv, p, err)
		}
		return abs, nil
	}
	b := &build
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "ebpf-proxy-bin-"); b.err != nil {
			return
		}
		b.bin = filepath.Join(b.dir, "ebpf-proxy")
		cmd := exec.Command("go", "build", "-o", b.bin, "github.com/ebpf-proxy/ebpf-proxy/cmd/ebpf-proxy")
		cmd.Dir = moduleDir()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build ebpf-proxy (or set %s): %v\n%s", BinaryEnv, err, out)
		}
	})
	return b.bin, b.err
}

// RemoveBinary removes the binary Binary built, if it built one; a TestMain
// calls it after m.Run.
func RemoveBinary() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
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
