package netns

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Start starts cmd inside the network namespace at path ("" is the
// caller's own): a child inherits the namespace of the thread that forks
// it.
//
// The forking thread is locked and kept until the child has exited. The
// kernel ties a parent-death signal (SysProcAttr.Pdeathsig) to the thread
// that forked, not to the process: forked from a pooled thread, a child
// would be killed as soon as the runtime ended that thread, which it does
// whenever some other goroutine locks it and exits (entering or creating a
// namespace does). A thread switched into another namespace is discarded
// afterwards, one that stayed in the caller's is returned to the pool.
func Start(path string, cmd *exec.Cmd) error {
	if path == "" {
		return start(vnetns.None(), "", cmd)
	}
	target, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	// start has entered the namespace by the time it returns.
	defer target.Close()
	return start(target, path, cmd)
}

// StartHandle is Start for the namespace behind an open handle, which the
// caller keeps open until StartHandle returns.
func StartHandle(ns vnetns.NsHandle, cmd *exec.Cmd) error {
	return start(ns, ns.String(), cmd)
}

// start forks cmd from a locked thread in target (vnetns.None() for the
// caller's namespace) and returns cmd.Start's error unwrapped.
func start(target vnetns.NsHandle, name string, cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		entered := target.IsOpen()
		if entered {
			if err := vnetns.Set(target); err != nil {
				errc <- fmt.Errorf("enter network namespace %s: %w", name, err)
				return
			}
		}
		if err := cmd.Start(); err != nil {
			errc <- err
		} else {
			errc <- nil
			waitExit(cmd.Process.Pid)
		}
		if !entered {
			runtime.UnlockOSThread()
		}
	}()
	return <-errc
}

// waitExit blocks until the process pid has exited; it does not reap it,
// which stays the job of exec.Cmd.Wait.
func waitExit(pid int) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already (ESRCH): nothing to keep alive
	}
	defer unix.Close(pidfd)
	// A pidfd becomes readable when the process exits.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
