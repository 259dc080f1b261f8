package netns

import (
	"fmt"
	"runtime"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// New creates a network namespace and returns an open handle to it, which
// the caller closes. With bindPath, an existing file, the namespace is also
// bind-mounted there (as `ip netns add` does under /run/netns) and outlives
// the handle until it is unmounted; after an error the caller unmounts
// bindPath as it would otherwise.
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
