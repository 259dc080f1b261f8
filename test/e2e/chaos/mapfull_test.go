package chaos

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// The map-full scenario's sizes: a services map of servicesMax entries
// (a master entry and one per endpoint for every frontend); the steady
// Service takes 6, the cluster's kubernetes Service 2, each early and
// over Service 4 (a TCP and a UDP port, one endpoint).
const (
	servicesMax = 64
	earlyCount  = 8
	overCount   = 12
	servicesMap = "lb4_services_v1"
)

// testMapFull runs the agent with a services map far too small and
// creates Services past its capacity: the agent must say so (a log line
// naming the map, its capacity and the flag that sets it,
// ebpfproxy_bpf_map_full_total and ebpfproxy_sync_errors_total, the map's
// entries at its capacity) and every Service programmed before must keep working, the
// clients' one included, while the agent retries for s.fullFor; once
// Services go, the rest fits again.
func testMapFull(t *testing.T, e *env, s settings) {
	ctx := t.Context()
	steady := netip.MustParseAddr("10.96.213.1")
	if err := e.createService(ctx, "steady", steady, e.pod(0), e.pod(1)); err != nil {
		t.Fatal(err)
	}
	agent := e.startAgent(t, fmt.Sprintf("--bpf-map-services-max=%d", servicesMax))
	if err := e.waitServes(ctx, steady, ""); err != nil {
		t.Fatal(err)
	}
	ld := e.startLoad(t, steady, 10*time.Minute)

	ip := func(group, i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(214 + group), byte(1 + i)}) }
	for i := range earlyCount {
		if err := e.createService(ctx, fmt.Sprintf("early-%d", i), ip(0, i), e.pod(2+i%4)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range earlyCount {
		if err := e.waitServes(ctx, ip(0, i), fmt.Sprintf("%s:%d", e.pod(2+i%4).Name, podTCP)); err != nil {
			t.Fatalf("early Service %d, which fits: %v", i, err)
		}
	}
	if err := e.noSyncErrors(ctx, agent); err != nil {
		t.Fatal(err)
	}

	// Past the capacity.
	for i := range overCount {
		if err := e.createService(ctx, fmt.Sprintf("over-%d", i), ip(1, i), e.pod(i%6)); err != nil {
			t.Fatal(err)
		}
	}
	var logLine string
	err := testbed.Poll(ctx, "the agent reports the full map", waitBound, func() (bool, error) {
		for line := range strings.SplitSeq(agent.Log(), "\n") {
			if strings.Contains(line, fmt.Sprintf("%s holds its %d entries: map is full", servicesMap, servicesMax)) &&
				strings.Contains(line, "--bpf-map-services-max") {
				logLine = line
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, agent.LogTail(20))
	}
	t.Logf("log: %s", logLine)
	// The agent retries, writing entry by entry, while the clients run.
	time.Sleep(s.fullFor)
	fams, err := agent.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	syncErrors, _ := testbed.Gauge(fams, "ebpfproxy_sync_errors_total", map[string]string{"dataplane": "ebpf"})
	fullSyncs, _ := testbed.Gauge(fams, "ebpfproxy_bpf_map_full_total", nil)
	entries, _ := testbed.Gauge(fams, "ebpfproxy_bpf_map_entries", map[string]string{"map": servicesMap})
	capacity, _ := testbed.Gauge(fams, "ebpfproxy_bpf_map_capacity", map[string]string{"map": servicesMap})
	t.Logf("metrics: ebpfproxy_sync_errors_total %v, ebpfproxy_bpf_map_full_total %v, %s entries %v of %v", syncErrors, fullSyncs, servicesMap, entries, capacity)
	if syncErrors == 0 || fullSyncs == 0 {
		t.Errorf("ebpfproxy_sync_errors_total %v, ebpfproxy_bpf_map_full_total %v with a full map; want both counted", syncErrors, fullSyncs)
	}
	if capacity != servicesMax || entries > capacity || entries < capacity-4 {
		t.Errorf("%s: %v entries of %v exported; want the map full, of %d", servicesMap, entries, capacity, servicesMax)
	}

	// Everything programmed before still serves; of the rest, what fitted.
	for i := range earlyCount {
		rep, err := e.node.Client.TCP(ctx, netip.AddrPortFrom(ip(0, i), svcTCP), 1)
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Results[0]; r.Err != "" {
			t.Errorf("early Service %d stopped serving once the map was full: %s", i, r.Err)
		}
	}
	var fitted int
	for i := range overCount {
		rep, err := e.node.Client.WithTimeout(time.Second).TCP(ctx, netip.AddrPortFrom(ip(1, i), svcTCP), 1)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Results[0].Err == "" {
			fitted++
		}
	}
	if fitted == overCount {
		t.Errorf("all %d Services past the capacity serve: the map was not full", overCount)
	}

	// Room again: the Services that did not fit go, one that fits comes.
	for i := range overCount {
		if err := e.deleteService(ctx, fmt.Sprintf("over-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	after := ip(2, 0)
	if err := e.createService(ctx, "after", after, e.pod(5)); err != nil {
		t.Fatal(err)
	}
	if err := e.waitServes(ctx, after, fmt.Sprintf("%s:%d", e.pod(5).Name, podTCP)); err != nil {
		t.Errorf("a Service that fits once the others went: %v\n%s", err, agent.LogTail(20))
	}
	r := ld.stop(t)
	e.report(t, r, false, fmt.Sprintf("capacity=%d over_fitted=%d/%d full_for=%s map_full_syncs=%v", servicesMax, fitted, overCount, s.fullFor, fullSyncs))
}

// noSyncErrors fails if the agent counted a failed sync.
func (e *env) noSyncErrors(ctx context.Context, agent *testbed.Proxy) error {
	fams, err := agent.Metrics(ctx)
	if err != nil {
		return err
	}
	if n, _ := testbed.Gauge(fams, "ebpfproxy_sync_errors_total", nil); n != 0 {
		return fmt.Errorf("%v failed syncs before the map is full:\n%s", n, agent.LogTail(20))
	}
	return nil
}
