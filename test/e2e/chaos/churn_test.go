package chaos

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// churnServices is how many Services each cycle of the churn makes, moves
// to other pods and deletes.
const churnServices = 40

// churnMaps are the maps whose entries must be back to what they were
// before the churn at the end of every cycle.
var churnMaps = [...]string{"lb4_services_v1", "lb4_backends_v1", "lb4_revnat_v1"}

// The bounds of growth across the churn, from the first cycle's end to the
// later ones'. A cycle ends with the Services the agent started with, so a
// resource held per change made (a descriptor, a goroutine, memory) adds up
// cycle after cycle; the slack is for what comes and goes (the scrapes'
// connections, the garbage collector's timing).
const (
	fdSlack        = 8
	goroutineSlack = 20
	rssGrowth      = 1.25
	rssSlack       = 16 << 20
)

// sample is the agent's resources at the end of one cycle.
type sample struct {
	testbed.Usage
	goroutines int
}

// testChurn makes churnServices Services, moves their endpoints and
// deletes them, cycle after cycle for s.churn, while clients use a steady
// Service: no connection may fail, the maps must be back to their entries
// at every cycle's end, and the agent's memory, descriptors and goroutines
// must stay bounded. The summary line gives the figures a DaemonSet's
// requests and limits follow from (deploy/daemonset.yaml).
func testChurn(t *testing.T, e *env, s settings) {
	ctx := t.Context()
	vip := netip.MustParseAddr("10.96.215.1")
	if err := e.createService(ctx, "steady", vip, e.pod(0), e.pod(1)); err != nil {
		t.Fatal(err)
	}
	agent := e.startAgent(t)
	if err := e.waitServes(ctx, vip, ""); err != nil {
		t.Fatal(err)
	}
	// The IPv4 Service answers once the IPv4 family has synced; the IPv6
	// family's first sync may still be opening its programs and maps, and
	// the descriptors counted from the first cycle must not include them.
	if err := testbed.Poll(ctx, "every family's first sync", waitBound, func() (bool, error) {
		fams, err := agent.Metrics(ctx)
		if err != nil {
			return false, err
		}
		for _, f := range []string{"IPv4", "IPv6"} {
			if n, _, ok := testbed.Histogram(fams, "kubeproxy_sync_proxy_rules_duration_seconds", map[string]string{"ip_family": f}); !ok || n == 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	// Nor the TC programs', which may attach at a later sync.
	waitAttached(t, agent)
	base, err := mapEntries(ctx, agent)
	if err != nil {
		t.Fatal(err)
	}
	ld := e.startLoad(t, vip, s.churn+3*time.Minute)
	// The CPU the churn costs is counted from here.
	before, err := usageOf(ctx, agent)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var samples []sample
	changes := 0
	for cycle := 0; cycle == 0 || time.Since(start) < s.churn; cycle++ {
		n, err := e.churnCycle(ctx, cycle)
		changes += n
		if err != nil {
			t.Fatal(err)
		}
		if err := testbed.Poll(ctx, "the maps back to their entries before the churn", waitBound, func() (bool, error) {
			now, err := mapEntries(ctx, agent)
			return err == nil && now == base, err
		}); err != nil {
			now, _ := mapEntries(ctx, agent)
			t.Fatalf("cycle %d: %v: entries %v, want %v", cycle, err, now, base)
		}
		u, err := usageOf(ctx, agent)
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, u)
	}
	took := time.Since(start)
	last := samples[len(samples)-1]
	r := ld.stop(t)

	first := samples[0]
	var maxRSS uint64
	var maxG int
	mostFDs := first
	for _, u := range samples {
		maxRSS, maxG = max(maxRSS, u.RSS), max(maxG, u.goroutines)
		if u.FDs > mostFDs.FDs {
			mostFDs = u
		}
	}
	maxFDs := mostFDs.FDs
	if maxFDs > first.FDs+fdSlack {
		t.Errorf("open descriptors grew from %d at the first cycle's end to %d (at most %d more): %s",
			first.FDs, maxFDs, fdSlack, strings.Join(testbed.FDGrowth(first.Usage, mostFDs.Usage), ", "))
	}
	if maxG > first.goroutines+goroutineSlack {
		t.Errorf("goroutines grew from %d at the first cycle's end to %d (at most %d more)", first.goroutines, maxG, goroutineSlack)
	}
	// The resident set of the last third of the cycles against the first
	// third's: a leak grows it with every cycle.
	third := max(1, len(samples)/3)
	early, late := peakRSS(samples[:third]), peakRSS(samples[len(samples)-third:])
	if bound := max(uint64(float64(early)*rssGrowth), early+rssSlack); late > bound {
		t.Errorf("resident set grew from %s MiB (the first third of the cycles) to %s MiB (the last third), over %s MiB",
			testbed.MiB(early), testbed.MiB(late), testbed.MiB(bound))
	}
	cpu := (last.CPU - before.CPU).Seconds() / took.Seconds() * 1000
	e.report(t, r, false, fmt.Sprintf("cycles=%d changes=%d services=%d rss_mib=%s/%s/%s peak_rss_mib=%s fds=%d/%d/%d goroutines=%d/%d/%d cpu_millicores=%.0f maps=%d maps_mib=%s",
		len(samples), changes, churnServices,
		testbed.MiB(first.RSS), testbed.MiB(maxRSS), testbed.MiB(last.RSS), testbed.MiB(last.PeakRSS),
		first.FDs, maxFDs, last.FDs, first.goroutines, maxG, last.goroutines, cpu, last.Maps, testbed.MiB(last.MapBytes)))
}

// churnCycle makes churnServices Services on pods chosen by cycle, moves
// each to other pods and deletes them, and returns the changes made.
func (e *env) churnCycle(ctx context.Context, cycle int) (int, error) {
	name := func(i int) string { return fmt.Sprintf("churn-%d-%d", cycle, i) }
	n := 0
	for i := range churnServices {
		if err := e.createService(ctx, name(i), netip.Addr{}, e.pod(cycle+i), e.pod(cycle+i+1)); err != nil {
			return n, err
		}
		n++
	}
	for i := range churnServices {
		if err := e.setEndpoints(ctx, name(i), []*sandbox.Pod{e.pod(cycle + i + 2), e.pod(cycle + i + 3)}, []*sandbox.Pod{e.pod(cycle + i)}); err != nil {
			return n, err
		}
		n++
	}
	for i := range churnServices {
		if err := e.deleteService(ctx, name(i)); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// peakRSS is the largest resident set of samples.
func peakRSS(samples []sample) uint64 {
	var m uint64
	for _, u := range samples {
		m = max(m, u.RSS)
	}
	return m
}

// mapEntries returns the entries of churnMaps, in their order.
func mapEntries(ctx context.Context, agent *testbed.Proxy) ([len(churnMaps)]float64, error) {
	var out [len(churnMaps)]float64
	fams, err := agent.Metrics(ctx)
	if err != nil {
		return out, err
	}
	for i, m := range churnMaps {
		v, ok := testbed.Gauge(fams, "ebpfproxy_bpf_map_entries", map[string]string{"map": m})
		if !ok {
			return out, fmt.Errorf("no ebpfproxy_bpf_map_entries of %s", m)
		}
		out[i] = v
	}
	return out, nil
}

// usageOf reads the agent's resources and its goroutines.
func usageOf(ctx context.Context, agent *testbed.Proxy) (sample, error) {
	u, err := agent.Usage()
	if err != nil {
		return sample{}, err
	}
	fams, err := agent.Metrics(ctx)
	if err != nil {
		return sample{}, err
	}
	g, ok := testbed.Gauge(fams, "go_goroutines", nil)
	if !ok {
		return sample{}, fmt.Errorf("no go_goroutines among the agent's metrics")
	}
	return sample{Usage: u, goroutines: int(g)}, nil
}
