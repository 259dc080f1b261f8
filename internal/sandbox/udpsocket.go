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
