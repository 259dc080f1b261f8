package cluster_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// What the node itself says about a connection loop's failed attempts, so
// that a failure in CI tells a handover gap (a SYN the node dropped, a
// conntrack entry in the way) from an emulated guest that did not run for
// seconds (which each attempt reports itself: its StalledMS). The test
// binary runs in the guest's own network namespace, the
// node's, where the pods' traffic is bridged and tracked.

// conntrackStats sums the node's conntrack statistics over its CPUs
// (/proc/net/stat/nf_conntrack: a header, then a line of hex per CPU).
func conntrackStats() (map[string]uint64, error) {
	f, err := os.Open("/proc/net/stat/nf_conntrack")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return nil, fmt.Errorf("/proc/net/stat/nf_conntrack: no header")
	}
	names := strings.Fields(sc.Text())
	sums := make(map[string]uint64, len(names))
	for sc.Scan() {
		for i, v := range strings.Fields(sc.Text()) {
			n, err := strconv.ParseUint(v, 16, 64)
			if err != nil || i >= len(names) {
				return nil, fmt.Errorf("/proc/net/stat/nf_conntrack: line %q", sc.Text())
			}
			sums[names[i]] += n
		}
	}
	return sums, sc.Err()
}

// conntrackDrops are the statistics that count packets conntrack dropped
// or could not track.
var conntrackDrops = []string{"invalid", "insert_failed", "drop", "early_drop", "error"}

// conntrackDelta describes how the drop counters grew from before to after;
// "" when none did.
func conntrackDelta(before, after map[string]uint64) string {
	var parts []string
	for _, k := range conntrackDrops {
		if d := after[k] - before[k]; after[k] > before[k] {
			parts = append(parts, fmt.Sprintf("%s +%d", k, d))
		}
	}
	return strings.Join(parts, ", ")
}

// conntrackOfPort lists the node's TCP conntrack entries whose original
// source port is port: the tracked fate of a failed attempt, while its
// entry lives (120 s for SYN_SENT and TIME_WAIT by default).
func conntrackOfPort(port int) string {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		return "conntrack: " + err.Error()
	}
	var out []string
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_TCP && int(f.Forward.SrcPort) == port {
			out = append(out, f.String())
		}
	}
	if len(out) == 0 {
		return fmt.Sprintf("no conntrack entry of port %d", port)
	}
	return strings.Join(out, " | ")
}

// loopEvidence is what the node said during a connection loop.
type loopEvidence struct {
	// Conntrack is how conntrack's drop counters grew during the loop.
	Conntrack string
	// Attempts says, for each failed attempt kept with its socket, the
	// attempt's conntrack entries.
	Attempts []string
}

// gather collects the evidence of r's failed attempts.
func gather(r loopResult, ctBefore map[string]uint64) loopEvidence {
	var v loopEvidence
	if ctAfter, err := conntrackStats(); err == nil && ctBefore != nil {
		v.Conntrack = conntrackDelta(ctBefore, ctAfter)
	} else if err != nil {
		v.Conntrack = err.Error()
	}
	for _, a := range r.FailedAttempts {
		s := "no socket described"
		if a.Socket != nil {
			s = conntrackOfPort(a.Socket.LocalPort)
		}
		v.Attempts = append(v.Attempts, s)
	}
	return v
}

// saveAgentLog writes the agent's log so far to the log directory as
// agent-<step>.log (the kubelet removes a replaced pod's log), and logs its
// lines from 10 s before r's first failure to 15 s after its last.
func (e *env) saveAgentLog(step string, r loopResult) {
	out, err := e.n.Kubectl(e.ctx, "", "-n", "kube-system", "logs", "-l", "k8s-app=ebpf-proxy",
		"--tail=-1", "--timestamps", "--prefix")
	if err != nil {
		e.t.Logf("agent log after the %s: %v", step, err)
		return
	}
	if err := os.WriteFile(filepath.Join(os.Getenv(envLogs), "agent-"+step+".log"), []byte(out), 0o644); err != nil {
		e.t.Logf("agent log after the %s: %v", step, err)
	}
	if r.FirstFailure == nil || r.LastFailure == nil {
		return
	}
	from, to := r.FirstFailure.Add(-10*time.Second), r.LastFailure.Add(15*time.Second)
	var lines []string
	for l := range strings.SplitSeq(out, "\n") {
		// "[pod/NAME/CONTAINER] 2026-11-28T08:55:40.888608430Z ..."
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, f[1])
		if err == nil && !ts.Before(from) && !ts.After(to) {
			lines = append(lines, l)
		}
	}
	e.t.Logf("agent log around the %s's failures (%s to %s):\n%s", step,
		from.Format("15:04:05.0"), to.Format("15:04:05.0"), strings.Join(lines, "\n"))
}
