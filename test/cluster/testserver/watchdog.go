package main

import (
	"errors"
	"sync"
	"time"
)

// errNoAnswer is the cause an attempt is canceled with when its time is up.
var errNoAnswer = errors.New("no answer in time")

// Under emulation the client may not run for seconds: the guest's one CPU
// is taken by a starting agent's program verification, or the host does
// not run the guest at all. Its connection, handled meanwhile by the
// kernel or waiting with the rest of the guest, is not lost. An attempt's
// time is therefore the time its client ran: a watchdog ticks every
// watchTick, and a tick that comes more than watchSlack late means the
// process did not run; that gap counts as one tick.
const (
	watchTick  = 50 * time.Millisecond
	watchSlack = 200 * time.Millisecond
)

// watchdog calls expire once timeout of running time has passed, unless
// stop is called first. stop returns how long the process did not run
// meanwhile.
func watchdog(timeout time.Duration, expire func()) (stop func() time.Duration) {
	done := make(chan struct{})
	var (
		mu      sync.Mutex
		stalled time.Duration
	)
	go func() {
		t := time.NewTicker(watchTick)
		defer t.Stop()
		last := time.Now()
		var ran time.Duration
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			now := time.Now()
			gap := now.Sub(last)
			last = now
			if gap > watchTick+watchSlack {
				mu.Lock()
				stalled += gap - watchTick
				mu.Unlock()
				gap = watchTick
			}
			if ran += gap; ran >= timeout {
				expire()
				<-done
				return
			}
		}
	}()
	var once sync.Once
	return func() time.Duration {
		once.Do(func() { close(done) })
		mu.Lock()
		defer mu.Unlock()
		return stalled
	}
}
