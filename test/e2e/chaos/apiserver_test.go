package chaos

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// testAPIServerGone takes the API server away from the agent for
// s.apiDown: the node is cut off it first, the changes are made (the
// clients' Service moves from {p0, p1} to {p1, p2}, a new Service appears,
// another goes), then the API server itself is stopped for the rest of the
// time. The data path keeps serving what it had, the agent stays up, and
// every change is in the maps soon after the API server's return (within
// propagation).
func testAPIServerGone(t *testing.T, e *env, s settings) {
	ctx := t.Context()
	steady := netip.MustParseAddr("10.96.211.1")
	late := netip.MustParseAddr("10.96.211.2")
	gone := netip.MustParseAddr("10.96.211.3")
	if err := e.createService(ctx, "steady", steady, e.pod(0), e.pod(1)); err != nil {
		t.Fatal(err)
	}
	if err := e.createService(ctx, "gone", gone, e.pod(3)); err != nil {
		t.Fatal(err)
	}
	agent := e.startAgent(t)
	pid := agent.PID()
	for _, w := range []struct {
		ip     netip.Addr
		server string
	}{{steady, ""}, {gone, "p3:8080"}} {
		if err := e.waitServes(ctx, w.ip, w.server); err != nil {
			t.Fatal(err)
		}
	}
	ld := e.startLoad(t, steady, s.apiDown+5*time.Minute)

	// The next scenarios need the API server, also if this one fails
	// while it is away.
	t.Cleanup(func() {
		if e.c.APIServerPID() == 0 {
			if err := e.c.StartAPIServer(context.Background()); err != nil {
				t.Errorf("start the API server again: %v", err)
			}
		}
	})
	down := time.Now()
	e.node.API.Pause()
	if err := e.setEndpoints(ctx, "steady", []*sandbox.Pod{e.pod(1), e.pod(2)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.createService(ctx, "late", late, e.pod(4)); err != nil {
		t.Fatal(err)
	}
	if err := e.deleteService(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	e.c.StopAPIServer()
	t.Logf("API server gone from the node; changes made in %s", time.Since(down).Round(time.Millisecond))

	// Watches for the changes, started while the API server is away.
	waitFor := func(ip netip.Addr, server string) *sandbox.Wait {
		w, err := e.node.Client.StartWait(ctx, netip.AddrPortFrom(ip, svcTCP), sandbox.WaitOptions{Server: server,
			Timeout: sandbox.ProgrammingAttemptTimeout, Interval: 5 * time.Millisecond, MaxDuration: s.apiDown + 3*time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = w.Stop() })
		return w
	}
	wLate := waitFor(late, "p4:8080")
	wMoved := waitFor(steady, "p2:8080")

	time.Sleep(time.Until(down.Add(s.apiDown)))
	if err := agent.ExitError(); err != nil || agent.PID() != pid {
		t.Fatalf("the agent did not live through the API server's absence: %v\n%s", err, agent.LogTail(20))
	}
	// What the data path had is still there: the old endpoints serve the
	// loops (counted at the end), the deleted Service still answers, and
	// no change leaked in.
	if err := e.waitServes(ctx, gone, "p3:8080"); err != nil {
		t.Errorf("the deleted Service stopped serving while the agent could not know: %v", err)
	}

	goneAt := watchRefused(ctx, e.node.Client, gone, waitBound+time.Minute)
	if err := e.c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("API server back after %s, at %s", back.Sub(down).Round(time.Millisecond), back.UTC().Format(time.RFC3339Nano))

	var lags []string
	for _, w := range []struct {
		what string
		w    *sandbox.Wait
	}{{"new Service", wLate}, {"moved endpoints", wMoved}} {
		res, err := w.w.Result(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Answered {
			t.Errorf("%s: never answered: %v", w.what, res.Errors)
			continue
		}
		lag := res.AnsweredAt.Sub(back)
		lags = append(lags, lag.Round(time.Millisecond).String())
		t.Logf("%s served %s after the API server's return", w.what, lag.Round(time.Millisecond))
		if lag > propagation {
			t.Errorf("%s served %s after the API server's return; want within %s", w.what, lag.Round(time.Millisecond), propagation)
		}
	}
	if at := <-goneAt; at.IsZero() {
		t.Errorf("the Service deleted while the API server was away still answers")
	} else {
		lag := at.Sub(back)
		lags = append(lags, lag.Round(time.Millisecond).String())
		if lag > propagation {
			t.Errorf("the deleted Service went %s after the API server's return; want within %s", lag.Round(time.Millisecond), propagation)
		}
	}
	// A second for the loops on the new endpoints.
	time.Sleep(time.Second)
	r := ld.stop(t)
	if r.tcp.Servers["p2:8080"] == 0 {
		t.Errorf("the loop never reached the endpoint added while the API server was away: %v", r.tcp.Servers)
	}
	e.report(t, r, false, fmt.Sprintf("down=%s lag_new=%s lag_moved=%s lag_deleted=%s", s.apiDown, at(lags, 0), at(lags, 1), at(lags, 2)))
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "none"
}

// watchRefused connects to ip again and again from c, in the background,
// until a connection fails, and sends when that failed attempt started;
// zero if none failed within bound. The start, not the end: an address no
// longer translated does not answer, so the failing attempt ends only at
// its timeout.
func watchRefused(ctx context.Context, c *sandbox.Client, ip netip.Addr, bound time.Duration) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		deadline := time.Now().Add(bound)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			start := time.Now()
			rep, err := c.WithTimeout(time.Second).TCP(ctx, netip.AddrPortFrom(ip, svcTCP), 1)
			if err == nil && rep.Results[0].Err != "" {
				out <- start
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		out <- time.Time{}
	}()
	return out
}
