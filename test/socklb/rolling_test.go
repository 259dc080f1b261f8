package socklb_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestRollingReplacementUnderLoad replaces every backend of a Service one
// by one, as a Deployment rollout does: the new pod becomes ready, the old
// one turns terminating (still serving), is removed from the EndpointSlice,
// and only then stops. A client connecting in a loop throughout must see no
// failed connection, and the Service then reaches every new pod. (Which
// pods the loop's connections reached during the rollout is chance: in an
// emulated guest the loop made 60 connections in its 2.7 s, and the last
// pod had 300 ms of them, shared with two others.)
func TestRollingReplacementUnderLoad(t *testing.T) {
	e := newSandbox(t, 0)
	e.attach()
	servers := map[string]*sandbox.Server{}
	addPod := func(i int) *sandbox.Pod {
		p, err := e.sb.AddPod(e.node, fmt.Sprintf("pod-%d", i), netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := p.StartTCPServer(tcpPort)
		if err != nil {
			t.Fatal(err)
		}
		servers[p.Name] = srv
		e.pods = append(e.pods, p)
		return p
	}
	for i := range 3 {
		addPod(i)
	}
	e.addWeb(e.podEPs(0, 1, 2)...)
	state := map[int]epState{0: ready, 1: ready, 2: ready}
	publish := func() {
		var eps []ep
		for i, p := range e.pods {
			if s, ok := state[i]; ok {
				eps = append(eps, ep{ip: p.IP, state: s})
			}
		}
		e.setSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, eps...))
		e.sync()
	}

	loop, err := e.client.StartLoop(e.ctx(), webVIP, sandbox.LoopOptions{Interval: 2 * time.Millisecond, MaxDuration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for old := range 3 {
		addPod(old + 3)
		state[old+3] = ready
		publish()
		time.Sleep(100 * time.Millisecond)
		state[old] = terminating
		publish()
		time.Sleep(100 * time.Millisecond)
		delete(state, old)
		publish()
		// The pod goes away only after the proxy has stopped sending to it.
		if err := servers[e.pods[old].Name].Close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	loop.StopUnbroken(t, "during the rollout")
	for _, name := range []string{"pod-3", "pod-4", "pod-5"} {
		if err := e.client.AwaitServer(e.ctx(), webVIP, sandbox.WaitOptions{Server: name, Timeout: time.Second,
			Interval: 10 * time.Millisecond, MaxDuration: 30 * time.Second}); err != nil {
			t.Errorf("new pod %s is not reached through the Service after the rollout: %v", name, err)
		}
	}
}
