package sandbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// soOriginalDst is the socket option netfilter answers with a redirected
// connection's destination before the redirect: SO_ORIGINAL_DST at SOL_IP,
// IP6T_SO_ORIGINAL_DST at SOL_IPV6 (both 80).
const soOriginalDst = 80

// RedirectProxy stands for a service mesh's sidecar in a pod: the pod's
// outbound TCP is redirected to it by the pod's own netfilter rules (as
// Istio's init container writes them), and for each connection it reads
// the destination the pod asked for (SO_ORIGINAL_DST), connects there
// itself with its mark set (which the redirect rules let through, as
// Istio's let its proxy's user through) and relays both ways.
type RedirectProxy struct {
	// Port is the port the pod's TCP is redirected to.
	Port uint16
	// Mark is the mark its own connections carry.
	Mark uint32

	host *Host
	lns  []net.Listener
	wg   sync.WaitGroup

	mu        sync.Mutex
	originals []netip.AddrPort
	errs      []error
	conns     map[net.Conn]struct{}
}

// StartRedirectProxy starts a RedirectProxy in h on port, its connections
// marked with mark, and redirects h's outbound TCP to it: every destination
// but loopback and the proxy's own connections, for both families.
func (h *Host) StartRedirectProxy(port uint16, mark uint32) (*RedirectProxy, error) {
	p := &RedirectProxy{Port: port, Mark: mark, host: h, conns: map[net.Conn]struct{}{}}
	for _, network := range []string{"tcp4", "tcp6"} {
		var ln net.Listener
		err := h.NS.Do(func() (err error) {
			ln, err = net.Listen(network, net.JoinHostPort(map[string]string{"tcp4": "0.0.0.0", "tcp6": "::"}[network], strconv.Itoa(int(port))))
			return err
		})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("%s: redirect proxy: listen %s/%d: %w", h.Name, network, port, err), p.Close())
		}
		p.lns = append(p.lns, ln)
		p.wg.Go(func() { p.serve(ln, network == "tcp6") })
	}
	if err := p.redirect(); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

// redirect writes the pod's rules, as a mesh's init container does.
func (p *RedirectProxy) redirect() error {
	for _, fam := range []struct{ tool, loopback string }{{"iptables", "127.0.0.0/8"}, {"ip6tables", "::1/128"}} {
		for _, rule := range [][]string{
			{"-m", "mark", "--mark", strconv.FormatUint(uint64(p.Mark), 10), "-j", "RETURN"},
			{"-d", fam.loopback, "-j", "RETURN"},
			{"-j", "REDIRECT", "--to-ports", strconv.Itoa(int(p.Port))},
		} {
			args := append([]string{"netns", "exec", p.host.NS.Name(), fam.tool, "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp"}, rule...)
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %s %v: %w: %s", p.host.Name, fam.tool, rule, err, out)
			}
		}
	}
	return nil
}

func (p *RedirectProxy) serve(ln net.Listener, v6 bool) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.conns == nil {
			p.mu.Unlock()
			conn.Close()
			return
		}
		p.conns[conn] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.relay(conn.(*net.TCPConn), v6) })
	}
}

// relay serves one redirected connection.
func (p *RedirectProxy) relay(in *net.TCPConn, v6 bool) {
	defer p.untrack(in)
	defer in.Close()
	orig, err := originalDst(in, v6)
	if err != nil {
		p.failed(err)
		return
	}
	p.mu.Lock()
	p.originals = append(p.originals, orig)
	p.mu.Unlock()
	var out net.Conn
	err = p.host.NS.Do(func() (err error) {
		d := net.Dialer{Timeout: defaultTimeout, Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(p.Mark))
			}); err != nil {
				return err
			}
			return serr
		}}
		out, err = d.DialContext(context.Background(), "tcp", orig.String())
		return err
	})
	if err != nil {
		p.failed(fmt.Errorf("redirect proxy: connect to %s: %w", orig, err))
		return
	}
	defer out.Close()
	_ = in.SetDeadline(time.Now().Add(echoLifetime))
	_ = out.SetDeadline(time.Now().Add(echoLifetime))
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(out, in)
		_ = out.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(in, out)
	_ = in.CloseWrite()
	<-done
}

// originalDst reads a redirected connection's destination.
func originalDst(c *net.TCPConn, v6 bool) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var buf [unix.SizeofSockaddrInet6]byte
	var serr error
	size := uint32(len(buf))
	err = rc.Control(func(fd uintptr) {
		level := unix.SOL_IP
		if v6 {
			level = unix.SOL_IPV6
		}
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), soOriginalDst,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			serr = errno
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("redirect proxy: SO_ORIGINAL_DST: %w", err)
	}
	port := binary.BigEndian.Uint16(buf[2:4])
	if v6 {
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])), port), nil
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port), nil
}

func (p *RedirectProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *RedirectProxy) failed(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// Originals returns the destinations the pod asked for, in the order of
// its connections (Failures says which could not be served).
func (p *RedirectProxy) Originals() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]netip.AddrPort(nil), p.originals...)
}

// Failures returns the errors met serving connections, in order.
func (p *RedirectProxy) Failures() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.errs...)
}

// Close stops the proxy and ends its connections (the redirect rules go
// with the pod's namespace).
func (p *RedirectProxy) Close() error {
	var errs []error
	for _, ln := range p.lns {
		errs = append(errs, ln.Close())
	}
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	p.wg.Wait()
	return errors.Join(errs...)
}
