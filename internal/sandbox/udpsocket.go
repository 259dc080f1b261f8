package sandbox

import (
	"context"
	"net"
	"net/netip"
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
		m, from, err := conn.ReadFromUDPAddrPort(buf)
		r.Elapsed = time.Since(start)
		if err != nil {
			r.Err = errName(err)
			continue
		}
		r.From = from
		if r.Server, r.ClientSeen, err = parseReply(string(buf[:m])); err != nil {
			r.Err = err.Error()
		}
	}
	return out
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
