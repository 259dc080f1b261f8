package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The subprocess protocol: the parent sets probeEnv to a JSON probeRequest
// and re-executes its own binary inside the client namespace and the child
// cgroup. Main runs the probe and writes JSON probeMessages, one a line, on
// stdout. A loop or hold probe first writes a Ready message and stops when its
// stdin is closed; a hold probe also answers every line of stdin with a Ping
// message. The last message of every probe carries its Result or Error.
const probeEnv = "EBPF_PROXY_SANDBOX_PROBE"

// Probe kinds.
const (
	kindTCP  = "tcp"
	kindSCTP = "sctp"
	kindUDP  = "udp"
	kindHTTP = "http"
	kindLoop = "loop"
	kindHold = "hold"
	kindWait = "wait"
	// kindUDPStream is a long-lived connected UDP client; see
	// Client.StartUDPStream.
	kindUDPStream = "udpstream"
	kindConnects  = "connects"
)

// Bounds for probes: a test asks for a handful of attempts, the bounds keep a
// typo from flooding the sandbox or hanging the test binary.
const (
	maxCount           = 1000
	defaultTimeout     = 2 * time.Second
	maxTimeout         = 30 * time.Second
	defaultInterval    = 10 * time.Millisecond
	defaultMaxAttempts = 100000
	maxAttempts        = 1000000
	defaultMaxDuration = 2 * time.Minute
	maxDuration        = 15 * time.Minute // the 10-minute churn of make chaos, and its setup
	maxReply           = 4096
)

type probeRequest struct {
	Kind  string         `json:"kind"`
	Addr  netip.AddrPort `json:"addr"`
	Path  string         `json:"path,omitempty"`
	Count int            `json:"count"`
	// Connected makes a UDP probe connect its sockets; a loop probe with
	// it exchanges UDP datagrams on a new connected socket per attempt.
	Connected bool `json:"connected,omitempty"`
	// LocalPort is the source port a TCP, hold or connected UDP probe binds
	// (0: the kernel's choice).
	LocalPort uint16 `json:"localPort,omitempty"`
	// OneSocket sends every UDP datagram from one unconnected socket.
	OneSocket   bool          `json:"oneSocket,omitempty"`
	Timeout     time.Duration `json:"timeout"`
	Interval    time.Duration `json:"interval,omitempty"`
	MaxDuration time.Duration `json:"maxDuration,omitempty"`
	// Server is the answer a wait probe waits for; empty means any.
	Server string `json:"server,omitempty"`
	// Addrs are the addresses a UDP stream probe connects to in turn, from
	// Addr (which is Addrs[0]) on, or that a UDP probe's one socket is
	// connected to in turn (Client.UDPReconnects).
	Addrs []netip.AddrPort `json:"addrs,omitempty"`
	// Where the probe must find itself; it refuses to send anything
	// elsewhere.
	Netns  uint64 `json:"netns"`
	Cgroup string `json:"cgroup"`
}

type probeMessage struct {
	Ready  bool            `json:"ready,omitempty"`
	Ping   *pingResult     `json:"ping,omitempty"`
	Query  *UDPQuery       `json:"query,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// final reports whether m is the last message of a probe.
func (m probeMessage) final() bool { return !m.Ready && m.Ping == nil && m.Query == nil }

// pingResult is one round trip on a held connection.
type pingResult struct {
	OK  bool   `json:"ok"`
	Err string `json:"err,omitempty"`
	// Peer is what getpeername() returned after the ping, or PeerErr the
	// errno name of its failure (the connection may be ended in between:
	// that is the next ping's to report).
	Peer    netip.AddrPort `json:"peer"`
	PeerErr string         `json:"peer_err,omitempty"`
}

// heldConn is a hold probe's Ready and final result.
type heldConn struct {
	Process Process   `json:"process"`
	First   TCPResult `json:"first"`
}

// validate checks a request on both sides of the protocol.
func (r *probeRequest) validate() error {
	switch {
	case !r.Addr.IsValid() || r.Addr.Port() == 0:
		return fmt.Errorf("probe address %q is not ip:port", r.Addr)
	case r.Kind != kindLoop && r.Kind != kindWait && r.Kind != kindUDPStream && r.Kind != kindConnects && (r.Count < 1 || r.Count > maxCount):
		return fmt.Errorf("probe count %d is not in [1, %d]", r.Count, maxCount)
	case (r.Kind == kindLoop || r.Kind == kindWait || r.Kind == kindUDPStream || r.Kind == kindConnects) && (r.Count < 1 || r.Count > maxAttempts):
		return fmt.Errorf("%s attempts %d is not in [1, %d]", r.Kind, r.Count, maxAttempts)
	case r.Timeout <= 0 || r.Timeout > maxTimeout:
		return fmt.Errorf("probe timeout %s is not in (0, %s]", r.Timeout, maxTimeout)
	case r.Interval < 0 || r.Interval > maxTimeout:
		return fmt.Errorf("loop interval %s is not in [0, %s]", r.Interval, maxTimeout)
	case (r.Kind == kindLoop || r.Kind == kindHold || r.Kind == kindWait || r.Kind == kindUDPStream) && (r.MaxDuration <= 0 || r.MaxDuration > maxDuration):
		return fmt.Errorf("%s duration %s is not in (0, %s]", r.Kind, r.MaxDuration, maxDuration)
	}
	switch r.Kind {
	case kindUDP:
		if r.Addrs != nil {
			return validateReconnects(r)
		}
		return nil
	case kindTCP, kindSCTP, kindHTTP, kindLoop, kindHold, kindWait, kindConnects:
		return nil
	case kindUDPStream:
		return validateStreamAddrs(r.Addr, r.Addrs)
	}
	return fmt.Errorf("unknown probe kind %q", r.Kind)
}

// Main runs a client probe and exits if this process was started as one;
// otherwise it returns at once. Every binary that runs probes (test binaries
// through TestMain, the demo) must call it before anything else, because
// probes re-execute the running binary.
func Main() {
	body, ok := os.LookupEnv(probeEnv)
	if !ok {
		return
	}
	os.Unsetenv(probeEnv)
	os.Exit(runProbe(body, os.Stdin, os.Stdout))
}

// runProbe runs the probe that body requests and returns the exit code.
func runProbe(body string, stdin io.Reader, stdout io.Writer) int {
	enc := json.NewEncoder(stdout)
	result, err := probe(body, stdin, func(m probeMessage) error { return enc.Encode(m) })
	if err != nil {
		_ = enc.Encode(probeMessage{Error: err.Error()})
		return 1
	}
	if err := enc.Encode(probeMessage{Result: result}); err != nil {
		return 1
	}
	return 0
}

// probe runs the probe that body requests and returns its result; emit
// writes the messages that come before it.
func probe(body string, stdin io.Reader, emit func(probeMessage) error) (json.RawMessage, error) {
	var req probeRequest
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		return nil, fmt.Errorf("decode probe request: %w", err)
	}
	if err := req.validate(); err != nil {
		return nil, err
	}
	proc, err := selfProcess()
	if err != nil {
		return nil, err
	}
	if proc.Netns != req.Netns || proc.Cgroup != req.Cgroup {
		return nil, fmt.Errorf("refusing to probe: running in netns %d and cgroup %s, want netns %d and cgroup %s",
			proc.Netns, proc.Cgroup, req.Netns, req.Cgroup)
	}
	var out any
	switch req.Kind {
	case kindTCP:
		out = Report[TCPResult]{Process: proc, Results: repeat(req.Count, func() TCPResult { return tcpAttemptFrom(req.Addr, req.LocalPort, req.Timeout) })}
	case kindSCTP:
		out = Report[TCPResult]{Process: proc, Results: repeat(req.Count, func() TCPResult { return sctpAttempt(req.Addr, req.Timeout) })}
	case kindUDP:
		if req.Addrs != nil {
			out = Report[UDPResult]{Process: proc, Results: udpReconnects(req.Addrs, req.Timeout)}
			break
		}
		if req.OneSocket {
			out = Report[UDPResult]{Process: proc, Results: udpOneSocket(req.Addr, req.Count, req.Timeout)}
			break
		}
		out = Report[UDPResult]{Process: proc, Results: repeat(req.Count, func() UDPResult { return udpAttemptFrom(req.Addr, req.Connected, req.LocalPort, req.Timeout) })}
	case kindHTTP:
		out = Report[HTTPResult]{Process: proc, Results: repeat(req.Count, func() HTTPResult { return httpAttempt(req.Addr, req.Path, req.Timeout) })}
	case kindLoop:
		res, err := loop(req, stdin, emit)
		if err != nil {
			return nil, err
		}
		res.Process = proc
		out = res
	case kindWait:
		res, err := waitForAnswer(req, stdin, emit)
		if err != nil {
			return nil, err
		}
		res.Process = proc
		out = res
	case kindUDPStream:
		res, err := udpStream(req, proc, stdin, emit)
		if err != nil {
			return nil, err
		}
		out = res
	case kindConnects:
		res := udpConnects(req.Addr, req.Count)
		res.Process = proc
		out = res
	case kindHold:
		res, err := hold(req, proc, stdin, emit)
		if err != nil {
			return nil, err
		}
		out = res
	}
	return json.Marshal(out)
}

func repeat[T any](n int, f func() T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = f()
	}
	return out
}

// selfProcess describes this process from /proc.
func selfProcess() (Process, error) {
	cg, err := processCgroup("self")
	if err != nil {
		return Process{}, fmt.Errorf("read own cgroup: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return Process{}, fmt.Errorf("stat own netns: %w", err)
	}
	return Process{PID: os.Getpid(), Cgroup: cg, Netns: st.Ino}, nil
}

// network picks the socket family from the address, so that an IPv4
// address gets an AF_INET socket and the connect4/sendmsg4 hooks see it.
func network(proto string, addr netip.AddrPort) string {
	if addr.Addr().Is4() {
		return proto + "4"
	}
	return proto + "6"
}

func tcpAttempt(addr netip.AddrPort, timeout time.Duration) TCPResult {
	return tcpAttemptFrom(addr, 0, timeout)
}

// tcpAttemptFrom is tcpAttempt from the source port localPort (0: any).
func tcpAttemptFrom(addr netip.AddrPort, localPort uint16, timeout time.Duration) TCPResult {
	r, conn, _ := tcpConnectFrom(addr, localPort, timeout)
	if conn != nil {
		conn.Close()
	}
	return r
}

// tcpConnectFrom connects to addr from the source port localPort (0: any;
// else bound with SO_REUSEADDR: the port may be in TIME_WAIT from an
// earlier attempt, or held by a connection to another destination) and
// reads the server's line. Unless connect() failed, it returns the
// connection, still open, and a reader for what follows the line; the
// caller must close the connection.
func tcpConnectFrom(addr netip.AddrPort, localPort uint16, timeout time.Duration) (TCPResult, net.Conn, *bufio.Reader) {
	var r TCPResult
	d := net.Dialer{Timeout: timeout}
	if localPort != 0 {
		d.LocalAddr = &net.TCPAddr{Port: int(localPort)}
		d.Control = reuseAddr
	}
	start := time.Now()
	var conn net.Conn
	var err error
	if addr.Addr().Is4In6() {
		conn, err = mappedSocket(unix.SOCK_STREAM, addr, true, timeout)
	} else {
		conn, err = d.Dial(network("tcp", addr), addr.String())
	}
	r.Elapsed = time.Since(start)
	if err != nil {
		r.Err = errName(err)
		return r, nil, nil
	}
	r.Connected = true
	rd := bufio.NewReaderSize(conn, maxReply)
	if r.Local, r.Peer, err = sockNames(conn.(syscall.Conn)); err != nil {
		r.Err = errName(err)
		return r, conn, rd
	}
	if r.Cookie, err = socketCookie(conn.(syscall.Conn)); err != nil {
		r.Err = errName(err)
		return r, conn, rd
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	line, err := readLine(rd)
	if err != nil {
		r.Err = errName(err)
		return r, conn, rd
	}
	r.Server, r.ClientSeen, err = parseReply(line)
	if err != nil {
		r.Err = err.Error()
	}
	return r, conn, rd
}

// reuseAddr sets SO_REUSEADDR on a socket before it binds.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}

// readLine reads one line of at most maxReply bytes, so that a misbehaving
// server cannot grow the probe's memory.
// readLongLine reads a line of at most max bytes, which may be longer than
// rd's buffer.
func readLongLine(rd *bufio.Reader, max int) (string, error) {
	var b strings.Builder
	for {
		part, err := rd.ReadSlice('\n')
		b.Write(part)
		if b.Len() > max {
			return "", fmt.Errorf("server line longer than %d bytes", max)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return b.String(), err
		}
	}
}

func readLine(rd *bufio.Reader) (string, error) {
	line, err := rd.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return "", fmt.Errorf("server line longer than %d bytes", maxReply)
	}
	return string(line), err
}

func udpAttempt(addr netip.AddrPort, connected bool, timeout time.Duration) UDPResult {
	return udpAttemptFrom(addr, connected, 0, timeout)
}

// udpAttemptFrom is udpAttempt whose connected socket binds the source
// port localPort first (0: the kernel's choice).
func udpAttemptFrom(addr netip.AddrPort, connected bool, localPort uint16, timeout time.Duration) UDPResult {
	var (
		r    UDPResult
		conn *net.UDPConn
		err  error
	)
	switch {
	case addr.Addr().Is4In6():
		var c net.Conn
		if c, err = mappedSocket(unix.SOCK_DGRAM, addr, connected, timeout); err == nil {
			conn = c.(*net.UDPConn)
		}
	case connected:
		var local *net.UDPAddr
		if localPort != 0 {
			local = &net.UDPAddr{Port: int(localPort)}
		}
		conn, err = net.DialUDP(network("udp", addr), local, net.UDPAddrFromAddrPort(addr))
	default:
		conn, err = net.ListenUDP(network("udp", addr), nil)
	}
	if err != nil {
		r.Err = errName(err)
		return r
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	start := time.Now()
	if connected {
		_, err = conn.Write([]byte("ping\n"))
	} else {
		_, err = conn.WriteToUDPAddrPort([]byte("ping\n"), addr)
	}
	if err != nil {
		r.Err = errName(err)
		return r
	}
	var peer netip.AddrPort
	if r.Local, peer, err = sockNames(conn); err != nil && connected {
		r.Err = errName(err)
		return r
	}
	if connected {
		r.Peer = peer
	}
	readReply(conn, make([]byte, maxReply), start, &r)
	return r
}

func httpAttempt(addr netip.AddrPort, path string, timeout time.Duration) HTTPResult {
	var r HTTPResult
	d := net.Dialer{Timeout: timeout}
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			// Never a proxy from the environment: the request must go where
			// the test says.
			Proxy: nil,
			DialContext: func(ctx context.Context, _, hostport string) (net.Conn, error) {
				return d.DialContext(ctx, network("tcp", addr), hostport)
			},
			DisableKeepAlives: true,
		},
	}
	defer client.CloseIdleConnections()
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	start := time.Now()
	resp, err := client.Get("http://" + addr.String() + path)
	if err != nil {
		r.Elapsed = time.Since(start)
		r.Err = errName(err)
		return r
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	r.Elapsed = time.Since(start)
	r.Status = resp.StatusCode
	r.Weight = resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
	if err != nil {
		r.Err = errName(err)
		return r
	}
	r.Server, r.ClientSeen, err = parseReply(string(body))
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

// loop connects to req.Addr until stdin is closed or a bound is reached:
// over TCP, or with req.Connected a UDP exchange on a new connected socket
// each time.
func loop(req probeRequest, stdin io.Reader, emit func(probeMessage) error) (LoopResult, error) {
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(stop)
	}()
	res := LoopResult{Errors: map[string]int{}, Servers: map[string]int{}}
	start := time.Now()
	deadline := start.Add(req.MaxDuration)
	attempt := func() (server string, f LoopFailure) {
		r := tcpAttempt(req.Addr, req.Timeout)
		return r.Server, LoopFailure{Err: r.Err, Connected: r.Connected, Local: r.Local}
	}
	if req.Connected {
		attempt = func() (server string, f LoopFailure) {
			r := udpAttempt(req.Addr, true, req.Timeout)
			return r.Server, LoopFailure{Err: r.Err, Local: r.Local}
		}
	}
	for res.Attempts < req.Count && time.Now().Before(deadline) {
		at := time.Now()
		server, f := attempt()
		res.Attempts++
		if f.Err != "" {
			res.Failures++
			res.Errors[f.Err]++
			if len(res.Failed) < maxLoopFailures {
				f.At, f.Elapsed = at, time.Since(at)
				res.Failed = append(res.Failed, f)
			}
		} else {
			res.Servers[server]++
		}
		if res.Attempts == 1 {
			if err := emit(probeMessage{Ready: true}); err != nil {
				return res, fmt.Errorf("report loop start: %w", err)
			}
		}
		if stopped(stop, req.Interval) {
			break
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

// waitForAnswer connects to req.Addr until the server named req.Server (any
// server if empty) answers, stdin is closed or a bound is reached.
func waitForAnswer(req probeRequest, stdin io.Reader, emit func(probeMessage) error) (WaitResult, error) {
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(stop)
	}()
	res := WaitResult{Errors: map[string]int{}, Servers: map[string]int{}}
	start := time.Now()
	deadline := start.Add(req.MaxDuration)
	for res.Attempts < req.Count && time.Now().Before(deadline) {
		r := tcpAttempt(req.Addr, req.Timeout)
		now := time.Now()
		res.Attempts++
		switch {
		case r.Err != "":
			res.Errors[r.Err]++
		case req.Server == "" || r.Server == req.Server:
			res.Answered, res.Answer, res.AnsweredAt = true, r, now
		default:
			res.Servers[r.Server]++
		}
		if res.Attempts == 1 {
			if err := emit(probeMessage{Ready: true}); err != nil {
				return res, fmt.Errorf("report wait start: %w", err)
			}
		}
		if res.Answered || stopped(stop, req.Interval) {
			break
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

// hold connects once to req.Addr, reports the connection as ready, then
// sends a ping on it for every line read from stdin and reports each round
// trip, until stdin ends or req.MaxDuration has passed.
func hold(req probeRequest, proc Process, stdin io.Reader, emit func(probeMessage) error) (heldConn, error) {
	res := heldConn{Process: proc}
	var (
		conn net.Conn
		rd   *bufio.Reader
	)
	res.First, conn, rd = tcpConnectFrom(req.Addr, req.LocalPort, req.Timeout)
	if conn != nil {
		defer conn.Close()
	}
	first, err := json.Marshal(res)
	if err != nil {
		return res, fmt.Errorf("encode held connection: %w", err)
	}
	if err := emit(probeMessage{Ready: true, Result: first}); err != nil {
		return res, fmt.Errorf("report held connection: %w", err)
	}
	// Each line of stdin asks for a ping: empty for a short one, else the
	// size in bytes of the line to send and have echoed.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	bound := time.NewTimer(req.MaxDuration)
	defer bound.Stop()
	for n := 1; ; n++ {
		var size int
		select {
		case line, ok := <-lines:
			if !ok {
				return res, nil
			}
			if line != "" {
				var err error
				if size, err = strconv.Atoi(line); err != nil || size < 0 || size > maxPingSize {
					return res, fmt.Errorf("ping size %q is not in [0, %d]", line, maxPingSize)
				}
			}
		case <-bound.C:
			return res, fmt.Errorf("held connection reached its %s bound", req.MaxDuration)
		}
		r := pingResult{Err: ping(conn, rd, n, size, req.Timeout)}
		r.OK = r.Err == ""
		if r.OK {
			if _, peer, err := sockNames(conn.(syscall.Conn)); err == nil {
				r.Peer = peer
			} else {
				r.PeerErr = errName(err)
			}
		}
		if err := emit(probeMessage{Ping: &r}); err != nil {
			return res, fmt.Errorf("report ping %d: %w", n, err)
		}
	}
}

// maxPingSize bounds the line a ping sends (Held.PingSize).
const maxPingSize = 1 << 16

// ping writes "ping <n>" on conn, padded to size bytes with its newline
// when size is larger, and waits for the server to echo it; it returns the
// errno name of the failure, or "" once the echo is back.
func ping(conn net.Conn, rd *bufio.Reader, n, size int, timeout time.Duration) string {
	if conn == nil {
		// connect() failed: the socket was never connected.
		return "ENOTCONN"
	}
	want := fmt.Sprintf("ping %d", n)
	if pad := size - len(want) - 1; pad > 0 {
		want += " " + strings.Repeat("x", pad-1)
	}
	want += "\n"
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, want); err != nil {
		return errName(err)
	}
	// Bounded: each earlier ping has at most one late echo.
	for range n {
		line, err := readLongLine(rd, maxPingSize)
		if err != nil {
			return errName(err)
		}
		if line == want {
			return ""
		}
		// The late echo of an earlier ping that timed out comes first.
		if k, ok := pingNumber(line); !ok || k >= n {
			return fmt.Sprintf("unexpected echo %q for %q", line, want)
		}
	}
	return fmt.Sprintf("no echo of %q", want)
}

// pingNumber parses a "ping <n>[ padding]\n" line.
func pingNumber(line string) (int, bool) {
	num, ok := strings.CutPrefix(line, "ping ")
	if !ok {
		return 0, false
	}
	num, _, _ = strings.Cut(strings.TrimSuffix(num, "\n"), " ")
	k, err := strconv.Atoi(num)
	return k, err == nil
}

// stopped waits for d and reports whether stop was closed meanwhile.
func stopped(stop <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return true
	case <-t.C:
		return false
	}
}

// sockNames returns getsockname() and getpeername() of a socket; the peer
// is the zero AddrPort for an unconnected one.
func sockNames(c syscall.Conn) (local, peer netip.AddrPort, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return local, peer, err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, serr = unix.Getsockname(int(fd)); serr != nil {
			serr = os.NewSyscallError("getsockname", serr)
			return
		}
		local = addrPort(sa)
		if sa, serr = unix.Getpeername(int(fd)); serr != nil {
			serr = os.NewSyscallError("getpeername", serr)
			return
		}
		peer = addrPort(sa)
	})
	return local, peer, errors.Join(err, serr)
}

// socketCookie returns the socket's cookie (SO_COOKIE): the number that
// identifies it to BPF programs (bpf_get_socket_cookie) and to sock_diag.
func socketCookie(c syscall.Conn) (uint64, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		cookie uint64
		serr   error
	)
	err = raw.Control(func(fd uintptr) {
		cookie, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
		if serr != nil {
			serr = os.NewSyscallError("getsockopt SO_COOKIE", serr)
		}
	})
	return cookie, errors.Join(err, serr)
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// parseReply splits a server's "<name> <ip:port>\n" line.
func parseReply(line string) (string, netip.AddrPort, error) {
	name, addr, ok := strings.Cut(strings.TrimSpace(line), " ")
	if !ok {
		return "", netip.AddrPort{}, fmt.Errorf("malformed server reply %q", line)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("malformed server reply %q: %w", line, err)
	}
	return name, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// errName names an error the way a user of the socket API knows it.
func errName(err error) string {
	var errno syscall.Errno
	var nerr net.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "ETIMEDOUT"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	case errors.As(err, &errno) && unix.ErrnoName(errno) != "":
		return unix.ErrnoName(errno)
	case errors.As(err, &nerr) && nerr.Timeout():
		return "ETIMEDOUT"
	}
	return err.Error()
}
