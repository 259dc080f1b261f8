// Package interrupt runs the end-to-end harness's cleanups when the test
// binary is interrupted.
//
// t.Cleanup does not run when go test is stopped with Ctrl-C or killed by CI:
// the process dies at once and leaves behind what the tests started (etcd,
// kube-apiserver, proxies, network namespaces). Every helper that creates such
// a resource registers its teardown here as well as with t.Cleanup.
package interrupt

import (
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"
)

var (
	mu       sync.Mutex
	nextID   int
	cleanups = map[int]func(){}
	install  sync.Once
)

// Register arranges for fn to run if the process receives SIGINT or SIGTERM.
// Cleanups run in the reverse order of registration, like t.Cleanup, after
// which the signal is raised again so the process ends the way it would have
// without the handler. The returned function unregisters fn; call it once the
// resource is gone. fn must be safe to call concurrently with the code that
// normally tears the resource down.
func Register(fn func()) (unregister func()) {
	install.Do(func() {
		ch := make(chan os.Signal, 2)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		go handle(ch)
	})
	mu.Lock()
	defer mu.Unlock()
	id := nextID
	nextID++
	cleanups[id] = fn
	return func() {
		mu.Lock()
		defer mu.Unlock()
		delete(cleanups, id)
	}
}

func handle(ch chan os.Signal) {
	sig := <-ch
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunAll()
	}()
	select {
	case <-done:
	case <-ch:
		// A second signal means the user does not want to wait for a
		// cleanup that hangs.
	}
	signal.Reset(syscall.SIGINT, syscall.SIGTERM)
	_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
	// Delivery is asynchronous; exiting at once would win the race and hide
	// the signal from the parent. Exit only if the signal never arrives
	// (ignored by the parent since before the process started).
	time.Sleep(10 * time.Second)
	os.Exit(1)
}

// RunAll runs and unregisters every registered cleanup, newest first. The
// signal handler calls it; tests of the handler's users call it to simulate
// an interrupt without ending the process.
func RunAll() {
	mu.Lock()
	ids := make([]int, 0, len(cleanups))
	for id := range cleanups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	fns := make([]func(), 0, len(ids))
	for _, id := range slices.Backward(ids) {
		fns = append(fns, cleanups[id])
		delete(cleanups, id)
	}
	mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}
