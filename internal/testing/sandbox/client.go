package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Client runs probes from a host of the sandbox. Each probe is a subprocess
// born inside the sandbox's child cgroup (so that cgroup BPF hooks act on its
// sockets) and inside the host's network namespace; the test process itself
// never moves.
type Client struct {
	*Host

	sb      *Sandbox
	cg      *Cgroup // nil: the sandbox's Cgroup
	timeout time.Duration
}

// ClientAt returns a Client that runs probes from h, for example from a
// node's namespace.
func (s *Sandbox) ClientAt(h *Host) *Client { return s.clientAt(h) }

func (s *Sandbox) clientAt(h *Host) *Client {
	return &Client{Host: h, sb: s, timeout: defaultTimeout}
}

// WithTimeout returns a copy of c whose probes give each attempt d (default
// 2s, at most 30s) before reporting ETIMEDOUT.
func (c *Client) WithTimeout(d time.Duration) *Client {
	cc := *c
	cc.timeout = d
	return &cc
}

// InCgroup returns a copy of c whose probes are born in cg, a cgroup of the
// sandbox (Sandbox.Cgroup or one made by AddCgroup), instead of the sandbox's
// Cgroup.
func (c *Client) InCgroup(cg *Cgroup) *Client {
	cc := *c
	cc.cg = cg
	return &cc
}

// Cgroup returns the cgroup the client's probes are born in.
func (c *Client) Cgroup() *Cgroup {
	if c.cg != nil {
		return c.cg
	}
	return c.sb.Cgroup
}

// TCP connects n times to addr, reading the server's line each time. An
// IPv4-mapped addr (::ffff:a.b.c.d) is reached from an AF_INET6 socket, as
// a dual-stack client reaches an IPv4 host; so is one by UDP and
// UDPConnected.
func (c *Client) TCP(ctx context.Context, addr netip.AddrPort, n int) (Report[TCPResult], error) {
	var rep Report[TCPResult]
	err := c.run(ctx, probeRequest{Kind: kindTCP, Addr: addr, Count: n}, &rep)
	return rep, err
}

// TCPFrom connects once to addr from the source port localPort, as TCP
// does: a flow whose tuple the test knows in advance.
func (c *Client) TCPFrom(ctx context.Context, addr netip.AddrPort, localPort uint16) (TCPResult, error) {
	var rep Report[TCPResult]
	err := c.run(ctx, probeRequest{Kind: kindTCP, Addr: addr, Count: 1, LocalPort: localPort}, &rep)
	if err == nil && len(rep.Results) != 1 {
		err = fmt.Errorf("tcp probe from port %d: %d results, want 1", localPort, len(rep.Results))
	}
	if err != nil {
		return TCPResult{}, err
	}
	return rep.Results[0], nil
}

// UDP sends n datagrams to addr from unconnected sockets with sendto() and
// receives each reply with recvfrom().
func (c *Client) UDP(ctx context.Context, addr netip.AddrPort, n int) (Report[UDPResult], error) {
	var rep Report[UDPResult]
	err := c.run(ctx, probeRequest{Kind: kindUDP, Addr: addr, Count: n}, &rep)
	return rep, err
}

// UDPConnected sends n datagrams to addr, each from a socket connected with
// connect(), and receives each reply.
func (c *Client) UDPConnected(ctx context.Context, addr netip.AddrPort, n int) (Report[UDPResult], error) {
	var rep Report[UDPResult]
	err := c.run(ctx, probeRequest{Kind: kindUDP, Addr: addr, Count: n, Connected: true}, &rep)
	return rep, err
}

// UDPFrom sends one datagram to addr from a socket connected with
// connect() after binding the source port localPort (0: the kernel's
// choice), and receives the reply. Sent again from the port the first
// one's Local names, it continues the same flow (one conntrack entry), as
// a sender that keeps its socket, such as a statsd client, does.
func (c *Client) UDPFrom(ctx context.Context, addr netip.AddrPort, localPort uint16) (UDPResult, error) {
	if addr.Addr().Is4In6() && localPort != 0 {
		return UDPResult{}, fmt.Errorf("udp probe from %s to %s: a source port with an IPv4-mapped address is not supported", c.Name, addr)
	}
	var rep Report[UDPResult]
	err := c.run(ctx, probeRequest{Kind: kindUDP, Addr: addr, Count: 1, Connected: true, LocalPort: localPort}, &rep)
	if err == nil && len(rep.Results) != 1 {
		err = fmt.Errorf("udp probe from %s to %s: %d results, want 1", c.Name, addr, len(rep.Results))
	}
	if err != nil {
		return UDPResult{}, err
	}
	return rep.Results[0], nil
}

// HTTP sends n GET requests for path to addr, each on a new connection.
func (c *Client) HTTP(ctx context.Context, addr netip.AddrPort, path string, n int) (Report[HTTPResult], error) {
	var rep Report[HTTPResult]
	err := c.run(ctx, probeRequest{Kind: kindHTTP, Addr: addr, Path: path, Count: n}, &rep)
	return rep, err
}

// run starts a one-shot probe, waits for it and decodes its result into out.
func (c *Client) run(ctx context.Context, req probeRequest, out any) error {
	if err := c.prepare(&req); err != nil {
		return err
	}
	// Every attempt is bounded by the timeout (UDP and HTTP by two of them);
	// the slack covers starting the process.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.Count)*2*req.Timeout+10*time.Second)
	defer cancel()
	cmd, err := c.command(ctx, req)
	if err != nil {
		return err
	}
	stdout := &cappedBuffer{max: 8 << 20}
	stderr := &cappedBuffer{max: 16 << 10}
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	if err := c.start(cmd); err != nil {
		return err
	}
	werr := cmd.Wait()
	msgs, derr := decodeMessages(strings.NewReader(stdout.String()))
	if len(msgs) == 0 || msgs[len(msgs)-1].Result == nil && msgs[len(msgs)-1].Error == "" {
		return c.failed(req, errors.Join(werr, derr), stderr)
	}
	last := msgs[len(msgs)-1]
	if last.Error != "" {
		return fmt.Errorf("%s probe from %s to %s: %s", req.Kind, c.Name, req.Addr, last.Error)
	}
	if err := json.Unmarshal(last.Result, out); err != nil {
		return fmt.Errorf("%s probe from %s: decode result: %w", req.Kind, c.Name, err)
	}
	if werr != nil {
		return c.failed(req, werr, stderr)
	}
	return nil
}

// prepare fills in defaults and the probe's expected whereabouts.
func (c *Client) prepare(req *probeRequest) error {
	req.Timeout = c.timeout
	req.Netns = c.NS.Inode()
	req.Cgroup = c.Cgroup().Name()
	if err := req.validate(); err != nil {
		return fmt.Errorf("%s probe from %s: %w", req.Kind, c.Name, err)
	}
	return nil
}

// command prepares the re-execution of this binary as a probe.
func (c *Client) command(ctx context.Context, req probeRequest) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode probe request: %w", err)
	}
	// "-test.run=^$" makes a test binary that forgot to call Main run no
	// test instead of running them all again inside the probe; any other
	// binary rejects the unknown flag.
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	env := make([]string, 0, len(os.Environ())+2)
	gorace := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, probeEnv+"="):
		case strings.HasPrefix(kv, "GORACE="):
			gorace = strings.TrimPrefix(kv, "GORACE=") + " " + gorace
		default:
			env = append(env, kv)
		}
	}
	// A race-enabled probe would otherwise sleep a second before exiting.
	cmd.Env = append(env, "GORACE="+gorace, probeEnv+"="+string(body))
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Born in the cgroup: the cgroup BPF hooks see every socket of the
		// probe from the first.
		UseCgroupFD: true,
		CgroupFD:    c.Cgroup().FD(),
		// No probe outlives a test binary that dies.
		Pdeathsig: syscall.SIGKILL,
	}
	cmd.WaitDelay = time.Second
	return cmd, nil
}

// start forks the probe inside the client's namespace (see Netns.Start).
func (c *Client) start(cmd *exec.Cmd) error {
	c.sb.mu.Lock()
	closed := c.sb.closed
	c.sb.mu.Unlock()
	if closed {
		return errors.New("sandbox is closed")
	}
	if err := c.NS.Start(cmd); err != nil {
		return fmt.Errorf("start probe in %s: %w", c.Name, err)
	}
	return nil
}

func (c *Client) failed(req probeRequest, err error, stderr *cappedBuffer) error {
	return fmt.Errorf("%s probe from %s to %s gave no result (did the binary call sandbox.Main first?): %w; stderr: %q",
		req.Kind, c.Name, req.Addr, err, stderr.String())
}

func decodeMessages(r io.Reader) ([]probeMessage, error) {
	var msgs []probeMessage
	dec := json.NewDecoder(r)
	for {
		var m probeMessage
		if err := dec.Decode(&m); err == io.EOF {
			return msgs, nil
		} else if err != nil {
			return msgs, fmt.Errorf("decode probe output: %w", err)
		}
		msgs = append(msgs, m)
	}
}

// session is a probe subprocess that runs until its stdin is closed: the
// plumbing that Loop and Held share.
type session struct {
	client *Client
	req    probeRequest
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *cappedBuffer
	cancel context.CancelFunc
	// msgs carries the probe's Ready and Ping messages and is closed when
	// its output ends; final and decodeErr are set before that, so whoever
	// has seen msgs closed may read them.
	msgs      chan probeMessage
	final     *probeMessage
	decodeErr error

	stopOnce sync.Once
	stopErr  error
}

// startSession starts a probe that runs until stopped and waits for its
// Ready message. The sandbox stops the session on Close.
func (c *Client) startSession(ctx context.Context, req probeRequest) (*session, probeMessage, error) {
	if err := c.prepare(&req); err != nil {
		return nil, probeMessage{}, err
	}
	// The context bounds the whole session, not only its start.
	sctx, cancel := context.WithTimeout(context.Background(), req.MaxDuration+req.Timeout+10*time.Second)
	cmd, err := c.command(sctx, req)
	if err != nil {
		cancel()
		return nil, probeMessage{}, err
	}
	s := &session{client: c, req: req, cmd: cmd, msgs: make(chan probeMessage, 2),
		stderr: &cappedBuffer{max: 16 << 10}, cancel: cancel}
	cmd.Stderr = s.stderr
	if s.stdin, err = cmd.StdinPipe(); err != nil {
		cancel()
		return nil, probeMessage{}, fmt.Errorf("%s probe: %w", req.Kind, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, probeMessage{}, fmt.Errorf("%s probe: %w", req.Kind, err)
	}
	if err := c.start(cmd); err != nil {
		cancel()
		return nil, probeMessage{}, err
	}
	go s.read(stdout)

	c.sb.mu.Lock()
	closed := c.sb.closed
	if !closed {
		c.sb.sessions[s] = struct{}{}
	}
	c.sb.mu.Unlock()
	if closed {
		return nil, probeMessage{}, errors.Join(errors.New("sandbox is closed"), s.stop())
	}

	startTimeout := time.NewTimer(req.Timeout + 10*time.Second)
	defer startTimeout.Stop()
	select {
	case m, ok := <-s.msgs:
		if ok && m.Ready {
			return s, m, nil
		}
		return nil, probeMessage{}, fmt.Errorf("%s probe from %s to %s did not start: %w", req.Kind, c.Name, req.Addr, s.stop())
	case <-ctx.Done():
		return nil, probeMessage{}, errors.Join(fmt.Errorf("%s probe from %s to %s: %w", req.Kind, c.Name, req.Addr, ctx.Err()), s.stop())
	case <-startTimeout.C:
		return nil, probeMessage{}, errors.Join(fmt.Errorf("%s probe from %s to %s did not start in time", req.Kind, c.Name, req.Addr), s.stop())
	}
}

func (s *session) read(stdout io.Reader) {
	defer close(s.msgs)
	dec := json.NewDecoder(stdout)
	for {
		var m probeMessage
		if err := dec.Decode(&m); err != nil {
			if err != io.EOF {
				s.decodeErr = fmt.Errorf("decode %s probe output: %w", s.req.Kind, err)
			}
			return
		}
		if m.final() {
			s.final = &m
			continue
		}
		s.msgs <- m
	}
}

// stop closes the probe's stdin, which tells it to finish, and waits for it.
// It reports the probe's own error, a missing result or a failed exit; once
// it has returned, s.final holds the probe's last message, if any. stop is
// idempotent.
func (s *session) stop() error {
	s.stopOnce.Do(func() {
		s.stopErr = s.wait()
		sb := s.client.sb
		sb.mu.Lock()
		delete(sb.sessions, s)
		sb.mu.Unlock()
	})
	return s.stopErr
}

func (s *session) wait() error {
	defer s.cancel()
	s.stdin.Close()
	var (
		killed  bool
		errs    []error
		timeout = time.NewTimer(s.req.Timeout + 10*time.Second)
	)
	defer timeout.Stop()
wait:
	for {
		select {
		case _, ok := <-s.msgs:
			if !ok {
				break wait
			}
		case <-timeout.C:
			if killed {
				break wait // Wait below gives up on the pipes after WaitDelay
			}
			// Ends the probe through the command's context: it kills the
			// process this session started, by PID.
			s.cancel()
			killed = true
			errs = append(errs, fmt.Errorf("%s probe did not stop in time", s.req.Kind))
			timeout.Reset(10 * time.Second)
		}
	}
	werr := s.cmd.Wait()
	// Wait has closed stdout, so the reader ends.
	for range s.msgs {
	}
	if s.decodeErr != nil {
		errs = append(errs, s.decodeErr)
	}
	switch {
	case s.final == nil:
		errs = append(errs, errors.New("no result"))
	case s.final.Error != "":
		errs = append(errs, errors.New(s.final.Error))
	}
	if werr != nil {
		errs = append(errs, werr)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s probe from %s to %s: %w; stderr: %q", s.req.Kind, s.client.Name, s.req.Addr, err, s.stderr.String())
	}
	return nil
}

// Loop is a running connection loop started by StartLoop.
type Loop struct {
	s *session
}

// StartLoop starts a probe that connects to addr over TCP (UDP with
// opts.UDP) again and again, reading the server's line each time, until Stop
// or a bound in opts. It
// returns once the first attempt has finished, so that whatever the test
// does next happens while the loop runs. The sandbox stops the loop on Close
// if the test does not.
func (c *Client) StartLoop(ctx context.Context, addr netip.AddrPort, opts LoopOptions) (*Loop, error) {
	req := probeRequest{Kind: kindLoop, Addr: addr, Count: opts.MaxAttempts, Interval: opts.Interval, MaxDuration: opts.MaxDuration,
		Connected: opts.UDP}
	s, _, err := c.startRepeating(ctx, req, defaultInterval, opts.Timeout)
	if err != nil {
		return nil, err
	}
	return &Loop{s: s}, nil
}

// ConnectRate runs a TCP connection loop to addr for d, as fast as it goes,
// and returns its connections per second; a failed connection is an
// error, as a benchmark must not count a broken path as a fast one.
func (c *Client) ConnectRate(ctx context.Context, addr netip.AddrPort, d time.Duration) (float64, error) {
	loop, err := c.StartLoop(ctx, addr, LoopOptions{Interval: time.Microsecond, MaxDuration: d})
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	res, err := loop.Stop()
	if err != nil {
		return 0, err
	}
	if res.Failures != 0 {
		return 0, fmt.Errorf("%d of %d connections from %s to %s failed: %v", res.Failures, res.Attempts, c.Name, addr, res.Errors)
	}
	return float64(res.Attempts) / res.Duration.Seconds(), nil
}

// startRepeating starts the session of a probe that repeats until a bound:
// zero bounds in req get the defaults (interval, the given one), and a
// timeout, if set, replaces the client's for each attempt.
func (c *Client) startRepeating(ctx context.Context, req probeRequest, interval, timeout time.Duration) (*session, probeMessage, error) {
	if req.Count == 0 {
		req.Count = defaultMaxAttempts
	}
	if req.Interval == 0 {
		req.Interval = interval
	}
	if req.MaxDuration == 0 {
		req.MaxDuration = defaultMaxDuration
	}
	cc := c
	if timeout != 0 {
		cc = c.WithTimeout(timeout)
	}
	return cc.startSession(ctx, req)
}

// PID returns the process ID of the loop's subprocess.
func (l *Loop) PID() int { return l.s.cmd.Process.Pid }

// Stop tells the loop to finish its current attempt and waits for its
// result. Stop is idempotent.
func (l *Loop) Stop() (LoopResult, error) {
	err := l.s.stop()
	var res LoopResult
	if f := l.s.final; f != nil && f.Error == "" {
		if derr := json.Unmarshal(f.Result, &res); derr != nil {
			err = errors.Join(err, fmt.Errorf("loop probe from %s to %s: decode result: %w", l.s.client.Name, l.s.req.Addr, derr))
		}
	}
	return res, err
}

// StopUnbroken stops the loop (Stop) and fails t unless every connection
// was answered; during says when, as in "across the restarts". It logs the
// loop's summary and returns its result for the test's further checks.
func (l *Loop) StopUnbroken(t testing.TB, during string) LoopResult {
	t.Helper()
	res, err := l.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loop: %d connections over %v, %d failed, servers %v", res.Attempts, res.Duration, res.Failures, res.Servers)
	if res.Failures != 0 {
		t.Errorf("%d of %d connections failed %s: %v; the first: %v", res.Failures, res.Attempts, during, res.Errors, res.Failed)
	}
	return res
}

// Wait is a running wait probe started by StartWait.
type Wait struct {
	s *session
}

// StartWait starts a probe that connects to addr over TCP again and again
// until the server opts.Server (any server if empty) answers, and then ends
// by itself. It returns once the first attempt has finished, so that a change
// the test makes next happens while the probe watches; AnsweredAt in the
// result then says when the change took effect, to within an attempt and an
// interval. The sandbox stops the probe on Close if the test does not.
func (c *Client) StartWait(ctx context.Context, addr netip.AddrPort, opts WaitOptions) (*Wait, error) {
	req := probeRequest{Kind: kindWait, Addr: addr, Count: opts.MaxAttempts, Interval: opts.Interval,
		MaxDuration: opts.MaxDuration, Server: opts.Server}
	s, _, err := c.startRepeating(ctx, req, defaultInterval, opts.Timeout)
	if err != nil {
		return nil, err
	}
	return &Wait{s: s}, nil
}

// Result waits until the probe ends by itself (the awaited answer came, or
// a bound was reached) or ctx is done, then returns its result. A result
// with Answered false is not an error.
func (w *Wait) Result(ctx context.Context) (WaitResult, error) {
wait:
	for {
		select {
		case _, ok := <-w.s.msgs:
			if !ok {
				break wait
			}
		case <-ctx.Done():
			break wait
		}
	}
	return w.Stop()
}

// AwaitServer runs a wait probe (StartWait) to its end and returns nil once
// the server opts.Server answered on addr, else an error saying what
// answered instead.
func (c *Client) AwaitServer(ctx context.Context, addr netip.AddrPort, opts WaitOptions) error {
	w, err := c.StartWait(ctx, addr, opts)
	if err != nil {
		return err
	}
	res, err := w.Result(ctx)
	if err != nil {
		return err
	}
	if !res.Answered {
		return fmt.Errorf("%s did not answer on %s from %s within %s: %d attempts, errors %v, other servers %v",
			opts.Server, addr, c.Name, res.Duration.Round(time.Millisecond), res.Attempts, res.Errors, res.Servers)
	}
	return nil
}

// Stop ends the probe after its current attempt and returns its result.
// Stop is idempotent.
func (w *Wait) Stop() (WaitResult, error) {
	err := w.s.stop()
	var res WaitResult
	if f := w.s.final; f != nil && f.Error == "" {
		if derr := json.Unmarshal(f.Result, &res); derr != nil {
			err = errors.Join(err, fmt.Errorf("wait probe from %s to %s: decode result: %w", w.s.client.Name, w.s.req.Addr, derr))
		}
	}
	return res, err
}

// Held is a TCP connection that a probe subprocess holds open, started by
// Hold: the connection opened before a change, such as new backends of a
// Service, which Ping shows to still carry data after it.
type Held struct {
	// First is the result of opening the connection and reading the
	// server's line, as in a TCP probe. A failed connect() shows here, in
	// First.Err, not as an error of Hold.
	First TCPResult
	// Process describes the probe subprocess that holds the connection.
	Process Process

	s      *session
	mu     sync.Mutex // serialises pings: each waits for its own answer
	broken error      // once set, the probe's answers can no longer be matched to pings
}

// Hold starts a probe that connects to addr over TCP, reads the server's
// line and keeps the connection open for Ping until Close, or for at most
// ten minutes. It returns once the connection is made or has failed; it
// returns an error only if the probe itself could not run. The sandbox closes
// the connection on Close if the test does not.
func (c *Client) Hold(ctx context.Context, addr netip.AddrPort) (*Held, error) {
	return c.HoldFrom(ctx, addr, 0)
}

// HoldFrom is Hold from the source port localPort (0: any), bound with
// SO_REUSEADDR, so that connections held at once may share it, each to
// another destination, as a client that binds its port does.
func (c *Client) HoldFrom(ctx context.Context, addr netip.AddrPort, localPort uint16) (*Held, error) {
	s, ready, err := c.startSession(ctx, probeRequest{Kind: kindHold, Addr: addr, Count: 1, MaxDuration: maxDuration, LocalPort: localPort})
	if err != nil {
		return nil, err
	}
	var hc heldConn
	if err := json.Unmarshal(ready.Result, &hc); err != nil {
		return nil, errors.Join(fmt.Errorf("hold probe from %s to %s: decode connection: %w", c.Name, addr, err), s.stop())
	}
	return &Held{First: hc.First, Process: hc.Process, s: s}, nil
}

// Ping sends a line on the held connection and waits for the server to echo
// it, within the client's timeout. It returns nil once the echo is back, else
// an error that names the failure like an errno ("ECONNRESET", "EPIPE",
// "ETIMEDOUT", "EOF" when the server closed, "ENOTCONN" when the connection
// never opened).
func (h *Held) Ping() error {
	_, err := h.ping("")
	return err
}

// Peer pings like Ping and returns what getpeername() says of the held
// socket after it: the address the client sees itself connected to.
func (h *Held) Peer() (netip.AddrPort, error) {
	r, err := h.ping("")
	if err != nil {
		return netip.AddrPort{}, err
	}
	if r.PeerErr != "" {
		return netip.AddrPort{}, fmt.Errorf("getpeername on held connection from %s to %s after a ping: %s", h.s.client.Name, h.s.req.Addr, r.PeerErr)
	}
	return r.Peer, nil
}

// PingSize is Ping with a line of size bytes (at most 65536), echoed whole:
// replies larger than a path's MTU show whether path MTU discovery works
// on the way back.
func (h *Held) PingSize(size int) error {
	_, err := h.ping(strconv.Itoa(size))
	return err
}

// ping sends one ping and returns its result, with the peer the socket
// reported after it.
func (h *Held) ping(req string) (pingResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.broken != nil {
		return pingResult{}, h.broken
	}
	s := h.s
	prefix := fmt.Sprintf("ping on held connection from %s to %s", s.client.Name, s.req.Addr)
	if _, err := io.WriteString(s.stdin, req+"\n"); err != nil {
		return pingResult{}, fmt.Errorf("%s: the probe has ended: %w", prefix, err)
	}
	timeout := time.NewTimer(s.req.Timeout + 10*time.Second)
	defer timeout.Stop()
	select {
	case m, ok := <-s.msgs:
		switch {
		case !ok && s.final != nil && s.final.Error != "":
			h.broken = fmt.Errorf("%s: the probe has ended: %s", prefix, s.final.Error)
		case !ok:
			h.broken = fmt.Errorf("%s: the probe has ended", prefix)
		case m.Ping == nil:
			h.broken = fmt.Errorf("%s: unexpected probe message %+v", prefix, m)
		case !m.Ping.OK:
			return pingResult{}, fmt.Errorf("%s: %s", prefix, m.Ping.Err)
		default:
			return *m.Ping, nil
		}
	case <-timeout.C:
		h.broken = fmt.Errorf("%s: the probe did not answer in time", prefix)
	}
	return pingResult{}, h.broken
}

// Close closes the connection and waits for the probe to exit. Close is
// idempotent.
func (h *Held) Close() error { return h.s.stop() }

// cappedBuffer keeps the first max bytes written to it, so that a chatty
// subprocess cannot grow the test's memory.
type cappedBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
