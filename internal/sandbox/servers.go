package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
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
// host that served and the client address it saw.
type Server struct {
	// Proto is "tcp", "udp" or "http".
	Proto string
	// Addr is the host's IP and the port the server listens on.
	Addr netip.AddrPort

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
	srv := h.newServer("tcp", ln.Addr(), ln.Close)
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
	return h.addServer(srv)
}

func (srv *Server) whoami(name string, conn net.Conn) {
	defer srv.untrack(conn)
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%s %s\n", name, conn.RemoteAddr()); err != nil {
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
// addresses, answering every datagram with its line sent back to the sender.
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
		pc, err = net.ListenPacket("udp", ":"+strconv.Itoa(int(port)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: listen udp/%d: %w", h.Name, port, err)
	}
	conn := pc.(*net.UDPConn)
	srv := h.newServer("udp", conn.LocalAddr(), conn.Close)
	srv.wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := conn.ReadFromUDP(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				// Transient errors must not end the server; the pause bounds
				// the loop should one persist.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			_, _ = conn.WriteToUDP([]byte(name+" "+from.String()+"\n"), from)
		}
	})
	return h.addServer(srv)
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
			fmt.Fprintf(w, "%s %s\n", h.Name, r.RemoteAddr)
		}),
		ReadHeaderTimeout: serverHold,
	}
	srv := h.newServer("http", ln.Addr(), hs.Close)
	srv.wg.Go(func() { _ = hs.Serve(ln) })
	return h.addServer(srv)
}

// listen creates a listening socket inside the host's namespace; the socket
// stays in that namespace whichever thread later accepts on it.
func (h *Host) listen(network string, port uint16) (net.Listener, error) {
	var ln net.Listener
	err := h.NS.Do(func() (err error) {
		ln, err = net.Listen(network, ":"+strconv.Itoa(int(port)))
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
	return &Server{Proto: proto, Addr: netip.AddrPortFrom(h.IP, uint16(port)), stop: stop}
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
