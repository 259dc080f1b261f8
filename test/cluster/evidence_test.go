package cluster_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
// source port is port: the tracked fate of a failed attempt made at at,
// while its entry lives (120 s for SYN_SENT and TIME_WAIT by default). An
// entry made before the attempt (the node records when: see node.Start)
// is another connection's that the attempt met on the same port.
func conntrackOfPort(port int, at time.Time) string {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		return "conntrack: " + err.Error()
	}
	var out []string
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_TCP && int(f.Forward.SrcPort) == port {
			s := f.String()
			if made := time.Unix(0, int64(f.TimeStart)); f.TimeStart != 0 && made.Before(at.Add(-time.Second)) {
				s += fmt.Sprintf(" (made %.1f s before the attempt: an earlier connection's entry, met on the same port)",
					at.Sub(made).Seconds())
			}
			out = append(out, s)
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
			s = conntrackOfPort(a.Socket.LocalPort, a.At)
		}
		v.Attempts = append(v.Attempts, s)
	}
	return v
}

// saveAgentLog writes the agent's log so far to the log directory as
// agent-<step>.log (the kubelet removes a replaced pod's log), and logs its
// lines from 10 s before r's first failure to 15 s after its last.
func (e *env) saveAgentLog(step string, r loopResult) {
	out, err := e.podLog("k8s-app=ebpf-proxy", "agent-"+step+".log")
	if err != nil {
		e.t.Logf("agent log after the %s: %v", step, err)
		return
	}
	e.logWindow("agent log", step, r, out)
}

// saveKubeProxyLog writes upstream kube-proxy's log so far (its syncs, at
// -v=2) to the log directory before its DaemonSet goes, and returns it.
func (e *env) saveKubeProxyLog() string {
	out, err := e.podLog("k8s-app=kube-proxy", "kube-proxy.log")
	if err != nil {
		e.t.Logf("kube-proxy log: %v", err)
	}
	return out
}

// podLog returns the timestamped log of the kube-system pods that selector
// selects and writes it to the log directory as name.
func (e *env) podLog(selector, name string) (string, error) {
	out, err := e.n.Kubectl(e.ctx, "", "-n", "kube-system", "logs", "-l", selector,
		"--tail=-1", "--timestamps", "--prefix")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(os.Getenv(envLogs), name), []byte(out), 0o644); err != nil {
		e.t.Logf("%s: %v", name, err)
	}
	return out, nil
}

// logWindow logs the lines of a timestamped log (kubectl logs --timestamps
// --prefix, or the ruleset monitor's) from 10 s before r's first failure to
// 15 s after its last, at most maxWindowLines of them.
func (e *env) logWindow(what, step string, r loopResult, log string) {
	if r.FirstFailure == nil || r.LastFailure == nil {
		return
	}
	from, to := r.FirstFailure.Add(-10*time.Second), r.LastFailure.Add(15*time.Second)
	var lines []string
	for l := range strings.SplitSeq(log, "\n") {
		// "[pod/NAME/CONTAINER] 2026-11-28T08:55:40.888608430Z ..." or
		// "2026-11-28T08:55:40.888608430Z ...".
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], "[") {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, f[0])
		if err == nil && !ts.Before(from) && !ts.After(to) {
			lines = append(lines, l)
		}
	}
	if n := len(lines); n > maxWindowLines {
		lines = append(lines[:maxWindowLines], fmt.Sprintf("(and %d more lines)", n-maxWindowLines))
	}
	e.t.Logf("%s around the %s's failures (%s to %s):\n%s", what, step,
		from.Format("15:04:05.0"), to.Format("15:04:05.0"), strings.Join(lines, "\n"))
}

// maxWindowLines bounds the lines logWindow logs.
const maxWindowLines = 120

// rulesetMonitor records every change of the node's nftables ruleset (where
// upstream kube-proxy's iptables-nft rules, the CNI plugin's and the
// kubelet's live), each line with the time it was read, so that a
// connection that met no Service rule can be set against what changed the
// rules then.
type rulesetMonitor struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  strings.Builder
	done chan struct{}
}

// startRulesetMonitor runs `nft monitor` until stop, writing its lines to
// the log directory as nft-monitor.log too.
func startRulesetMonitor(logDir string) (*rulesetMonitor, error) {
	// nft buffers its output to a pipe: line-buffered, each line is read
	// (and timed) as the change is made.
	m := &rulesetMonitor{cmd: exec.Command("stdbuf", "-oL", "nft", "monitor"), done: make(chan struct{})}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(logDir, "nft-monitor.log"))
	if err != nil {
		return nil, err
	}
	if err := m.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("nft monitor: %w", err)
	}
	go func() {
		defer close(m.done)
		defer f.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := time.Now().UTC().Format(time.RFC3339Nano) + " " + sc.Text() + "\n"
			m.mu.Lock()
			m.log.WriteString(l)
			m.mu.Unlock()
			_, _ = f.WriteString(l)
		}
	}()
	return m, nil
}

// String returns what the monitor has recorded so far.
func (m *rulesetMonitor) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.log.String()
}

// stop ends the monitor and waits for its last lines.
func (m *rulesetMonitor) stop() {
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	<-m.done
}
