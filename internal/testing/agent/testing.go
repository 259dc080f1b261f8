package agent

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Main is TestMain for a package whose tests run the agent in a sandbox:
// it runs a client probe and exits when the binary was started as one (see
// sandbox.Main), else runs the tests and removes the agent binary it built.
func Main(m *testing.M) {
	sandbox.Main()
	code := m.Run()
	RemoveBinary()
	os.Exit(code)
}

// Run starts the program of opts for the test t, failing t if it cannot.
// When t ends the process is killed if it still runs, and its output is
// logged if t failed.
func Run(t testing.TB, opts Options) *Process {
	t.Helper()
	p, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s %v log:\n%s", p.name, opts.Args, p.Logs())
		}
	})
	return p
}

// ExitWithin waits up to timeout for the process to exit, failing t if it
// does not; it returns how the process ended (nil for status 0).
func (p *Process) ExitWithin(t testing.TB, timeout time.Duration) error {
	t.Helper()
	err := p.Wait(timeout)
	if errors.Is(err, ErrRunning) {
		t.Fatalf("%s did not exit within %v:\n%s", p.name, timeout, p.Logs())
	}
	return err
}

// SignalAndWait sends sig and waits up to timeout for the process to exit,
// failing t if it cannot be signalled or does not exit; it returns how the
// process ended (nil for status 0).
func (p *Process) SignalAndWait(t testing.TB, sig os.Signal, timeout time.Duration) error {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return p.ExitWithin(t, timeout)
}

// Terminate sends SIGTERM and waits up to timeout for the process to exit;
// it fails t unless the process exits in time with status 0.
func (p *Process) Terminate(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := p.SignalAndWait(t, syscall.SIGTERM, timeout); err != nil {
		t.Errorf("%s exit on SIGTERM: %v\n%s", p.name, err, p.Logs())
	}
}

// MustGet is GetWhenUp, failing t if no connection is made; it returns the
// status code and the body.
func (p *Process) MustGet(t testing.TB, url string) (int, string) {
	t.Helper()
	code, body, err := p.GetWhenUp(url)
	if err != nil {
		t.Fatal(err)
	}
	return code, string(body)
}
