package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// UDPOneSocket sends n datagrams to addr from a single unconnected socket
// with sendto(), receiving each reply with recvfrom(): one UDP flow, as a
// statsd or syslog client makes. An IPv4-mapped addr is reached from an
// AF_INET6 socket.
func (c *Client) UDPOneSocket(ctx context.Context, addr netip.AddrPort, n int) (Report[UDPResult], error) {
	var rep Report[UDPResult]
	err := c.run(ctx, probeRequest{Kind: kindUDP, Addr: addr, Count: n, OneSocket: true}, &rep)
	return rep, err
}

func udpOneSocket(addr netip.AddrPort, n int, timeout time.Duration) []UDPResult {
	out := make([]UDPResult, n)
	var conn *net.UDPConn
	var err error
	if addr.Addr().Is4In6() {
		var c net.Conn
		if c, err = mappedSocket(unix.SOCK_DGRAM, addr, false, timeout); err == nil {
			conn = c.(*net.UDPConn)
		}
	} else {
		conn, err = net.ListenUDP(network("udp", addr), nil)
	}
	if err != nil {
		for i := range out {
			out[i].Err = errName(err)
		}
		return out
	}
	defer conn.Close()
	buf := make([]byte, maxReply)
	for i := range out {
		r := &out[i]
		_ = conn.SetDeadline(time.Now().Add(timeout))
		start := time.Now()
		if _, err := conn.WriteToUDPAddrPort([]byte("ping\n"), addr); err != nil {
			r.Err = errName(err)
			continue
		}
		r.Local, _, _ = sockNames(conn)
		readReply(conn, buf, start, r)
	}
	return out
}

// readReply reads into r the reply to a datagram conn sent at start: its
// source, the time it took and what the server reported. It reports
// whether a reply came that the server could be read from.
func readReply(conn *net.UDPConn, buf []byte, start time.Time, r *UDPResult) bool {
	n, from, err := conn.ReadFromUDPAddrPort(buf)
	r.Elapsed = time.Since(start)
	if err != nil {
		r.Err = errName(err)
		return false
	}
	r.From = from
	if r.Server, r.ClientSeen, err = parseReply(string(buf[:n])); err != nil {
		r.Err = err.Error()
		return false
	}
	return true
}

// ConnectsResult is what a UDPConnects probe did.
type ConnectsResult struct {
	Process Process `json:"process"`
	// Connects is how many connect() calls returned without error, of
	// the n asked for; Err names the first error, if any.
	Connects int    `json:"connects"`
	Err      string `json:"err,omitempty"`
	// Elapsed is the time the calls took together.
	Elapsed time.Duration `json:"elapsed"`
}

// UDPConnects calls connect() n times (at most 1,000,000) on one UDP socket
// to addr and sends nothing: each call runs the connect hooks of the
// socket's cgroup, back to back, without any packet. It measures what the
// hooks cost when their data is in the caches, beside what a connection's
// other work leaves them.
func (c *Client) UDPConnects(ctx context.Context, addr netip.AddrPort, n int) (ConnectsResult, error) {
	var res ConnectsResult
	err := c.run(ctx, probeRequest{Kind: kindConnects, Addr: addr, Count: n}, &res)
	return res, err
}

func udpConnects(addr netip.AddrPort, n int) ConnectsResult {
	var res ConnectsResult
	domain := unix.AF_INET
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		domain = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}
	}
	fd, err := unix.Socket(domain, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		res.Err = errName(err)
		return res
	}
	defer unix.Close(fd)
	start := time.Now()
	for range n {
		if err := unix.Connect(fd, sa); err != nil {
			res.Err = errName(err)
			break
		}
		res.Connects++
	}
	res.Elapsed = time.Since(start)
	return res
}

// UDPReconnects exchanges one datagram with each of addrs in turn on a
// single UDP socket, connecting it to each first: a client that keeps its
// socket and connect()s it elsewhere, to a ClusterIP and then straight to
// a pod, say. Each result has the socket's getpeername() after its
// exchange. The addresses must all be of one kind: IPv4, IPv6, or
// IPv4-mapped (reached from an AF_INET6 socket).
func (c *Client) UDPReconnects(ctx context.Context, addrs []netip.AddrPort) (Report[UDPResult], error) {
	var rep Report[UDPResult]
	if len(addrs) == 0 {
		return rep, errors.New("udp reconnects: no address")
	}
	err := c.run(ctx, probeRequest{Kind: kindUDP, Addr: addrs[0], Addrs: addrs, Count: len(addrs), OneSocket: true, Connected: true}, &rep)
	return rep, err
}

// validateReconnects checks a UDPReconnects request: its addresses, all of
// the first one's kind, and one exchange each.
func validateReconnects(r *probeRequest) error {
	if err := validateStreamAddrs(r.Addr, r.Addrs); err != nil {
		return err
	}
	kind := func(a netip.AddrPort) string { return network("udp", a) + fmt.Sprint(a.Addr().Is4In6()) }
	for _, a := range r.Addrs {
		if kind(a) != kind(r.Addrs[0]) {
			return fmt.Errorf("udp reconnects: %s is not of the same family as %s", a, r.Addrs[0])
		}
	}
	if r.Count != len(r.Addrs) {
		return fmt.Errorf("udp reconnects: count %d, want one per address (%d)", r.Count, len(r.Addrs))
	}
	return nil
}

func udpReconnects(addrs []netip.AddrPort, timeout time.Duration) []UDPResult {
	out := make([]UDPResult, len(addrs))
	fail := func(from int, err error) []UDPResult {
		for i := from; i < len(out); i++ {
			out[i].Err = errName(err)
		}
		return out
	}
	var conn *net.UDPConn
	var err error
	if addrs[0].Addr().Is4In6() {
		var c net.Conn
		if c, err = mappedSocket(unix.SOCK_DGRAM, addrs[0], false, timeout); err == nil {
			conn = c.(*net.UDPConn)
		}
	} else {
		conn, err = net.ListenUDP(network("udp", addrs[0]), nil)
	}
	if err != nil {
		return fail(0, err)
	}
	defer conn.Close()
	raw, err := conn.SyscallConn()
	if err != nil {
		return fail(0, err)
	}
	buf := make([]byte, maxReply)
	for i, addr := range addrs {
		r := &out[i]
		var sa unix.Sockaddr
		if addr.Addr().Is6() {
			sa = &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}
		} else {
			sa = &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
		}
		var cerr error
		if err := raw.Control(func(fd uintptr) { cerr = unix.Connect(int(fd), sa) }); err != nil {
			cerr = err
		}
		if cerr != nil {
			r.Err = errName(os.NewSyscallError("connect", cerr))
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(timeout))
		start := time.Now()
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			r.Err = errName(err)
			continue
		}
		if !readReply(conn, buf, start, r) {
			continue
		}
		var err error
		if r.Local, r.Peer, err = sockNames(conn); err != nil {
			r.Err = errName(err)
		}
	}
	return out
}
