package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SCTP needs the kernel's sctp module, which some kernels lack (this
// machine's, not the VM runner's guests'): a test of SCTP traffic runs where
// RequireSCTP passes, and fails where it does not.

// SCTPAvailable reports why the kernel cannot open an SCTP socket in the
// namespace at h, or nil where it can.
func (h *Host) SCTPAvailable() error {
	return h.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return fmt.Errorf("SCTP socket: %w (no sctp module?)", err)
		}
		return unix.Close(fd)
	})
}

// StartSCTPServer starts an SCTP server (one-to-one style, SOCK_STREAM) on
// port on all of the host's addresses, IPv4 and IPv6. It answers each
// association as the TCP server answers a connection: its line, then an
// echo of each line the client sends.
func (h *Host) StartSCTPServer(port uint16) (*Server, error) {
	return h.StartSCTPServerNamed(port, h.Name)
}

// StartSCTPServerNamed is StartSCTPServer answering as name, as
// StartTCPServerNamed does.
func (h *Host) StartSCTPServerNamed(port uint16, name string) (*Server, error) {
	if err := checkServerName(name); err != nil {
		return nil, err
	}
	var ln net.Listener
	err := h.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return os.NewSyscallError("socket", err)
		}
		f := os.NewFile(uintptr(fd), fmt.Sprintf("sctp listener :%d", port))
		defer f.Close()
		for _, o := range []struct{ level, opt int }{{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY}, {unix.SOL_SOCKET, unix.SO_REUSEADDR}} {
			v := 0
			if o.opt == unix.SO_REUSEADDR {
				v = 1
			}
			if err := unix.SetsockoptInt(fd, o.level, o.opt, v); err != nil {
				return os.NewSyscallError("setsockopt", err)
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrInet6{Port: int(port)}); err != nil {
			return os.NewSyscallError("bind", err)
		}
		if err := unix.Listen(fd, 128); err != nil {
			return os.NewSyscallError("listen", err)
		}
		// The runtime takes a stream socket of an IP family for TCP:
		// accept, read, write and deadlines are the same calls.
		ln, err = net.FileListener(f)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listen sctp/%d: %w", h.Name, port, err)
	}
	return h.addServer(h.serveStream("sctp", ln, name))
}

// SCTP makes n associations to addr, one after the other, each reading the
// server's line, as TCP does for connections. A failed connect() reports
// its errno; the kernel's SCTP gives up on an unanswered INIT only after
// its retransmissions, so the probe's timeout ends the attempt first.
func (c *Client) SCTP(ctx context.Context, addr netip.AddrPort, n int) (Report[TCPResult], error) {
	var rep Report[TCPResult]
	err := c.run(ctx, probeRequest{Kind: kindSCTP, Addr: addr, Count: n}, &rep)
	return rep, err
}

// sctpAttempt is one association to addr within timeout.
func sctpAttempt(addr netip.AddrPort, timeout time.Duration) TCPResult {
	var r TCPResult
	start := time.Now()
	conn, err := sctpDial(addr, timeout)
	r.Elapsed = time.Since(start)
	if err != nil {
		r.Err = errName(err)
		return r
	}
	defer conn.Close()
	r.Connected = true
	if r.Local, r.Peer, err = sockNames(conn.(syscall.Conn)); err != nil {
		r.Err = errName(err)
		return r
	}
	_ = conn.SetDeadline(start.Add(timeout))
	buf := make([]byte, maxReply)
	k, err := conn.Read(buf)
	if err != nil {
		r.Err = errName(err)
		return r
	}
	line, _, _ := strings.Cut(string(buf[:k]), "\n")
	if r.Server, r.ClientSeen, err = parseReply(line + "\n"); err != nil {
		r.Err = err.Error()
	}
	return r
}

// sctpDial opens an SCTP association to addr (its family's socket; an
// IPv4-mapped address through an IPv6 one), connect() bounded by timeout.
func sctpDial(addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}
	if addr.Addr().Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("setsockopt SO_SNDTIMEO", err)
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		if err == unix.EINPROGRESS || err == unix.EAGAIN {
			err = unix.ETIMEDOUT
		}
		return nil, os.NewSyscallError("connect", err)
	}
	f := os.NewFile(uintptr(fd), "sctp "+addr.String())
	defer f.Close()
	return net.FileConn(f)
}
