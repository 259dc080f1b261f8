package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

// Bounds of a UDP stream probe.
const (
	// defaultQueryInterval is a resolver's steady query rate in tests.
	defaultQueryInterval = 100 * time.Millisecond
	// maxStreamAddrs bounds the addresses a stream cycles through.
	maxStreamAddrs = 16
	// maxQueryTries bounds the sockets one query may go through: the first
	// and two reconnects after send or receive errors.
	maxQueryTries = 3
	// streamQueue is how many finished queries a UDPStream holds for Next;
	// beyond that the probe waits until the test reads them.
	streamQueue = 4096
)

// UDPStreamOptions bound a UDP stream (Client.StartUDPStream). Zero fields
// take the defaults.
type UDPStreamOptions struct {
	// Interval is the pause between queries (default 100ms).
	Interval time.Duration
	// Timeout is how long each query waits for its answer (default: the
	// client's timeout, 2s unless set with WithTimeout).
	Timeout time.Duration
	// MaxQueries ends the stream after that many queries (default 100000).
	MaxQueries int
	// MaxDuration ends the stream after that long (default 2m, at most
	// 10m).
	MaxDuration time.Duration
}

// UDPQuery is one query of a UDP stream: a datagram sent on the stream's
// connected socket and the answer to it.
type UDPQuery struct {
	// Seq numbers the stream's queries from 1.
	Seq int `json:"seq"`
	// Sent is the probe's wall-clock time when the query was first sent,
	// to compare with the test's own clock.
	Sent time.Time `json:"sent"`
	// Answered is the probe's wall-clock time when the answer was read;
	// zero if none came.
	Answered time.Time `json:"answered"`
	// Server is the host name the server reported.
	Server string `json:"server,omitempty"`
	// Peer is what getpeername() returned for the socket that got the
	// answer (or failed last).
	Peer netip.AddrPort `json:"peer"`
	// Local is what getsockname() returned for that socket.
	Local netip.AddrPort `json:"local"`
	// Cookie is that socket's cookie (SO_COOKIE).
	Cookie uint64 `json:"cookie,omitempty"`
	// Retries are the errno names of the send, receive or connect errors
	// that made the probe give up a socket and send the query again on a
	// new one, in order.
	Retries []string `json:"retries,omitempty"`
	// Err is empty if the query was answered, else the errno name of its
	// last failure ("ETIMEDOUT" when no answer came in time).
	Err string `json:"err,omitempty"`
}

// UDPStreamResult sums up a UDP stream.
type UDPStreamResult struct {
	// Process describes the probe subprocess.
	Process Process `json:"process"`
	// Queries counts the queries sent.
	Queries int `json:"queries"`
	// Failures counts the queries that got no answer.
	Failures int `json:"failures"`
	// Errors counts socket errors by errno name, those that led to a retry
	// included.
	Errors map[string]int `json:"errors"`
	// Servers counts answers by server name.
	Servers map[string]int `json:"servers"`
	// Sockets counts the sockets the stream connected.
	Sockets int `json:"sockets"`
	// Duration is how long the stream ran.
	Duration time.Duration `json:"duration"`
}

// udpStreamReady is a UDP stream probe's Ready result.
type udpStreamReady struct {
	Process Process  `json:"process"`
	First   UDPQuery `json:"first"`
}

// UDPStream is a long-lived connected UDP client started by StartUDPStream.
type UDPStream struct {
	// First is the stream's first query, finished before StartUDPStream
	// returned.
	First UDPQuery
	// Process describes the probe subprocess.
	Process Process

	s        *session
	queries  chan UDPQuery
	done     chan struct{}
	doneOnce sync.Once
}

// StartUDPStream starts a long-lived UDP client of the kind DNS resolvers
// are (glibc's, c-ares in Envoy): it connects one UDP socket to addrs[0] and
// sends a query on it every opts.Interval, waiting opts.Timeout for each
// answer. A send, receive or connect error, such as the ECONNABORTED or
// EDESTADDRREQ of a socket destroyed under it, makes it close the socket,
// connect a new one and send the query again at once (at most three sockets
// per query). Each new socket connects to the next address of addrs in turn,
// as a resolver moves to its next name server; with a single address, a
// Service's, connect() lets the load balancer choose again. An IPv4-mapped
// address is reached from an AF_INET6 socket, as a dual-stack client's. A missing answer
// is not an error: like the resolvers of kubernetes#125467 the client keeps
// its socket, and keeps sending to a backend that is gone.
//
// It returns once the first query is answered or has failed; Next reports
// the queries that follow. The sandbox stops the stream on Close if the test
// does not.
func (c *Client) StartUDPStream(ctx context.Context, addrs []netip.AddrPort, opts UDPStreamOptions) (*UDPStream, error) {
	if err := validateStreamAddrs(netip.AddrPort{}, addrs); err != nil {
		return nil, fmt.Errorf("udp stream probe from %s: %w", c.Name, err)
	}
	req := probeRequest{Kind: kindUDPStream, Addr: addrs[0], Addrs: addrs, Count: opts.MaxQueries,
		Interval: opts.Interval, MaxDuration: opts.MaxDuration}
	s, ready, err := c.startRepeating(ctx, req, defaultQueryInterval, opts.Timeout)
	if err != nil {
		return nil, err
	}
	var r udpStreamReady
	if err := json.Unmarshal(ready.Result, &r); err != nil {
		return nil, errors.Join(fmt.Errorf("udp stream probe from %s: decode first query: %w", c.Name, err), s.stop())
	}
	st := &UDPStream{First: r.First, Process: r.Process, s: s,
		queries: make(chan UDPQuery, streamQueue), done: make(chan struct{})}
	go st.collect()
	return st, nil
}

// collect moves the probe's queries to st.queries until the probe ends or
// Stop is called; while the queue is full the probe's output, and so the
// probe, waits.
func (st *UDPStream) collect() {
	defer close(st.queries)
	for m := range st.s.msgs {
		if m.Query == nil {
			continue
		}
		select {
		case st.queries <- *m.Query:
		case <-st.done:
			return
		}
	}
}

// Next returns the stream's next finished query, in order, waiting until it
// finishes. It returns an error once the stream has ended: at once after
// Stop (whose queries not yet read are dropped), and after the last query
// once a bound was reached. It also returns an error when ctx is done.
func (st *UDPStream) Next(ctx context.Context) (UDPQuery, error) {
	ended := fmt.Errorf("udp stream from %s to %s has ended", st.s.client.Name, st.s.req.Addr)
	// The queue may still hold queries when Stop is called; a select
	// between it and st.done would pick either, so Stop is looked at first.
	select {
	case <-st.done:
		return UDPQuery{}, ended
	default:
	}
	select {
	case q, ok := <-st.queries:
		if !ok {
			return UDPQuery{}, ended
		}
		return q, nil
	case <-st.done:
		return UDPQuery{}, ended
	case <-ctx.Done():
		return UDPQuery{}, fmt.Errorf("udp stream from %s to %s: %w", st.s.client.Name, st.s.req.Addr, ctx.Err())
	}
}

// Stop ends the stream after its current query and returns its summary.
// Queries not yet read with Next are dropped. Stop is idempotent.
func (st *UDPStream) Stop() (UDPStreamResult, error) {
	st.doneOnce.Do(func() { close(st.done) })
	err := st.s.stop()
	var res UDPStreamResult
	if f := st.s.final; f != nil && f.Error == "" {
		if derr := json.Unmarshal(f.Result, &res); derr != nil {
			err = errors.Join(err, fmt.Errorf("udp stream probe from %s to %s: decode result: %w", st.s.client.Name, st.s.req.Addr, derr))
		}
	}
	return res, err
}

// validateStreamAddrs checks a UDP stream's addresses; first, if valid, must
// be the first of them.
func validateStreamAddrs(first netip.AddrPort, addrs []netip.AddrPort) error {
	if len(addrs) == 0 || len(addrs) > maxStreamAddrs {
		return fmt.Errorf("udp stream has %d addresses, want 1 to %d", len(addrs), maxStreamAddrs)
	}
	for _, a := range addrs {
		if !a.IsValid() || a.Port() == 0 {
			return fmt.Errorf("probe address %q is not ip:port", a)
		}
	}
	if first.IsValid() && first != addrs[0] {
		return fmt.Errorf("udp stream address %s is not its first address %s", first, addrs[0])
	}
	return nil
}

// udpStream runs a UDP stream probe until stdin is closed or a bound is
// reached.
func udpStream(req probeRequest, proc Process, stdin io.Reader, emit func(probeMessage) error) (UDPStreamResult, error) {
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(stop)
	}()
	res := UDPStreamResult{Process: proc, Errors: map[string]int{}, Servers: map[string]int{}}
	rs := &resolverSocket{addrs: req.Addrs, timeout: req.Timeout}
	defer rs.close()
	start := time.Now()
	deadline := start.Add(req.MaxDuration)
	for res.Queries < req.Count && time.Now().Before(deadline) {
		res.Queries++
		q := rs.query(res.Queries)
		for _, e := range q.Retries {
			res.Errors[e]++
		}
		if q.Err != "" {
			res.Failures++
			res.Errors[q.Err]++
		} else {
			res.Servers[q.Server]++
		}
		if res.Queries == 1 {
			first, err := json.Marshal(udpStreamReady{Process: proc, First: q})
			if err != nil {
				return res, fmt.Errorf("encode first query: %w", err)
			}
			if err := emit(probeMessage{Ready: true, Result: first}); err != nil {
				return res, fmt.Errorf("report udp stream start: %w", err)
			}
		} else if err := emit(probeMessage{Query: &q}); err != nil {
			return res, fmt.Errorf("report query %d: %w", q.Seq, err)
		}
		if stopped(stop, req.Interval) {
			break
		}
	}
	res.Sockets = rs.sockets
	res.Duration = time.Since(start)
	return res, nil
}

// resolverSocket is the connected UDP socket of a UDP stream, replaced after
// an error the way resolvers replace theirs.
type resolverSocket struct {
	addrs   []netip.AddrPort
	timeout time.Duration

	conn    *net.UDPConn
	next    int // index in addrs of the next connect
	sockets int
	cookie  uint64
	local   netip.AddrPort
	peer    netip.AddrPort
}

// query sends query seq and reads its answer, replacing the socket after an
// error and trying again, at most maxQueryTries times in all.
func (rs *resolverSocket) query(seq int) UDPQuery {
	q := UDPQuery{Seq: seq, Sent: time.Now()}
	buf := make([]byte, maxReply)
	for try := 1; ; try++ {
		err := rs.exchange(seq, buf, &q)
		if err == nil {
			q.Answered = time.Now()
			return q
		}
		q.Err = errName(err)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// No answer in time: the socket stays, as in resolvers.
			return q
		}
		rs.close()
		if try == maxQueryTries {
			return q
		}
		q.Retries = append(q.Retries, q.Err)
		q.Err = ""
	}
}

// exchange sends one datagram on the current socket, connecting one first
// if there is none, and reads the answer into q.
func (rs *resolverSocket) exchange(seq int, buf []byte, q *UDPQuery) error {
	if rs.conn == nil {
		if err := rs.connect(); err != nil {
			return err
		}
	}
	q.Cookie, q.Local, q.Peer = rs.cookie, rs.local, rs.peer
	_ = rs.conn.SetDeadline(time.Now().Add(rs.timeout))
	if _, err := fmt.Fprintf(rs.conn, "query %d\n", seq); err != nil {
		return err
	}
	n, err := rs.conn.Read(buf)
	if err != nil {
		return err
	}
	q.Server, _, err = parseReply(string(buf[:n]))
	return err
}

// connect connects a new socket to the next address.
func (rs *resolverSocket) connect() error {
	addr := rs.addrs[rs.next%len(rs.addrs)]
	rs.next++
	conn, err := dialUDP(addr)
	if err != nil {
		return err
	}
	rs.sockets++
	local, peer, err := sockNames(conn)
	if err != nil {
		conn.Close()
		return err
	}
	cookie, err := socketCookie(conn)
	if err != nil {
		conn.Close()
		return err
	}
	rs.conn, rs.cookie, rs.local, rs.peer = conn, cookie, local, peer
	return nil
}

func (rs *resolverSocket) close() {
	if rs.conn != nil {
		rs.conn.Close()
		rs.conn = nil
	}
}
