package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// churnEvery is how often the kill scenario changes the endpoints, so that
// kills also land in the middle of syncs.
const churnEvery = time.Second

// testKill SIGKILLs the agent at random moments (s.kills times in about
// s.killSpan), starting a new one at once after each kill, while the
// Service's endpoints change every second among pods that all keep
// serving: kills land during start-up, restore and syncs. No connection
// may fail, and the last agent serves a change made after the kills.
func testKill(t *testing.T, e *env, s settings) {
	ctx := t.Context()
	vip := netip.MustParseAddr("10.96.210.1")
	if err := e.createService(ctx, "kill", vip, e.pod(0), e.pod(1)); err != nil {
		t.Fatal(err)
	}
	agent := e.startAgent(t)
	if err := e.waitServes(ctx, vip, ""); err != nil {
		t.Fatal(err)
	}
	ld := e.startLoad(t, vip, s.killSpan+5*time.Minute)

	// The ready endpoints alternate between {p0, p1} and {p1, p2}, the
	// third pod terminating (still serving): every pod serves throughout,
	// so no answer may be missing whichever the maps hold, and no backend
	// leaves them. (A ready endpoint removed at once has its sockets
	// ended, which would abort a UDP exchange in flight: a failure of the
	// churn, not of the kills; the rolling scenario removes endpoints.)
	sets := [][]*sandbox.Pod{{e.pod(0), e.pod(1)}, {e.pod(1), e.pod(2)}}
	resting := []*sandbox.Pod{e.pod(2), e.pod(0)}
	churnCtx, stopChurn := context.WithCancel(ctx)
	churned := make(chan error, 1)
	go func() {
		tick := time.NewTicker(churnEvery)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-churnCtx.Done():
				churned <- nil
				return
			case <-tick.C:
			}
			if err := e.setEndpoints(churnCtx, "kill", sets[i%2], resting[i%2:i%2+1]); err != nil && churnCtx.Err() == nil {
				churned <- err
				return
			}
		}
	}()

	// The kill moments, counted from the start of the agent they kill:
	// every other one within its first second (start-up, restore of the
	// pinned maps, first sync), the others anywhere in twice the interval
	// that makes the kills fill the span on average.
	startup := time.Second
	early, others := s.kills/2, s.kills-s.kills/2
	interval := (s.killSpan - time.Duration(early)*startup/2) / time.Duration(others)
	var killedBeforeSync int
	start := time.Now()
	for i := range s.kills {
		var after time.Duration
		if i%2 == 1 {
			after = rand.N(startup)
		} else {
			after = rand.N(2 * interval)
		}
		time.Sleep(time.Until(agent.Started().Add(after)))
		synced, _ := agent.LastSync(ctx)
		if synced.IsZero() {
			killedBeforeSync++
		}
		if err := kill(agent); err != nil {
			t.Fatalf("kill %d: %v", i+1, err)
		}
		final := i == s.kills-1
		// The next agent starts at once; the last one is waited for.
		agent = e.tb.StartProxy(t, e.node, testbed.ProxyOptions{Kind: testbed.EbpfProxy, NoWait: !final})
	}
	span := time.Since(start)
	stopChurn()
	if err := <-churned; err != nil {
		t.Fatal(err)
	}
	// The last agent serves a change made now.
	if err := e.setEndpoints(ctx, "kill", sets[0], resting[0:1]); err != nil {
		t.Fatal(err)
	}
	for _, p := range sets[0] {
		if err := e.waitServes(ctx, vip, p.Name+fmt.Sprintf(":%d", podTCP)); err != nil {
			t.Errorf("after the last kill: %v\n%s", err, agent.LogTail(20))
		}
	}
	r := ld.stop(t)
	e.report(t, r, false, fmt.Sprintf("kills=%d before_first_sync=%d span=%s", s.kills, killedBeforeSync, span.Round(time.Second)))
}

// kill SIGKILLs the agent, by its PID, and waits until it is gone.
func kill(p *testbed.Proxy) error {
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill agent %d: %w", p.PID(), err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Running() {
		if time.Now().After(deadline) {
			return fmt.Errorf("agent %d still runs 10s after SIGKILL", p.PID())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
