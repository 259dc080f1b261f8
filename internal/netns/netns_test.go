package netns_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// inode identifies a network namespace, as `stat -L /proc/<pid>/ns/net`.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// threadNetns is the inode of the calling thread's namespace. Not the
// process's (/proc/self is the main thread): the runtime cannot end the main
// thread, and parks it in whatever namespace a goroutine left it.
func threadNetns(t *testing.T) uint64 { return inode(t, "/proc/thread-self/ns/net") }

// ownNetns is the namespace of the test's threads.
func ownNetns(t *testing.T) uint64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return threadNetns(t)
}

// newNamed creates a namespace bind-mounted on a file of the test's own,
// removed again when the test ends.
func newNamed(t *testing.T) (string, vnetns.NsHandle) {
	t.Helper()
	sandbox.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "ns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	h, err := netns.New(path)
	t.Cleanup(func() {
		if h.IsOpen() {
			h.Close()
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmount %s: %v", path, err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return path, h
}

func TestDoRunsInTheNamespaceAndLeavesTheCallerAlone(t *testing.T) {
	path, h := newNamed(t)
	want := inode(t, path)
	if own := ownNetns(t); own == want {
		t.Fatalf("the new namespace is the test's own (%d)", own)
	}
	for _, tc := range []struct {
		name string
		do   func(fn func() error) error
	}{
		{"by path", func(fn func() error) error { return netns.Do(path, fn) }},
		{"by handle", func(fn func() error) error { return netns.DoHandle(h, fn) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := threadNetns(t)
			var got uint64
			if err := tc.do(func() error { got = threadNetns(t); return nil }); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("fn ran in namespace %d, want %d", got, want)
			}
			if after := threadNetns(t); after != before {
				t.Errorf("the caller's thread moved from namespace %d to %d", before, after)
			}
		})
	}
}

func TestDoWithoutPathRunsInTheCallersNamespace(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var got uint64
	if err := netns.Do("", func() error { got = threadNetns(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if own := threadNetns(t); got != own {
		t.Errorf("fn ran in namespace %d, want the caller's %d", got, own)
	}
}

func TestDoReturnsTheErrorAndRaisesThePanicOfFn(t *testing.T) {
	path, _ := newNamed(t)
	sentinel := errors.New("from fn")
	if err := netns.Do(path, func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	defer func() {
		if r := recover(); r != "from fn" {
			t.Errorf("recovered %v, want fn's panic", r)
		}
	}()
	_ = netns.Do(path, func() error { panic("from fn") })
	t.Error("Do returned after fn panicked")
}

func TestDoFailsForAPathThatIsNoNamespace(t *testing.T) {
	ran := false
	err := netns.Do(filepath.Join(t.TempDir(), "missing"), func() error { ran = true; return nil })
	if err == nil || ran {
		t.Errorf("Do on a missing path: err %v, fn ran %v; want an error and fn not run", err, ran)
	}
}

// startSleep starts sleep with a parent-death signal, as the test harnesses
// start the agent, and kills it when the test ends.
// The channel is closed once it has exited.
func startSleep(t *testing.T, start func(*exec.Cmd) error) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := start(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return cmd, done
}

func TestStartRunsTheChildInTheNamespace(t *testing.T) {
	path, h := newNamed(t)
	want := inode(t, path)
	for _, tc := range []struct {
		name  string
		start func(*exec.Cmd) error
	}{
		{"by path", func(cmd *exec.Cmd) error { return netns.Start(path, cmd) }},
		{"by handle", func(cmd *exec.Cmd) error { return netns.StartHandle(h, cmd) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, _ := startSleep(t, tc.start)
			if got := inode(t, "/proc/"+itoa(cmd.Process.Pid)+"/ns/net"); got != want {
				t.Errorf("child runs in namespace %d, want %d", got, want)
			}
		})
	}
}

// TestStartKeepsTheForkingThread: a child with a parent-death signal
// survives the runtime ending threads, which it does for every goroutine
// that exits with its thread locked.
func TestStartKeepsTheForkingThread(t *testing.T) {
	cmd, exited := startSleep(t, func(cmd *exec.Cmd) error { return netns.Start("", cmd) })
	// Round after round, the runtime takes idle threads from its pool to
	// replace the ended ones, until the forking thread's turn has come.
	for range 64 {
		var wg sync.WaitGroup
		for range runtime.GOMAXPROCS(0) {
			wg.Go(func() {
				runtime.LockOSThread() // never unlocked: the thread ends
			})
		}
		wg.Wait()
	}
	select {
	case <-exited:
		t.Errorf("the child (%v) died with threads the runtime ended", cmd.ProcessState)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestNewWithoutPath(t *testing.T) {
	sandbox.RequireRoot(t)
	h, err := netns.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		t.Fatal(err)
	}
	if own := ownNetns(t); st.Ino == own {
		t.Errorf("New returned the caller's namespace %d", own)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// mountsAt counts the mounts whose mount point is path, by the calling
// process's mount table.
func mountsAt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			n++
		}
	}
	return n
}

// A directory of namespace files made ready by PrepareDir is a mount point
// of its own, once however often it is prepared, so `ip netns add` (whose
// first step, marking the directory shared, then succeeds) lays no mount
// over the files in it: a namespace file unmounted by its path is gone from
// the mount table and can be deleted.
func TestPrepareDirKeepsNamespaceFilesReachable(t *testing.T) {
	sandbox.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		for mountsAt(t, dir) > 0 {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
				return
			}
		}
	})
	for range 2 {
		if err := netns.PrepareDir(dir); err != nil {
			t.Fatal(err)
		}
	}
	if n := mountsAt(t, dir); n != 1 {
		t.Fatalf("%s is the mount point of %d mounts after PrepareDir twice, want 1", dir, n)
	}
	// What `ip netns add` does first: where this fails with EINVAL, it
	// bind-mounts the directory on itself, over what is already there.
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatalf("mark %s shared, as ip netns add does: %v", dir, err)
	}
	path := filepath.Join(dir, "ns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	h, err := netns.New(path)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	if n := mountsAt(t, path); n != 1 {
		t.Fatalf("%s is the mount point of %d mounts, want 1", path, n)
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, path); n != 0 {
		t.Errorf("%d mounts left on %s after unmounting it", n, path)
	}
	if err := os.Remove(path); err != nil {
		t.Errorf("remove the namespace file: %v", err)
	}
}
