package main

import (
	"context"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// tcpStates names the kernel's TCP states (include/net/tcp_states.h), as
// TCP_INFO reports them.
var tcpStates = [...]string{1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1",
	5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}

// SocketInfo is what the kernel says of a TCP socket whose attempt failed:
// where it was bound and how far the handshake or the exchange got.
type SocketInfo struct {
	// LocalPort is the socket's source port, by which the node's
	// conntrack entries of the attempt are found.
	LocalPort int `json:"local_port"`
	// State is the TCP state at the failure (SYN_SENT: no SYN-ACK came).
	State string `json:"state"`
	// Retransmits is the count of the current segment's retransmissions
	// (SYNs sent again, in SYN_SENT); TotalRetrans counts them all.
	Retransmits  int `json:"retransmits"`
	TotalRetrans int `json:"total_retrans"`
	// LastDataRecvMS is the time since data last came, in milliseconds.
	LastDataRecvMS int `json:"last_data_recv_ms"`
}

func (s *SocketInfo) String() string {
	return fmt.Sprintf("local port %d, %s, %d retransmitted (%d in all), last data %d ms before",
		s.LocalPort, s.State, s.Retransmits, s.TotalRetrans, s.LastDataRecvMS)
}

// socketInfo reads fd's bound port and TCP_INFO; nil if fd is no TCP socket.
func socketInfo(fd int) *SocketInfo {
	ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return nil
	}
	s := &SocketInfo{Retransmits: int(ti.Retransmits), TotalRetrans: int(ti.Total_retrans), LastDataRecvMS: int(ti.Last_data_recv)}
	if int(ti.State) < len(tcpStates) && tcpStates[ti.State] != "" {
		s.State = tcpStates[ti.State]
	} else {
		s.State = fmt.Sprintf("state %d", ti.State)
	}
	// A socket without a name (an error) keeps LocalPort 0.
	sa, _ := unix.Getsockname(fd)
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		s.LocalPort = sa.Port
	case *unix.SockaddrInet6:
		s.LocalPort = sa.Port
	}
	return s
}

// dialKept dials like net.Dialer but keeps a second descriptor of the
// socket, so that when the dial fails (a timeout closes the dialer's own)
// the socket can still be read. The caller closes kept when it is not -1.
func dialKept(ctx context.Context, proto, addr string) (c net.Conn, kept int, err error) {
	kept = -1
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		if kept >= 0 { // another address tried: keep the last socket
			_ = unix.Close(kept)
		}
		var dupErr error
		if err := rc.Control(func(fd uintptr) { kept, dupErr = unix.Dup(int(fd)) }); err != nil {
			return err
		}
		if dupErr != nil {
			kept = -1
		}
		return nil
	}}
	c, err = d.DialContext(ctx, proto, addr)
	return c, kept, err
}
