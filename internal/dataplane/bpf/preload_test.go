package bpf

import (
	"testing"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestStopDoesNotWaitForTheTCPreload: an attacher without --devices
// verifies the TC programs in the background from start-up; stopping
// before that ends returns without waiting for it: on a slow node the
// verifier held an agent's stop past its deadline.
func TestStopDoesNotWaitForTheTCPreload(t *testing.T) {
	ns := sandbox.TestNetns(t, "pre")
	release := make(chan struct{})
	started := make(chan struct{})
	preloadTC = func(loader.TCConfig) (*loader.TCLoaded, error) {
		close(started)
		<-release
		return nil, nil
	}
	t.Cleanup(func() { preloadTC = loader.PreloadTC })
	var a *tcAttacher
	if err := ns.Do(func() error {
		var err error
		a, err = newTCAttacher(Config{BPFFSPath: t.TempDir(), SNATPorts: PortRange{Min: 61000, Max: 65535}}, zap.NewNop(), nil, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	<-started
	closed := make(chan struct{})
	go func() {
		a.close()
		close(closed)
	}()
	// close must return while the preload is still held back: if it
	// waited, this receive would never come, and the test would end at
	// its deadline rather than pass.
	<-closed
	close(release)
}
