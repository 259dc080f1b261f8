package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"
)

// serverHold bounds how long the HTTP server waits for a request's headers.
const serverHold = 5 * time.Second

// Bounds of the TCP server's echo, so that a client that neither talks nor
// closes cannot keep a connection, and its goroutine, forever. The lifetime
// outlasts the longest hold probe.
const (
	echoIdle     = time.Minute
	echoLifetime = maxDuration + time.Minute
	echoMaxBytes = 1 << 20
)

// Server is a server running in-process inside a host's namespace. Every
// kind answers with one line, "<host name> <client ip:port>\n", naming the
// host that served and the client address it saw. A server listens on every
// address of the host, IPv4 and IPv6, on one socket; it names an IPv4 client
// by its plain IPv4 address (never ::ffff:a.b.c.d), an IPv6 client by its
// IPv6 address.
type Server struct {
	// Proto is "tcp", "udp" or "http".
	Proto string
	// Addr is the host's IP and the port the server listens on.
	Addr netip.AddrPort
	// Addr6 is the host's IPv6 address and the same port.
	Addr6 netip.AddrPort

	stop func() error
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	closeOnce sync.Once
	closeErr  error
}

// AddServingPod adds a pod as AddPod does and starts a TCP server on tcpPort
// and a UDP server on udpPort in it, the pods most tests need.
func (s *Sandbox) AddServingPod(node *Node, name string, ip netip.Addr, tcpPort, udpPort uint16) (*Pod, error) {
	p, err := s.AddPod(node, name, ip)
	if err != nil {
		return nil, err
	}
	if _, err := p.StartTCPServer(tcpPort); err != nil {
		return nil, err
	}
	if _, err := p.StartUDPServer(udpPort); err != nil {
		return nil, err
	}
	return p, nil
}

// StartTCPServer starts a TCP server on port (0 picks one) on all of the host's
// addresses. On each connection it writes its line, then echoes every line the
// client sends until the client closes, so that a held connection (see
// Client.Hold) can show that it still carries data. Closing after the client
// leaves TIME_WAIT on the client. The server gives up on a connection idle for
// a minute, open for longer than any hold probe, or after 1 MiB.
func (h *Host) StartTCPServer(port uint16) (*Server, error) {
	return h.StartTCPServerNamed(port, h.Name)
}

// StartTCPServerNamed is StartTCPServer answering with name instead of the
// host's name, for example "<host>:<port>" so that a probe can tell which
// port of a host served it. name must be free of white space.
func (h *Host) StartTCPServerNamed(port uint16, name string) (*Server, error) {
	if err := checkServerName(name); err != nil {
		return nil, err
	}
	ln, err := h.listen("tcp", port)
	if err != nil {
		return nil, err
	}
	return h.addServer(h.serveStream("tcp", ln, name))
}

// serveStream makes a server of proto that answers each connection ln
// accepts with whoami.
func (h *Host) serveStream(proto string, ln net.Listener, name string) *Server {
	srv := h.newServer(proto, ln.Addr(), ln.Close)
	srv.conns = map[net.Conn]struct{}{}
	srv.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed
			}
			if !srv.track(conn) {
				conn.Close()
				return
			}
			srv.wg.Go(func() { srv.whoami(name, conn) })
		}
	})
	return srv
}

func (srv *Server) whoami(name string, conn net.Conn) {
	defer srv.untrack(conn)
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%s %s\n", name, clientName(conn.RemoteAddr().String())); err != nil {
		return
	}
	end := time.Now().Add(echoLifetime)
	rd := bufio.NewReader(io.LimitReader(conn, echoMaxBytes))
	for {
		deadline := time.Now().Add(echoIdle)
		if deadline.After(end) {
			deadline = end
		}
		_ = conn.SetDeadline(deadline)
		// A line longer than the buffer is echoed in pieces, the same bytes.
		line, err := rd.ReadSlice('\n')
		if len(line) > 0 {
			if _, werr := conn.Write(line); werr != nil {
				return
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// track records an open connection so that Close can end it; it reports
// false once the server is closing.
func (srv *Server) track(conn net.Conn) bool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.conns == nil {
		return false
	}
	srv.conns[conn] = struct{}{}
	return true
}

func (srv *Server) untrack(conn net.Conn) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	delete(srv.conns, conn)
}

// StartUDPServer starts a UDP server on port (0 picks one) on all of the host's
// addresses, answering every datagram with its line sent back to the sender,
// from the address the datagram was sent to: a client of a host with several
// addresses, such as a node, gets its answer from the address it asked, as
// a connected socket needs.
func (h *Host) StartUDPServer(port uint16) (*Server, error) {
	return h.StartUDPServerNamed(port, h.Name)
}

// StartUDPServerNamed is StartUDPServer answering with name instead of the
// host's name; see StartTCPServerNamed.
func (h *Host) StartUDPServerNamed(port uint16, name string) (*Server, error) {
	if err := checkServerName(name); err != nil {
		return nil, err
	}
	var pc net.PacketConn
	err := h.NS.Do(func() (err error) {
		pc, err = dualStack.ListenPacket(context.Background(), "udp6", listenAddr(port))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listen udp/%d: %w", h.Name, port, err)
	}
	conn := pc.(*net.UDPConn)
	srv := h.newServer("udp", conn.LocalAddr(), conn.Close)
	srv.wg.Go(func() {
		buf := make([]byte, 2048)
		oob := make([]byte, 128)
		for {
			_, oobn, _, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				// Transient errors must not end the server; the pause bounds
				// the loop should one persist.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			line := []byte(name + " " + clientName(from.String()) + "\n")
			if reply := replyFrom(oob[:oobn]); reply != nil {
				if _, _, err := conn.WriteMsgUDPAddrPort(line, reply, from); err == nil {
					continue
				}
			}
			_, _ = conn.WriteToUDPAddrPort(line, from)
		}
	})
	return h.addServer(srv)
}

// replyFrom returns the control message that sends a reply from the address
// a datagram was sent to, read from the datagram's IPV6_PKTINFO (an IPv4
// datagram's shows as ::ffff:a.b.c.d, which the kernel accepts back for an
// IPv4 reply), or nil if there is none.
func replyFrom(oob []byte) []byte {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, m := range msgs {
		if m.Header.Level != unix.IPPROTO_IPV6 || m.Header.Type != unix.IPV6_PKTINFO || len(m.Data) < unix.SizeofInet6Pktinfo {
			continue
		}
		// The interface is left to routing, as for any other reply.
		var info unix.Inet6Pktinfo
		copy(info.Addr[:], m.Data[:len(info.Addr)])
		return unix.PktInfo6(&info)
	}
	return nil
}

// checkServerName keeps a server's line parseable: the probe splits it at
// the first space.
func checkServerName(name string) error {
	if name == "" || len(name) > 100 || strings.ContainsFunc(name, unicode.IsSpace) {
		return fmt.Errorf("invalid server name %q: want 1-100 characters without white space", name)
	}
	return nil
}

// StartHTTPServer starts an HTTP server on port (0 picks one) on all of the host's
// addresses, answering every request with its line as the body.
func (h *Host) StartHTTPServer(port uint16) (*Server, error) {
	ln, err := h.listen("tcp", port)
	if err != nil {
		return nil, err
	}
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "%s %s\n", h.Name, clientName(r.RemoteAddr))
		}),
		ReadHeaderTimeout: serverHold,
	}
	srv := h.newServer("http", ln.Addr(), hs.Close)
	srv.wg.Go(func() { _ = hs.Serve(ln) })
	return h.addServer(srv)
}

// dualStack makes IPv6 sockets that take IPv4 too (IPV6_V6ONLY off), so that
// one server socket answers on all of a host's addresses of both families,
// whatever the process found out about IPv6 when it started. Its UDP
// sockets report each datagram's destination address (IPV6_RECVPKTINFO; see
// replyFrom).
var dualStack = net.ListenConfig{
	Control: func(network, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
			if serr == nil && strings.HasPrefix(network, "udp") {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
			}
		})
		return errors.Join(err, serr)
	},
}

// listenAddr is the wildcard IPv6 address with port.
func listenAddr(port uint16) string {
	return net.JoinHostPort("::", strconv.Itoa(int(port)))
}

// clientName writes a client's "ip:port" as a server reports it: an IPv4
// client that reached an IPv6 socket by its IPv4-mapped address gets its
// plain IPv4 address. Anything unparseable is reported as it is.
func clientName(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return remote
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
}

// listen creates a listening socket inside the host's namespace; the socket
// stays in that namespace whichever thread later accepts on it.
func (h *Host) listen(network string, port uint16) (net.Listener, error) {
	var ln net.Listener
	err := h.NS.Do(func() (err error) {
		ln, err = dualStack.Listen(context.Background(), network+"6", listenAddr(port))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listen %s/%d: %w", h.Name, network, port, err)
	}
	return ln, nil
}

func (h *Host) newServer(proto string, addr net.Addr, stop func() error) *Server {
	var port int
	switch a := addr.(type) {
	case *net.TCPAddr:
		port = a.Port
	case *net.UDPAddr:
		port = a.Port
	}
	return &Server{Proto: proto, Addr: netip.AddrPortFrom(h.IP, uint16(port)),
		Addr6: netip.AddrPortFrom(h.IP6, uint16(port)), stop: stop}
}

// addServer ties srv to the host so that closing the host stops it.
func (h *Host) addServer(srv *Server) (*Server, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.Join(fmt.Errorf("%s: host is closed", h.Name), srv.Close())
	}
	h.servers = append(h.servers, srv)
	return srv, nil
}

// Close stops the server, ends its open connections and waits for its
// goroutines. Close is idempotent.
func (srv *Server) Close() error {
	srv.closeOnce.Do(func() {
		err := srv.stop()
		srv.mu.Lock()
		conns := srv.conns
		srv.conns = nil
		srv.mu.Unlock()
		for c := range conns {
			c.Close()
		}
		srv.wg.Wait()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			srv.closeErr = fmt.Errorf("stop %s server on %s: %w", srv.Proto, srv.Addr, err)
		}
	})
	return srv.closeErr
}
