package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Outside runs the clients of `probe` and `loop` on behalf of a test that
// cannot run them where they must be: outside the cluster, in the control
// plane's network namespace (test/cluster/controlplane), while the test
// runs on a node. It answers over HTTP:
//
//	GET  /probe?proto=tcp&count=N&timeout=D&addr=A   the ProbeReport
//	POST /loop?addr=A&interval=D&timeout=D&max-duration=D   {"id": N}
//	POST /loop/stop?id=N   the loop's LoopReport, once it has ended
//
// It runs nothing but those clients. A loop ends at the stop request (its
// report's Stopped is then "stdin", as when `loop`'s input ends), at its
// max-duration, or when Outside's context ends.
type Outside struct {
	mu    sync.Mutex
	next  int
	loops map[int]*outsideLoop
}

type outsideLoop struct {
	stop   chan struct{}
	done   chan struct{}
	report LoopReport
}

// Serve answers on l until ctx ends, then ends the loops still running.
func (o *Outside) Serve(ctx context.Context, l net.Listener) error {
	o.loops = map[int]*outsideLoop{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /probe", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		count, err := strconv.Atoi(q.Get("count"))
		if err != nil || count < 1 || count > 10000 {
			http.Error(w, "count: want 1 to 10000", http.StatusBadRequest)
			return
		}
		timeout, err := time.ParseDuration(q.Get("timeout"))
		proto := q.Get("proto")
		if err != nil || timeout <= 0 || (proto != "tcp" && proto != "udp") || q.Get("addr") == "" {
			http.Error(w, "want proto=tcp|udp, a positive timeout and addr", http.StatusBadRequest)
			return
		}
		writeJSON(w, Probe(r.Context(), proto, q.Get("addr"), count, timeout))
	})
	mux.HandleFunc("POST /loop", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var d [3]time.Duration
		for i, k := range []string{"interval", "timeout", "max-duration"} {
			var err error
			if d[i], err = time.ParseDuration(q.Get(k)); err != nil || d[i] < 0 || (i > 0 && d[i] == 0) {
				http.Error(w, k+": want a duration, positive but for interval", http.StatusBadRequest)
				return
			}
		}
		if q.Get("addr") == "" {
			http.Error(w, "addr: want the address to connect to", http.StatusBadRequest)
			return
		}
		lp := &outsideLoop{stop: make(chan struct{}), done: make(chan struct{})}
		o.mu.Lock()
		o.next++
		id := o.next
		o.loops[id] = lp
		o.mu.Unlock()
		go func() {
			lp.report = Loop(ctx, q.Get("addr"), d[0], d[1], d[2], lp.stop)
			close(lp.done)
		}()
		writeJSON(w, map[string]int{"id": id})
	})
	mux.HandleFunc("POST /loop/stop", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.URL.Query().Get("id"))
		o.mu.Lock()
		lp := o.loops[id]
		delete(o.loops, id)
		o.mu.Unlock()
		if lp == nil {
			http.Error(w, fmt.Sprintf("no loop %q", r.URL.Query().Get("id")), http.StatusNotFound)
			return
		}
		close(lp.stop)
		<-lp.done
		writeJSON(w, lp.report)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
