package sandbox

import (
	"fmt"
	"net/netip"
	"time"
)

// Process describes the probe subprocess as it saw itself from inside.
type Process struct {
	// PID is the probe's process ID.
	PID int `json:"pid"`
	// Cgroup is the probe's cgroup v2 path, read from /proc/self/cgroup.
	Cgroup string `json:"cgroup"`
	// Netns is the inode of the probe's network namespace.
	Netns uint64 `json:"netns"`
}

// Report is what a probe returns: where it ran and one result per attempt.
type Report[T any] struct {
	// Process describes the probe subprocess.
	Process Process `json:"process"`
	// Results holds one entry per attempt, in order.
	Results []T `json:"results"`
}

// TCPResult is one TCP connection attempt.
type TCPResult struct {
	// Connected reports whether connect() succeeded.
	Connected bool `json:"connected"`
	// Server is the host name the server reported.
	Server string `json:"server,omitempty"`
	// ClientSeen is the client address the server reported.
	ClientSeen netip.AddrPort `json:"clientSeen"`
	// Peer is what getpeername() returned after connect().
	Peer netip.AddrPort `json:"peer"`
	// Local is what getsockname() returned after connect().
	Local netip.AddrPort `json:"local"`
	// Cookie is the socket's cookie (SO_COOKIE), the number BPF programs
	// and sock_diag know it by.
	Cookie uint64 `json:"cookie,omitempty"`
	// Err is empty on success, else the errno name of the failed step, such
	// as "ECONNREFUSED", "EPERM" or "ETIMEDOUT" (also for the probe's own
	// timeout), or "EOF" if the server closed without answering.
	Err string `json:"err,omitempty"`
	// Elapsed is how long connect() took.
	Elapsed time.Duration `json:"elapsed"`
}

// UDPResult is one UDP request and reply.
type UDPResult struct {
	// Server is the host name the server reported.
	Server string `json:"server,omitempty"`
	// ClientSeen is the client address the server reported.
	ClientSeen netip.AddrPort `json:"clientSeen"`
	// Peer is what getpeername() returned after connect(); only for
	// connected sockets.
	Peer netip.AddrPort `json:"peer"`
	// From is the reply's source address as recvfrom() returned it.
	From netip.AddrPort `json:"from"`
	// Local is what getsockname() returned after sending.
	Local netip.AddrPort `json:"local"`
	// Err is empty on success, else an errno name as in TCPResult.
	Err string `json:"err,omitempty"`
	// Elapsed is the time from sending to the reply.
	Elapsed time.Duration `json:"elapsed"`
}

// HTTPResult is one HTTP GET.
type HTTPResult struct {
	// Status is the response's status code.
	Status int `json:"status,omitempty"`
	// Server is the host name the server reported.
	Server string `json:"server,omitempty"`
	// ClientSeen is the client address the server reported.
	ClientSeen netip.AddrPort `json:"clientSeen"`
	// Weight is the response's X-Load-Balancing-Endpoint-Weight header,
	// the local endpoint count a health check node port reports.
	Weight string `json:"weight,omitempty"`
	// Err is empty on success, else an errno name as in TCPResult.
	Err string `json:"err,omitempty"`
	// Elapsed is the time the request took.
	Elapsed time.Duration `json:"elapsed"`
}

// LoopOptions bound a connection loop. Zero fields take the defaults.
type LoopOptions struct {
	// UDP makes each attempt a UDP exchange instead of a TCP connection: a
	// new connected UDP socket sends one datagram and reads the answer, so
	// that every attempt goes through the load balancer's choice again as
	// a new TCP connection does.
	UDP bool
	// Timeout bounds each connection attempt (default 2s).
	Timeout time.Duration
	// Interval is the pause between attempts (default 10ms).
	Interval time.Duration
	// MaxAttempts ends the loop after that many attempts (default 100000).
	MaxAttempts int
	// MaxDuration ends the loop after that long (default 2m, at most 10m).
	MaxDuration time.Duration
}

// LoopResult sums up a connection loop.
type LoopResult struct {
	// Process describes the probe subprocess.
	Process Process `json:"process"`
	// Attempts counts the connections tried.
	Attempts int `json:"attempts"`
	// Failures counts the attempts that did not get a server's answer.
	Failures int `json:"failures"`
	// Errors counts failures by errno name.
	Errors map[string]int `json:"errors"`
	// Servers counts answers by server name.
	Servers map[string]int `json:"servers"`
	// Duration is how long the loop ran.
	Duration time.Duration `json:"duration"`
	// Failed details the first maxLoopFailures failed attempts, so that a
	// test can tell when each failed against what it did meanwhile.
	Failed []LoopFailure `json:"failed,omitempty"`
}

// LoopTimeFormat is how LoopFailure.String shows a time of day, for a
// test to log its own steps alike.
const LoopTimeFormat = "15:04:05.000"

// maxLoopFailures bounds LoopResult.Failed.
const maxLoopFailures = 20

// LoopFailure is one failed attempt of a loop.
type LoopFailure struct {
	// At is when the attempt started, by the probe's clock (the machine's).
	At time.Time `json:"at"`
	// Err is the errno name of the failed step, as TCPResult.Err.
	Err string `json:"err"`
	// Connected says whether connect() had succeeded: false, the
	// handshake failed; true, the answer never came.
	Connected bool `json:"connected"`
	// Local is the client's address and port, when connect() succeeded.
	Local netip.AddrPort `json:"local"`
	// Elapsed is how long the attempt took until it failed.
	Elapsed time.Duration `json:"elapsed"`
}

// String is the failure as a test log shows it.
func (f LoopFailure) String() string {
	stage := "connect"
	if f.Connected {
		stage = "answer"
	}
	s := fmt.Sprintf("%s %s %s after %v", f.At.Format(LoopTimeFormat), stage, f.Err, f.Elapsed.Round(time.Millisecond))
	if f.Local.IsValid() {
		s += " from " + f.Local.String()
	}
	return s
}

// ProgrammingAttemptTimeout is the attempt timeout (WaitOptions.Timeout)
// for a wait that times when an address starts to answer. A SYN sent to an
// address that nothing translates yet may go unanswered (a busy machine
// also drops or delays some), and then the attempt in flight when the
// address is programmed ends only at its timeout: the measured moment is
// late by up to that much, so that with the default 2 s a change programmed
// in 0.3 s could be measured at 2.3 s. A connection between two namespaces
// of the sandbox is made in well under a millisecond; an attempt that a
// busy machine delays past the timeout is tried again.
const ProgrammingAttemptTimeout = 100 * time.Millisecond

// WaitOptions bound a wait probe (Client.StartWait). Zero fields take the
// defaults.
type WaitOptions struct {
	// Server is the server name to wait for; empty means any answer.
	Server string
	// Timeout bounds each connection attempt (default 2s).
	Timeout time.Duration
	// Interval is the pause between attempts (default 10ms).
	Interval time.Duration
	// MaxAttempts ends the wait after that many attempts (default 100000).
	MaxAttempts int
	// MaxDuration ends the wait after that long (default 2m, at most 10m).
	MaxDuration time.Duration
}

// WaitResult is the outcome of a wait probe.
type WaitResult struct {
	// Process describes the probe subprocess.
	Process Process `json:"process"`
	// Attempts counts the connections tried, the answering one included.
	Attempts int `json:"attempts"`
	// Answered reports whether the awaited server answered.
	Answered bool `json:"answered"`
	// Answer is the attempt that got the awaited answer.
	Answer TCPResult `json:"answer"`
	// AnsweredAt is the probe's wall-clock time right after the awaited
	// answer was read, to compare with the test's own clock.
	AnsweredAt time.Time `json:"answeredAt"`
	// Errors counts failed attempts by errno name.
	Errors map[string]int `json:"errors"`
	// Servers counts answers from other servers than the awaited one.
	Servers map[string]int `json:"servers"`
	// Duration is how long the probe ran.
	Duration time.Duration `json:"duration"`
}
