package sandbox

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The probes reach an IPv4-mapped address (::ffff:a.b.c.d) from an AF_INET6
// socket, as dual-stack clients (Java's, for one) reach IPv4 hosts: Go's
// net package would dial it from an AF_INET socket instead, which the
// AF_INET6 cgroup hooks never see.

// mappedSocket returns an AF_INET6 socket of type typ (SOCK_STREAM or
// SOCK_DGRAM) that takes IPv4-mapped addresses, connected to addr when
// connect is set, as a net.Conn (a *net.TCPConn or *net.UDPConn). A connect
// gives up after timeout with ETIMEDOUT.
func mappedSocket(typ int, addr netip.AddrPort, connect bool, timeout time.Duration) (net.Conn, error) {
	if !addr.Addr().Is4In6() {
		return nil, fmt.Errorf("%s is not an IPv4-mapped address", addr)
	}
	fd, err := unix.Socket(unix.AF_INET6, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	fail := func(call string, err error) (net.Conn, error) {
		unix.Close(fd)
		if err == unix.EINPROGRESS || err == unix.EAGAIN {
			// A blocking connect that SO_SNDTIMEO ended.
			err = unix.ETIMEDOUT
		}
		return nil, os.NewSyscallError(call, err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
		return fail("setsockopt IPV6_V6ONLY", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return fail("setsockopt SO_SNDTIMEO", err)
	}
	if connect {
		if err := unix.Connect(fd, &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}); err != nil {
			return fail("connect", err)
		}
	}
	f := os.NewFile(uintptr(fd), "mapped "+addr.String())
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("socket for %s: %w", addr, err)
	}
	return conn, nil
}

// dialUDP returns a UDP socket connected to addr: an AF_INET6 one for an
// IPv4-mapped address, as a dual-stack client's, else one of addr's family.
func dialUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	if !addr.Addr().Is4In6() {
		return net.DialUDP(network("udp", addr), nil, net.UDPAddrFromAddrPort(addr))
	}
	// connect() on UDP sends nothing and does not block.
	c, err := mappedSocket(unix.SOCK_DGRAM, addr, true, time.Second)
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}
