package chaos

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// rollEvery is the pace of the rolling replacement.
const rollEvery = time.Second

// testRolling replaces the Service's endpoints in a rolling fashion every
// second, as a Deployment's rolling update with pods that stop soon after
// they leave does: at step s pods s and s-1 are ready, s-2 and s-3 are
// terminating (still serving), s-4 has just left, and s-5, gone from the
// endpoints for a second, stops serving (its connections are refused from
// then on); pod s+1 starts serving, to join at the next step. Eight pods
// take turns. No connection may fail: a removed endpoint must be out of
// the maps before its pod stops, a second later.
//
// A pod stays terminating for two steps, longer than a client's exchange
// may take (the loops' 2 s timeout): the agent ends the connected UDP
// sockets of a backend that leaves (the socket LB's answer to kube-proxy's
// conntrack cleanup), and an exchange begun while that backend was ready
// must be over by then. With one step, an exchange whose reply the loaded
// machine delayed past a second was ended that way (ECONNABORTED).
func testRolling(t *testing.T, e *env, s settings) {
	ctx := t.Context()
	vip := netip.MustParseAddr("10.96.212.1")
	if err := e.createService(ctx, "rolling", vip, e.pod(1), e.pod(0)); err != nil {
		t.Fatal(err)
	}
	e.startAgent(t)
	if err := e.waitServes(ctx, vip, ""); err != nil {
		t.Fatal(err)
	}
	serving := map[*sandbox.Pod]bool{}
	for _, p := range e.node.Pods {
		serving[p] = true
	}
	ld := e.startLoad(t, vip, s.rolling+5*time.Minute)

	steps := int(s.rolling / rollEvery)
	start := time.Now()
	var slow int
	for step := 2; step < steps+2; step++ {
		time.Sleep(time.Until(start.Add(time.Duration(step-1) * rollEvery)))
		terminating := []*sandbox.Pod{e.pod(step - 2)}
		if step >= 3 {
			terminating = append(terminating, e.pod(step-3))
		}
		if err := e.setEndpoints(ctx, "rolling", []*sandbox.Pod{e.pod(step), e.pod(step - 1)}, terminating); err != nil {
			t.Fatal(err)
		}
		if stop := e.pod(step + len(e.node.Pods) - 5); serving[stop] {
			if err := e.tb.StopServing(stop); err != nil {
				t.Fatal(err)
			}
			serving[stop] = false
		}
		if next := e.pod(step + 1); !serving[next] {
			if err := e.tb.StartServing(next); err != nil {
				t.Fatal(err)
			}
			serving[next] = true
		}
		if time.Since(start.Add(time.Duration(step-1)*rollEvery)) > rollEvery/2 {
			slow++
		}
	}
	r := ld.stop(t)
	for _, p := range e.node.Pods {
		if r.tcp.Servers[fmt.Sprintf("%s:%d", p.Name, podTCP)] == 0 {
			t.Errorf("pod %s never answered over TCP: %v", p.Name, r.tcp.Servers)
		}
	}
	if slow > 0 {
		t.Logf("%d of %d steps took more than half a step to write", slow, steps)
	}
	e.report(t, r, false, fmt.Sprintf("steps=%d every=%s", steps, rollEvery))
}
