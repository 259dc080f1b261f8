package cluster_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// attempt is one connection or datagram of the test server's probe
// command, run in the client pod.
type attempt struct {
	Server    string
	Peer      string
	Error     string
	Detail    string
	ElapsedMS float64 `json:"elapsed_ms"`
	// StalledMS is the part of ElapsedMS in which the client did not run;
	// an attempt's timeout counts the time it ran.
	StalledMS float64 `json:"stalled_ms"`
	// Socket is what the client's kernel said of a failed TCP attempt.
	Socket *socketInfo
}

// socketInfo is the test server's SocketInfo.
type socketInfo struct {
	LocalPort      int `json:"local_port"`
	State          string
	Retransmits    int
	TotalRetrans   int `json:"total_retrans"`
	LastDataRecvMS int `json:"last_data_recv_ms"`
}

func (a attempt) String() string {
	if a.Error == "" {
		return fmt.Sprintf("%s from %s in %.1f ms", a.Server, a.Peer, a.ElapsedMS)
	}
	s := fmt.Sprintf("%s after %.0f ms, %.0f of them stalled (%s)", a.Error, a.ElapsedMS, a.StalledMS, a.Detail)
	if k := a.Socket; k != nil {
		s += fmt.Sprintf(" [local port %d, %s, %d retransmitted, %d in all, last data %d ms before]",
			k.LocalPort, k.State, k.Retransmits, k.TotalRetrans, k.LastDataRecvMS)
	}
	return s
}

// probeTimeout is the time allowed to each attempt of a probe. As for the
// connection loops (startLoop), a slow answer is not a lost connection:
// the emulated guest's one CPU is shared with whatever the node does at
// that moment (a container torn down, an agent starting), and a SYN lost
// meanwhile is sent again after 1 s and 3 s, as any client's would be.
const probeTimeout = 5 * time.Second

// probe runs count attempts of proto from the first node's client pod to
// addr.
func (e *env) probe(proto string, count int, addr netip.AddrPort) ([]attempt, error) {
	return e.probeFrom(clientPod(e.nodes[0].Name), proto, count, addr)
}

// clientPod is the name of the client pod on a node (testdata/workloads.yaml).
func clientPod(node string) string { return "client-" + node }

// probeFrom runs count attempts of proto from a client pod to addr, or from
// outside the cluster (the control plane's namespace) when pod is
// outsideName.
func (e *env) probeFrom(pod, proto string, count int, addr netip.AddrPort) ([]attempt, error) {
	var out string
	var err error
	if pod == outsideName {
		out, err = e.outside.probe(e.ctx, proto, count, probeTimeout, addr)
	} else {
		out, err = e.n.Kubectl(e.ctx, "", "exec", pod, "--", "/testserver", "probe",
			"--proto", proto, "--count", strconv.Itoa(count), "--timeout", probeTimeout.String(), addr.String())
	}
	if err != nil {
		return nil, err
	}
	var rep struct{ Attempts []attempt }
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		return nil, fmt.Errorf("probe output: %w: %s", err, out)
	}
	res := rep.Attempts
	if len(res) != count {
		return nil, fmt.Errorf("probe made %d attempts, want %d", len(res), count)
	}
	return res, nil
}

// failedAttempts describes the failed attempts of res, with their place
// in the sequence, or returns "" if none failed.
func failedAttempts(res []attempt) string {
	var b strings.Builder
	n := 0
	for i, a := range res {
		if a.Error == "" {
			continue
		}
		if n++; n <= 5 {
			fmt.Fprintf(&b, "; #%d: %s", i+1, a)
		}
	}
	if n == 0 {
		return ""
	}
	if n > 5 {
		fmt.Fprintf(&b, "; and %d more", n-5)
	}
	return fmt.Sprintf("%d of %d attempts failed%s", n, len(res), b.String())
}

// loopResult sums up a connection loop.
type loopResult struct {
	Attempts int
	Failures int
	Errors   map[string]int
	Servers  map[string]int
	Started  time.Time
	// Stalled counts the attempts whose client did not run for a while;
	// MaxStalledMS is the longest such time.
	Stalled      int
	MaxStalledMS float64    `json:"max_stalled_ms"`
	FirstFailure *time.Time `json:"first_failure"`
	LastFailure  *time.Time `json:"last_failure"`
	// FailedAttempts are the first failed attempts (the loop keeps ten),
	// each with when it started.
	FailedAttempts []struct {
		At time.Time
		attempt
	} `json:"failed_attempts"`
	// Evidence is what the node said of the failures (gather).
	Evidence loopEvidence `json:"-"`
	// Parts are the loops a step's result sums up, each as "from -> to:
	// its result".
	Parts []string `json:"-"`
}

// add sums r's counts into the step's result s, and r as one of its parts.
func (s *loopResult) add(name string, r loopResult) {
	s.Attempts += r.Attempts
	s.Failures += r.Failures
	s.Stalled += r.Stalled
	s.MaxStalledMS = max(s.MaxStalledMS, r.MaxStalledMS)
	for _, m := range []struct{ to, from map[string]int }{{s.Errors, r.Errors}, {s.Servers, r.Servers}} {
		for k, v := range m.from {
			m.to[k] += v
		}
	}
	s.Parts = append(s.Parts, name+": "+r.String())
}

func (r loopResult) String() string {
	if len(r.Parts) > 0 {
		return fmt.Sprintf("%d connections in %d loops, %d failed %v (%s)", r.Attempts, len(r.Parts), r.Failures, r.Errors, strings.Join(r.Parts, " | "))
	}
	s := fmt.Sprintf("%d connections, %d failed %v, servers %v", r.Attempts, r.Failures, r.Errors, r.Servers)
	if r.Stalled > 0 {
		s += fmt.Sprintf(", %d with the client stalled (at most %.1f s)", r.Stalled, r.MaxStalledMS/1000)
	}
	if r.FirstFailure != nil && r.LastFailure != nil {
		s += fmt.Sprintf(", failures from %.1fs to %.1fs after the loop began (%s to %s)",
			r.FirstFailure.Sub(r.Started).Seconds(), r.LastFailure.Sub(r.Started).Seconds(),
			r.FirstFailure.Format("15:04:05.0"), r.LastFailure.Format("15:04:05.0"))
	}
	for i, a := range r.FailedAttempts {
		s += fmt.Sprintf("; failed #%d at %.1fs: %s", i+1, a.At.Sub(r.Started).Seconds(), a.attempt)
		if i < len(r.Evidence.Attempts) {
			s += "; " + r.Evidence.Attempts[i]
		}
	}
	if n := r.Failures - len(r.FailedAttempts); n > 0 && len(r.FailedAttempts) > 0 {
		s += fmt.Sprintf("; and %d more", n)
	}
	if r.Evidence.Conntrack != "" {
		s += "; node conntrack during the loop: " + r.Evidence.Conntrack
	}
	return s
}

// loop is a connection loop running until stop, in a client pod or
// outside the cluster.
type loop struct {
	e *env
	// name says from where to where.
	name string
	// finish ends the loop and returns its report, and why the
	// report may be incomplete.
	finish func() (report []byte, err error)
	// output is what a failed loop's log shows of its process.
	output func() string
	// conntrack is the node's conntrack statistics at the start.
	conntrack map[string]uint64
}

// startLoop starts connecting from a client pod (or outsideName) to addr
// every 20 ms until stop. A connection fails when it errors or has no
// answer within 5 s of the time the client ran, as a client would give
// up: the emulated guest has one CPU, which a starting agent (program
// verification) holds for a second or more, the host may not run the guest
// for seconds, and a slow answer is not a lost connection. The attempts
// report how long their client did not run.
func (e *env) startLoop(from string, addr netip.AddrPort) *loop {
	e.t.Helper()
	l := &loop{e: e, name: from + " -> " + addr.String()}
	var err error
	if l.conntrack, err = conntrackStats(); err != nil {
		e.t.Logf("conntrack statistics: %v", err)
	}
	if from == outsideName {
		id, err := e.outside.startLoop(e.ctx, addr)
		if err != nil {
			e.fatalf("%s: %v", l.name, err)
		}
		l.finish = func() ([]byte, error) { return e.outside.stopLoop(e.ctx, id) }
		l.output = func() string { return "" }
		return l
	}
	cmd := e.n.KubectlCommand(e.ctx, "exec", "-i", from, "--", "/testserver", "loop",
		"--interval", "20ms", "--timeout", "5s", "--max-duration", "10m", addr.String())
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	stdin, err := cmd.StdinPipe()
	if err != nil {
		e.fatalf("%v", err)
	}
	if err := cmd.Start(); err != nil {
		e.fatalf("%v", err)
	}
	l.output = func() string { return fmt.Sprintf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String()) }
	// The report on stdout is what counts: kubectl may still exit
	// non-zero after the loop printed a complete report (its exec stream
	// torn down as the command ends), which is logged, not counted as
	// lost connections.
	l.finish = func() ([]byte, error) {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				e.t.Logf("connection loop %s: kubectl exited with %v; stderr: %s", l.name, err, bytes.TrimSpace(errOut.Bytes()))
			}
			return out.Bytes(), nil
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-done
			return out.Bytes(), errors.New("the loop did not end within a minute of its stdin closing")
		}
	}
	return l
}

// startLoops starts the step's connection loops: from the client pod on
// each node to the ClusterIP, whose pods are on every node, and from
// outside the cluster to each node's NodePort of the other nodes' pods
// (with one node, its NodePort of its own pods). The loops are running
// once their first connection is made; a second is plenty under
// emulation.
func (e *env) startLoops() []*loop {
	e.t.Helper()
	var ls []*loop
	for _, n := range e.nodes {
		ls = append(ls, e.startLoop(clientPod(n.Name), webTCP))
	}
	for _, through := range e.nodes {
		for _, to := range e.nodes {
			if to.Name != through.Name || len(e.nodes) == 1 {
				ls = append(ls, e.startLoop(outsideName, netip.AddrPortFrom(through.IP, uint16(to.NodePort))))
			}
		}
	}
	time.Sleep(2 * time.Second)
	return ls
}

// stopLoops ends the step's loops and sums up their results.
func (e *env) stopLoops(step string, ls []*loop) loopResult {
	e.t.Helper()
	// Let the last step's effects meet a few more connections.
	time.Sleep(2 * time.Second)
	sum := loopResult{Errors: map[string]int{}, Servers: map[string]int{}}
	for _, l := range ls {
		sum.add(l.name, l.stop(step))
	}
	return sum
}

// stop ends the loop and returns its summary. A missing or incomplete
// report fails the test, with a short message and the loop's output
// logged before it.
func (l *loop) stop(step string) loopResult {
	l.e.t.Helper()
	out, err := l.finish()
	var r struct {
		loopResult
		Stopped string
	}
	if err == nil {
		err = json.Unmarshal(out, &r)
	}
	if err != nil || r.Stopped != "stdin" {
		l.e.t.Logf("connection loop %s: %s", l.name, l.output())
		l.e.fatalf("connection loop %s: no complete report (%v; report %q, stopped by %q)", l.name, err, out, r.Stopped)
	}
	if r.Failures > 0 {
		r.Evidence = gather(r.loopResult, l.conntrack)
	}
	l.e.saveAgentLog(step, r.loopResult)
	if l.e.rules != nil {
		l.e.logWindow("ruleset changes", step, r.loopResult, l.e.rules.String())
	}
	return r.loopResult
}
