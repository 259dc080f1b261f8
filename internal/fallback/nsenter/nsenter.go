// Package nsenter runs code and commands inside a network namespace named
// by its path, so that the fallback dataplanes can program a namespace other
// than their own: the agent's node namespace in production (the empty path,
// no switch at all) and a test's node namespace in privileged tests.
package nsenter

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread inside the network namespace at path ("" is
// the caller's own, and then fn simply runs). Sockets fn opens belong to
// that namespace for their whole life, and /proc/sys/net opened by fn shows
// its settings; goroutines fn starts do not run in it. A thread that cannot
// be switched back is discarded rather than reused.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()

	type outcome struct {
		err   error
		panic any
	}
	done := make(chan outcome, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- outcome{err: fmt.Errorf("get current network namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			done <- outcome{err: fmt.Errorf("enter network namespace %s: %w", path, err)}
			return
		}
		var out outcome
		func() {
			defer func() { out.panic = recover() }()
			out.err = fn()
		}()
		if err := netns.Set(orig); err != nil {
			// Returning with the thread still locked makes the runtime end
			// it, so no other goroutine ever runs in the wrong namespace.
			out.err = errors.Join(out.err, fmt.Errorf("leave network namespace %s: %w", path, err))
			done <- out
			return
		}
		runtime.UnlockOSThread()
		done <- out
	}()
	out := <-done
	if out.panic != nil {
		panic(out.panic)
	}
	return out.err
}

// Start starts cmd inside the network namespace at path: a child process
// inherits the namespace of the thread that forks it.
func Start(path string, cmd *exec.Cmd) error {
	return Do(path, cmd.Start)
}
