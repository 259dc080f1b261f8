package cluster

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
)

// StartT starts a cluster for a test and stops it in t.Cleanup (and on
// SIGINT or SIGTERM). When the test has failed, the cleanup first logs the
// end of the API server's and etcd's logs.
//
// Missing binaries fail the test when the CI environment variable is set to
// true: the runner must build them (BuildCommand), and a suite that silently
// skipped its end-to-end tests would pass without proving anything.
// Elsewhere the test is skipped with the same message, naming the command.
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := Start(context.Background(), opts)
	if errors.Is(err, ErrBinariesMissing) && !InCI() {
		t.Skipf("%v (CI=true turns this skip into a failure)", err)
	}
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTails(40))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return c
}

// InCI reports whether the CI environment variable is true, as CI systems
// set it.
func InCI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}
