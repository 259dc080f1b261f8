package netns

import (
	"errors"
	"fmt"
	"runtime"

	vnetns "github.com/vishvananda/netns"
)

// Do runs fn on an OS thread inside the network namespace at path ("" is
// the caller's own, and then fn simply runs). Sockets fn opens belong to
// that namespace for their whole life, and /proc/sys/net opened by fn shows
// its settings; goroutines fn starts do not run in it. A panic in fn is
// raised again in the caller.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()
	return do(target, path, fn)
}

// DoHandle is Do for the namespace behind an open handle, which the caller
// keeps open until DoHandle returns.
func DoHandle(ns vnetns.NsHandle, fn func() error) error {
	return do(ns, ns.String(), fn)
}

func do(target vnetns.NsHandle, name string, fn func() error) error {
	type outcome struct {
		err   error
		panic any
	}
	done := make(chan outcome, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			done <- outcome{err: fmt.Errorf("get current network namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := vnetns.Set(target); err != nil {
			done <- outcome{err: fmt.Errorf("enter network namespace %s: %w", name, err)}
			return
		}
		var out outcome
		func() {
			defer func() { out.panic = recover() }()
			out.err = fn()
		}()
		if err := vnetns.Set(orig); err != nil {
			// Returning with the thread still locked makes the runtime end
			// it.
			out.err = errors.Join(out.err, fmt.Errorf("leave network namespace %s: %w", name, err))
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
