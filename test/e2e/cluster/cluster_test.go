package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary run helperMain instead of the tests: a
// control plane in a process that the test can interrupt or kill.
const helperEnv = "EBPF_PROXY_E2E_CLUSTER_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain())
	}
	os.Exit(m.Run())
}

func helperMain() int {
	c, err := Start(context.Background(), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("READY %d %d %s\n", c.EtcdPID(), c.APIServerPID(), c.Dir())
	// The test signals or kills this process; the bound only matters if
	// the test itself died first.
	time.Sleep(5 * time.Minute)
	_ = c.Stop()
	return 1
}

func requireBinaries(t *testing.T) {
	t.Helper()
	if _, err := FindBinaries(); err != nil {
		if errors.Is(err, ErrBinariesMissing) && !InCI() {
			t.Skipf("%v (CI=true turns this skip into a failure)", err)
		}
		t.Fatal(err)
	}
}

// waitGone waits, bounded, for the kernel to deliver a parent-death signal
// and for the orphan to die; it is not a speed assertion.
func waitGone(pid int) bool {
	for range 300 {
		if !ProcessRunning(pid) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func TestTeardownWhenTestBinaryDies(t *testing.T) {
	requireBinaries(t)
	tests := []struct {
		name string
		sig  syscall.Signal
		// cleanupRuns: the signal handler stops the cluster in order and
		// removes its directory. Otherwise only the kernel's parent-death
		// signal ends the processes, and the directory remains.
		cleanupRuns bool
	}{
		{name: "Ctrl-C (SIGINT): processes stopped, directory removed", sig: syscall.SIGINT, cleanupRuns: true},
		{name: "SIGTERM from the CI runner: processes stopped, directory removed", sig: syscall.SIGTERM, cleanupRuns: true},
		{name: "SIGKILL or go test -timeout: processes killed by the kernel", sig: syscall.SIGKILL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=1")
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				t.Fatalf("helper did not start a cluster: %v", err)
			}
			var etcdPID, apiPID int
			var dir string
			if _, err := fmt.Sscanf(line, "READY %d %d %s", &etcdPID, &apiPID, &dir); err != nil {
				t.Fatalf("helper said %q: %v", line, err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if !strings.HasPrefix(dir, os.TempDir()) {
				t.Fatalf("cluster directory %s is not under %s", dir, os.TempDir())
			}
			for _, pid := range []int{etcdPID, apiPID} {
				if !ProcessRunning(pid) {
					t.Fatalf("process %d is not running before the signal", pid)
				}
			}

			if err := cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) {
				t.Fatalf("helper ended with %v, want death by %v", err, tt.sig)
			}
			if ws := exitErr.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != tt.sig {
				t.Errorf("helper ended with %v, want death by %v (the handler re-raises the signal)", err, tt.sig)
			}

			for _, pid := range []int{etcdPID, apiPID} {
				if tt.cleanupRuns {
					// The handler reaps the processes before the helper
					// exits: no waiting allowed.
					if ProcessRunning(pid) {
						t.Errorf("process %d still runs after the helper exited", pid)
					}
				} else if !waitGone(pid) {
					t.Errorf("process %d still runs 30 s after the helper was killed", pid)
				}
			}
			_, err = os.Stat(dir)
			if tt.cleanupRuns && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cluster directory %s: got stat error %v, want it removed", dir, err)
			}
		})
	}
}

func TestStopIsIdempotent(t *testing.T) {
	requireBinaries(t)
	c, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	etcdPID, apiPID := c.EtcdPID(), c.APIServerPID()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	for _, pid := range []int{etcdPID, apiPID} {
		if ProcessRunning(pid) {
			t.Errorf("process %d still runs after Stop", pid)
		}
	}
	if c.EtcdPID() != 0 || c.APIServerPID() != 0 {
		t.Errorf("PIDs after Stop: etcd %d, kube-apiserver %d; want 0", c.EtcdPID(), c.APIServerPID())
	}
	if err := c.StartAPIServer(context.Background()); err == nil {
		t.Error("StartAPIServer after Stop succeeded")
	}
}
