package chaos

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// restoredLog is what the agent logs when it pinned again what was
// removed.
const restoredLog = "pins removed behind the agent's back were restored"

// testPinsRemoved removes the agent's pins (its maps/ and links/
// directories, as `rm -rf` would) while it runs. The agent must notice,
// pin everything again and say so (a log line, a metric); a new agent
// started then adopts the restored pins, keeping the maps' state. This is
// the scenario allowed to cost connections, and it reports what it costs
// in two cases: the agent repairs the pins (pins), and the agent is
// killed before it could (pins-killed): its programs, no longer pinned,
// detach with it, and the next agent starts from empty maps.
func testPinsRemoved(t *testing.T, e *env, s settings) {
	ctx := t.Context()
	vip := netip.MustParseAddr("10.96.217.1")
	if err := e.createService(ctx, "pinned", vip, e.pod(0), e.pod(1)); err != nil {
		t.Fatal(err)
	}
	agent := e.startAgent(t)
	if err := e.waitServes(ctx, vip, ""); err != nil {
		t.Fatal(err)
	}
	// Pins are removed once the agent is settled: a pin made and removed
	// within one sync is not guarded (PinGuard).
	waitAttached(t, agent)
	before := pinsOf(t, agent.BPFFS)
	ld := e.startLoad(t, vip, 10*time.Minute)

	removed := time.Now()
	removePins(t, agent.BPFFS)
	if err := testbed.Poll(ctx, "the agent restores its pins", waitBound, func() (bool, error) {
		return strings.Contains(agent.Log(), restoredLog), nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, agent.LogTail(20))
	}
	detected := time.Since(removed)
	if after := pinsOf(t, agent.BPFFS); !slices.Equal(after, before) {
		t.Errorf("pins after the repair:\n%v\nwant those before:\n%v", after, before)
	}
	fams, err := agent.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := testbed.Gauge(fams, "ebpfproxy_bpf_pins_restored_total", nil); int(n) != len(before) {
		t.Errorf("ebpfproxy_bpf_pins_restored_total is %v; want %d", n, len(before))
	}
	// A new agent adopts the restored pins: the maps' state is restored
	// (no empty start), and it serves a change made then.
	if err := kill(agent); err != nil {
		t.Fatal(err)
	}
	agent = e.startAgent(t)
	if n := restoredFrontends(agent.Log()); n == 0 {
		t.Errorf("the agent started after the repair did not adopt the pinned maps:\n%s", agent.LogTail(20))
	}
	if err := e.setEndpoints(ctx, "pinned", []*sandbox.Pod{e.pod(1), e.pod(2)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.waitServes(ctx, vip, fmt.Sprintf("%s:%d", e.pod(2).Name, podTCP)); err != nil {
		t.Error(err)
	}
	r := ld.stop(t)
	e.report(t, r, true, fmt.Sprintf("pins=%d restored_after=%s", len(before), detected.Round(time.Millisecond)))

	// The cost when the agent dies before it repairs them.
	e.name = "pins-killed"
	ld = e.startLoad(t, vip, 10*time.Minute)
	time.Sleep(time.Second)
	removePins(t, agent.BPFFS)
	if err := kill(agent); err != nil {
		t.Fatal(err)
	}
	restart := time.Now()
	agent = e.startAgent(t)
	t.Logf("new agent synced %s after the kill", time.Since(restart).Round(time.Millisecond))
	if n := restoredFrontends(agent.Log()); n != 0 {
		t.Errorf("the agent started without pins restored %d frontends:\n%s", n, agent.LogTail(20))
	}
	if err := e.waitServes(ctx, vip, ""); err != nil {
		t.Error(err)
	}
	time.Sleep(time.Second)
	r = ld.stop(t)
	e.report(t, r, true, fmt.Sprintf("first_sync_after=%s", time.Since(restart).Round(time.Millisecond)))
}

// pinsOf lists the agent's pins, relative to its bpffs directory.
func pinsOf(t *testing.T, bpffs string) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"maps", "links"} {
		entries, err := os.ReadDir(filepath.Join(bpffs, dir))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range entries {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out
}

// removePins removes the agent's maps/ and links/ directories under its
// bpffs directory, which the test made.
func removePins(t *testing.T, bpffs string) {
	t.Helper()
	for _, dir := range []string{"maps", "links"} {
		if err := os.RemoveAll(filepath.Join(bpffs, dir)); err != nil {
			t.Fatal(err)
		}
	}
}

var restoredRE = regexp.MustCompile(`"restoredFrontends":([0-9]+)`)

// restoredFrontends is what the agent's log says it restored from the
// pinned maps at start.
func restoredFrontends(log string) int {
	m := restoredRE.FindStringSubmatch(log)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
