package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// startOutside serves an Outside on a loopback port for the test.
func startOutside(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Outside{}).Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("outside: %v", err)
		}
	})
	return "http://" + l.Addr().String()
}

// call makes a request and decodes its JSON answer into v, wanting status.
func call(t *testing.T, method, u string, status int, v any) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("%s %s: %s %s, want %d", method, u, resp.Status, b, status)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s %s: %v: %s", method, u, err, b)
		}
	}
}

func TestOutsideRunsProbesAndLoopsForATest(t *testing.T) {
	base := startOutside(t)
	tcp, udp := startServer(t, "pod-a")

	var p ProbeReport
	call(t, "GET", base+"/probe?"+url.Values{"proto": {"udp"}, "count": {"3"}, "timeout": {"1s"}, "addr": {udp}}.Encode(), 200, &p)
	if len(p.Attempts) != 3 || p.Attempts[0].Server != "pod-a" || p.Attempts[2].Error != "" {
		t.Errorf("probe: %+v, want 3 datagrams answered by pod-a", p)
	}

	var started struct{ ID int }
	call(t, "POST", base+"/loop?"+url.Values{"addr": {tcp}, "interval": {"20ms"}, "timeout": {"1s"}, "max-duration": {"1m"}}.Encode(), 200, &started)
	time.Sleep(300 * time.Millisecond)
	var r LoopReport
	call(t, "POST", base+"/loop/stop?id="+url.QueryEscape(jsonInt(started.ID)), 200, &r)
	if r.Stopped != "stdin" || r.Attempts < 5 || r.Failures != 0 || r.Servers["pod-a"] != r.Attempts {
		t.Errorf("loop: stopped by %q, %d attempts, %d failed, servers %v; want stopped on request, all answered by pod-a",
			r.Stopped, r.Attempts, r.Failures, r.Servers)
	}
	// A loop is stopped once; bad requests are refused, not run.
	call(t, "POST", base+"/loop/stop?id="+jsonInt(started.ID), 404, nil)
	call(t, "GET", base+"/probe?proto=sctp&count=1&timeout=1s&addr="+tcp, 400, nil)
	call(t, "GET", base+"/probe?proto=tcp&count=0&timeout=1s&addr="+tcp, 400, nil)
	call(t, "POST", base+"/loop?addr="+tcp+"&interval=20ms&timeout=0s&max-duration=1m", 400, nil)
}

func jsonInt(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}
