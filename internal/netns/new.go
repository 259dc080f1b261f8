package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// New creates a network namespace and returns an open handle to it, which
// the caller closes. With bindPath, an existing file, the namespace is also
// bind-mounted there (as `ip netns add` does under /run/netns) and outlives
// the handle until it is unmounted; after an error the caller unmounts
// bindPath as it would otherwise. A directory that holds such files is
// prepared first (PrepareDir).
//
// It unshares on a thread of its own that is never unlocked: the runtime
// ends the thread with its goroutine, so no other goroutine ever runs inside
// the new namespace.
func New(bindPath string) (vnetns.NsHandle, error) {
	type result struct {
		h   vnetns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{h: vnetns.None(), err: fmt.Errorf("create network namespace: unshare: %w", err)}
			return
		}
		if bindPath != "" {
			if err := unix.Mount("/proc/thread-self/ns/net", bindPath, "", unix.MS_BIND, ""); err != nil {
				done <- result{h: vnetns.None(), err: fmt.Errorf("create network namespace: bind-mount on %s: %w", bindPath, err)}
				return
			}
		}
		h, err := vnetns.Get()
		if err != nil {
			err = fmt.Errorf("create network namespace: open it: %w", err)
		}
		done <- result{h: h, err: err}
	}()
	r := <-done
	return r.h, r.err
}

// PrepareDir makes dir, a directory of named namespaces such as
// /run/netns, ready for New's bind mounts as `ip netns add` does: it creates
// dir, and where dir is not yet a mount point, bind-mounts it on itself and
// makes it a shared mount. Call it before the first New under dir.
//
// A namespace file bind-mounted in a plain directory is hidden as soon as
// anything makes that directory a mount point (`ip netns add` does, the
// first time it runs on a machine): the path then leads to a copy, which
// unmounting removes while the original stays mounted, out of reach, and its
// file can no longer be deleted (EBUSY). In a directory that already is a
// mount point, `ip netns add` only marks it shared again.
//
// Callers in several processes are serialised by a lock on dir.
func PrepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	// Marking a directory shared fails with EINVAL where it is no mount
	// point.
	err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		if err != nil {
			return fmt.Errorf("make %s a shared mount: %w", dir, err)
		}
		return nil
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s on itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	return nil
}
