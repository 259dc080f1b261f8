package main

import (
	"context"
	"time"
)

// LoopReport is what `loop` prints: how a stream of connections fared while
// something changed (a rollout, an agent restart, an upgrade).
type LoopReport struct {
	Addr     string `json:"addr"`
	Attempts int    `json:"attempts"`
	Failures int    `json:"failures"`
	// Errors counts the failures by kind (Kind...).
	Errors map[string]int `json:"errors"`
	// Servers counts the successful attempts by the server that answered.
	Servers map[string]int `json:"servers"`
	// FirstFailure and LastFailure are when the first and the last failed
	// attempt started; nil when none failed.
	FirstFailure *time.Time `json:"first_failure,omitempty"`
	LastFailure  *time.Time `json:"last_failure,omitempty"`
	// Stalled counts the attempts in which the client did not run for a
	// while (Attempt.StalledMS), and MaxStalledMS is the longest such time.
	Stalled      int     `json:"stalled"`
	MaxStalledMS float64 `json:"max_stalled_ms"`
	// LastError is the text of the last failure.
	LastError string `json:"last_error,omitempty"`
	// FailedAttempts are the first maxFailedAttempts failed attempts,
	// each with when it started: how long one took tells a refusal from a
	// neighbour resolution that gave up or a timeout.
	FailedAttempts []TimedAttempt `json:"failed_attempts,omitempty"`
	Started        time.Time      `json:"started"`
	Ended          time.Time      `json:"ended"`
	// Stopped says why the loop ended: "stdin" (EOF), "max-duration" or
	// "signal" (its context ended).
	Stopped string `json:"stopped"`
}

// TimedAttempt is an attempt and when it started.
type TimedAttempt struct {
	At time.Time `json:"at"`
	Attempt
}

// maxFailedAttempts bounds LoopReport.FailedAttempts.
const maxFailedAttempts = 10

// Loop connects to addr over TCP every interval (or right after the last
// attempt, if that took longer), each attempt within timeout, until stop is
// closed, maxDuration passes or ctx ends.
func Loop(ctx context.Context, addr string, interval, timeout, maxDuration time.Duration, stop <-chan struct{}) LoopReport {
	r := LoopReport{Addr: addr, Errors: map[string]int{}, Servers: map[string]int{}, Started: time.Now()}
	deadline := time.NewTimer(maxDuration)
	defer deadline.Stop()
	// An attempt in progress ends when the loop is told to stop: it is not
	// counted, as its failure would be the loop's own doing.
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stopped string // written before watched is closed
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-stop:
			stopped = "stdin"
		case <-deadline.C:
			stopped = "max-duration"
		case <-actx.Done():
			stopped = "signal"
		}
		cancel()
	}()
	next := time.NewTimer(0)
	defer next.Stop()
	for {
		select {
		case <-actx.Done():
			<-watched
			r.Ended = time.Now()
			r.Stopped = stopped
			return r
		case <-next.C:
		}
		start := time.Now()
		a := attempt(actx, "tcp", addr, timeout)
		if actx.Err() != nil {
			continue
		}
		r.Attempts++
		if a.StalledMS > 0 {
			r.Stalled++
			r.MaxStalledMS = max(r.MaxStalledMS, a.StalledMS)
		}
		if a.Error == "" {
			r.Servers[a.Server]++
		} else {
			r.Failures++
			r.Errors[a.Error]++
			t := start
			if r.FirstFailure == nil {
				r.FirstFailure = &t
			}
			r.LastFailure = &t
			r.LastError = a.Detail
			if len(r.FailedAttempts) < maxFailedAttempts {
				r.FailedAttempts = append(r.FailedAttempts, TimedAttempt{At: start, Attempt: a})
			}
		}
		next.Reset(max(0, interval-time.Since(start)))
	}
}
