package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The NodePort benchmark's load generator and server run as children of the
// test binary (re-executed with rpsRoleEnv set), each born in its own
// namespace: the client in the external client's, the server in the pod's.
// A whole process in one namespace can use every thread for sockets, and
// the test process, which runs the proxies' bookkeeping, stays out of the
// measurement.
//
// Both use blocking system calls on raw sockets, a thread per connection:
// Go's net package would add, per new connection, an epoll registration,
// a non-blocking connect, a wake-up and four more system calls, which on
// two cores would weigh as much as the proxy path being measured.
const (
	rpsRoleEnv   = "EBPF_PROXY_RPS_ROLE"
	rpsConfigEnv = "EBPF_PROXY_RPS_CONFIG"
	roleClient   = "client"
	roleServer   = "server"
)

// Message sizes: a small request and a small answer, as in an RPC or a
// health check; both fit one segment.
const (
	rpsRequestSize  = 32
	rpsResponseSize = 64
)

// rpsServerReady is the line the server writes once it listens.
const rpsServerReady = "ready"

// rpsServerConfig configures the server child.
type rpsServerConfig struct {
	Port uint16
	// Name starts every answer, so that the client knows which pod served.
	Name string
	// Threads accept and serve connections, one at a time each; more than
	// the client's workers, so that a persistent connection never keeps a
	// new one waiting.
	Threads int
}

// rpsClientConfig configures the client child.
type rpsClientConfig struct {
	Target netip.AddrPort
	// Expect is the answer every request must get: the pod's name and the
	// address the pod saw the client at (the node's, after SNAT).
	Expect  string
	Workers int
	// ReadyBound bounds the wait for the first answer.
	ReadyBound time.Duration
	// Warmup runs before each phase is counted.
	Warmup   time.Duration
	Duration time.Duration
	// IOTimeout bounds each connect, read and write.
	IOTimeout time.Duration
}

// Modes of the client's phases.
const (
	modeNewConn    = "new-conn"
	modePersistent = "persistent"
)

// rpsPhase is what the client counted in one phase.
type rpsPhase struct {
	Mode     string
	Requests uint64
	// Errors counts failed requests by cause: the step ("connect",
	// "write", "read") and what failed (an errno name, "timeout",
	// "closed"), or "wrong answer".
	Errors  map[string]uint64
	Seconds float64
}

// ErrorCount is the number of failed requests.
func (p rpsPhase) ErrorCount() uint64 {
	var n uint64
	for _, c := range p.Errors {
		n += c
	}
	return n
}

// PerSecond is the rate of answered requests.
func (p rpsPhase) PerSecond() float64 {
	if p.Seconds <= 0 {
		return 0
	}
	return float64(p.Requests) / p.Seconds
}

// rpsClientResult is the client's report, its only output.
type rpsClientResult struct {
	// ReadyAfter is how long the first answer took to come.
	ReadyAfter time.Duration
	// ReadyErrors are the causes of the failed attempts before it.
	ReadyErrors map[string]uint64
	Phases      []rpsPhase
	Error       string
}

// rpsResponse is the server's answer to a client at peer: the server's name
// and the peer's address, padded to rpsResponseSize.
func rpsResponse(name string, peer netip.Addr) []byte {
	b := bytes.Repeat([]byte{'.'}, rpsResponseSize)
	copy(b, name+" "+peer.String()+" ")
	b[len(b)-1] = '\n'
	return b
}

// rpsRequest is every request's content.
var rpsRequest = func() []byte {
	b := bytes.Repeat([]byte{'r'}, rpsRequestSize)
	b[len(b)-1] = '\n'
	return b
}()

// runRPSChild runs the server or the client and exits if this process was
// started as one; otherwise it returns at once.
func runRPSChild() {
	role, ok := os.LookupEnv(rpsRoleEnv)
	if !ok {
		return
	}
	cfg := os.Getenv(rpsConfigEnv)
	var err error
	switch role {
	case roleServer:
		err = rpsServe(cfg, os.Stdout)
	case roleClient:
		err = rpsClient(cfg, os.Stdout)
	default:
		err = fmt.Errorf("unknown %s %q", rpsRoleEnv, role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rps %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// rpsServe listens on the port of the namespace it was born in and answers
// every request until it is killed.
func rpsServe(body string, out io.Writer) error {
	var cfg rpsServerConfig
	if err := json.Unmarshal([]byte(body), &cfg); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	if cfg.Threads < 1 || cfg.Threads > 1000 || cfg.Name == "" || cfg.Port == 0 {
		return fmt.Errorf("invalid server config %+v", cfg)
	}
	// A P for every thread that may leave a blocking call at once: with
	// fewer, the runtime hands Ps between threads on every call.
	runtime.GOMAXPROCS(cfg.Threads + 2)
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	if err := unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fmt.Errorf("SO_REUSEADDR: %w", err)
	}
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: int(cfg.Port)}); err != nil {
		return fmt.Errorf("bind port %d: %w", cfg.Port, err)
	}
	if err := unix.Listen(lfd, 4096); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if _, err := fmt.Fprintln(out, rpsServerReady); err != nil {
		return err
	}
	errc := make(chan error, cfg.Threads)
	for range cfg.Threads {
		go func() {
			runtime.LockOSThread()
			errc <- rpsAcceptLoop(lfd, cfg.Name)
		}()
	}
	return <-errc
}

// rpsAcceptLoop serves one connection after the other until accept fails
// for good.
func rpsAcceptLoop(lfd int, name string) error {
	req := make([]byte, rpsRequestSize)
	for {
		fd, sa, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		switch {
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.ECONNABORTED):
			continue
		case err != nil:
			return fmt.Errorf("accept: %w", err)
		}
		var peer netip.Addr
		if in4, ok := sa.(*unix.SockaddrInet4); ok {
			peer = netip.AddrFrom4(in4.Addr)
		}
		resp := rpsResponse(name, peer)
		// A client that neither talks nor closes cannot hold the thread.
		if err := setTimeouts(fd, 10*time.Second); err == nil {
			_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
			for readFull(fd, req) == nil && writeAll(fd, resp) == nil {
			}
		}
		unix.Close(fd)
	}
}

// rpsClient waits for the first answer, then runs the persistent and the
// new-connection phase, and writes its result as JSON.
func rpsClient(body string, out io.Writer) error {
	var cfg rpsClientConfig
	if err := json.Unmarshal([]byte(body), &cfg); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	if !cfg.Target.IsValid() || !cfg.Target.Addr().Is4() || cfg.Workers < 1 || cfg.Workers > 256 || cfg.Duration <= 0 ||
		cfg.Duration > 10*time.Minute || cfg.Warmup < 0 || cfg.ReadyBound <= 0 || cfg.IOTimeout <= 0 {
		return fmt.Errorf("invalid client config %+v", cfg)
	}
	runtime.GOMAXPROCS(cfg.Workers + 2)
	c := &rpsLoad{cfg: cfg, sa: &unix.SockaddrInet4{Port: int(cfg.Target.Port()), Addr: cfg.Target.Addr().As4()}, expect: []byte(cfg.Expect)}
	res := rpsClientResult{ReadyErrors: map[string]uint64{}}
	start := time.Now()
	for {
		cause := c.oneConn(make([]byte, rpsResponseSize))
		if cause == "" {
			res.ReadyAfter = time.Since(start)
			break
		}
		res.ReadyErrors[cause]++
		if time.Since(start) > cfg.ReadyBound {
			res.Error = fmt.Sprintf("no answer from %s within %s", cfg.Target, cfg.ReadyBound)
			return json.NewEncoder(out).Encode(res)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Persistent connections first: the new-connection phase leaves a
	// proxy's flow tables full of closing flows, which would tax the
	// persistent phase's connects and not the other way round.
	res.Phases = append(res.Phases, c.phase(modePersistent), c.phase(modeNewConn))
	return json.NewEncoder(out).Encode(res)
}

// rpsLoad is the client's load generator.
type rpsLoad struct {
	cfg    rpsClientConfig
	sa     *unix.SockaddrInet4
	expect []byte
}

// phase runs cfg.Workers workers in mode for the warmup and then the
// measured duration, and counts the requests that ended within the latter.
func (c *rpsLoad) phase(mode string) rpsPhase {
	from := time.Now().Add(c.cfg.Warmup)
	to := from.Add(c.cfg.Duration)
	var mu sync.Mutex
	total := rpsPhase{Mode: mode, Errors: map[string]uint64{}, Seconds: c.cfg.Duration.Seconds()}
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			runtime.LockOSThread()
			p := c.work(mode, from, to)
			mu.Lock()
			defer mu.Unlock()
			total.Requests += p.Requests
			for k, v := range p.Errors {
				total.Errors[k] += v
			}
		})
	}
	wg.Wait()
	return total
}

// work is one worker's loop; it ends at to, so it is bounded.
func (c *rpsLoad) work(mode string, from, to time.Time) rpsPhase {
	p := rpsPhase{Errors: map[string]uint64{}}
	resp := make([]byte, rpsResponseSize)
	count := func(cause string) {
		now := time.Now()
		if now.Before(from) || !now.Before(to) {
			return
		}
		if cause == "" {
			p.Requests++
		} else {
			p.Errors[cause]++
		}
	}
	if mode == modeNewConn {
		for time.Now().Before(to) {
			count(c.oneConn(resp))
		}
		return p
	}
	fd := -1
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	for time.Now().Before(to) {
		if fd < 0 {
			var err error
			if fd, err = c.dial(); err != nil {
				count("connect " + cause(err))
				// A refusal comes back at once: pace the retries.
				time.Sleep(time.Millisecond)
				continue
			}
		}
		if cause := c.exchange(fd, resp); cause != "" {
			count(cause)
			unix.Close(fd)
			fd = -1
			continue
		}
		count("")
	}
	return p
}

// oneConn connects, sends one request, reads the answer and closes (the
// client first, so TIME_WAIT stays with the client); it returns the cause
// of a failure or "".
func (c *rpsLoad) oneConn(resp []byte) string {
	fd, err := c.dial()
	if err != nil {
		return "connect " + cause(err)
	}
	defer unix.Close(fd)
	return c.exchange(fd, resp)
}

func (c *rpsLoad) exchange(fd int, resp []byte) string {
	if err := writeAll(fd, rpsRequest); err != nil {
		return "write " + cause(err)
	}
	if err := readFull(fd, resp); err != nil {
		return "read " + cause(err)
	}
	if !bytes.Equal(resp, c.expect) {
		return "wrong answer"
	}
	return ""
}

// dial returns a socket connected to the target, with I/O timeouts set.
func (c *rpsLoad) dial() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := setTimeouts(fd, c.cfg.IOTimeout); err != nil {
		unix.Close(fd)
		return -1, err
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if err := unix.Connect(fd, c.sa); err != nil {
		if errors.Is(err, unix.EINTR) {
			// The handshake goes on; wait for it like a non-blocking
			// connect would.
			err = awaitConnect(fd, c.cfg.IOTimeout)
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// awaitConnect waits for an interrupted connect to finish.
func awaitConnect(fd int, timeout time.Duration) error {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.ETIMEDOUT
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
	}
}

func setTimeouts(fd int, d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
}

// errClosed is a connection the peer closed before the whole answer.
var errClosed = errors.New("closed")

func readFull(fd int, b []byte) error {
	for n := 0; n < len(b); {
		k, err := unix.Read(fd, b[n:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case k == 0:
			return errClosed
		}
		n += k
	}
	return nil
}

func writeAll(fd int, b []byte) error {
	for n := 0; n < len(b); {
		k, err := unix.Write(fd, b[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		n += k
	}
	return nil
}

// cause names a failure for the report. A socket timeout shows as EAGAIN
// on a read or write and as EINPROGRESS on a connect.
func cause(err error) string {
	var errno unix.Errno
	switch {
	case errors.Is(err, errClosed):
		return "closed"
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINPROGRESS), errors.Is(err, unix.ETIMEDOUT):
		return "timeout"
	case errors.As(err, &errno):
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}
