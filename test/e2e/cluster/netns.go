package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Forwarder makes the API server reachable at 127.0.0.1:<port> inside a test
// network namespace, the address its kubeconfigs name and its serving
// certificate covers; see Cluster.ForwardIntoNetNS.
type Forwarder struct {
	cluster  *Cluster
	nsPath   string
	addr     string // the listening and the dialled address, 127.0.0.1:<port>
	mu       sync.Mutex
	listener net.Listener
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

// ForwardIntoNetNS makes the API server reachable from inside the network
// namespace at nsPath (/var/run/netns/<name> or /proc/<pid>/ns/net), so that
// a proxy started there with any of the cluster's kubeconfigs works unchanged.
//
// A process in another namespace cannot reach the root namespace's loopback,
// and the API server runs there. The forwarder listens on the namespace's own
// 127.0.0.1:<port> (a socket stays in the namespace it was created in, so
// only the socket() and bind happen inside it) and relays each connection, from
// the test binary, to the API server's 127.0.0.1:<port> in the root
// namespace. TLS passes through untouched, so the certificate and tokens stay
// valid, and no interface, route or address is added to the root namespace.
// The namespace's loopback interface is brought up if it is down.
//
// While the API server is stopped (StopAPIServer) the forwarder does not
// listen, so clients in the namespace get "connection refused" as they would
// from a real API server that is down. It needs CAP_SYS_ADMIN (setns). Close
// it, or Stop the cluster, before deleting the namespace: its socket keeps the
// namespace alive.
func (c *Cluster) ForwardIntoNetNS(nsPath string) (*Forwarder, error) {
	f := &Forwarder{cluster: c, nsPath: nsPath, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.apiPort)), conns: map[net.Conn]struct{}{}}
	if err := setLoopbackUp(nsPath); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, errors.New("forward API server into network namespace: cluster is stopped")
	}
	if c.apiserver != nil {
		if err := f.listen(); err != nil {
			return nil, err
		}
	}
	c.forwarders = append(c.forwarders, f)
	return f, nil
}

func setLoopbackUp(nsPath string) error {
	ns, err := vnetns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", nsPath, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", nsPath, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in %s: %w", nsPath, err)
	}
	return nil
}

// listenInNetNS creates a TCP listener inside the namespace at nsPath: only
// the socket() and bind happen in it (netns.Do).
func listenInNetNS(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	err := netns.Do(nsPath, func() (err error) {
		l, err = net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("listen on %s in network namespace %s: %w", addr, nsPath, err)
		}
		return err
	})
	if err != nil {
		if l != nil {
			l.Close()
		}
		return nil, err
	}
	return l, nil
}

// listen starts listening, unless the forwarder is closed or already
// listening.
func (f *Forwarder) listen() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.listener != nil {
		return nil
	}
	l, err := listenInNetNS(f.nsPath, f.addr)
	if err != nil {
		return err
	}
	f.listener = l
	f.wg.Add(1)
	go f.accept(l)
	return nil
}

func (f *Forwarder) accept(l net.Listener) {
	defer f.wg.Done()
	for {
		down, err := l.Accept()
		if err != nil {
			// Closed by pause or close; any other accept error on a
			// loopback listener is as fatal, and a client sees it as
			// the API server going away.
			return
		}
		if !f.track(down) {
			down.Close()
			return
		}
		f.wg.Add(1)
		go f.relay(down)
	}
}

func (f *Forwarder) track(conn net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[conn] = struct{}{}
	return true
}

func (f *Forwarder) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		delete(f.conns, c)
		c.Close()
	}
}

func (f *Forwarder) relay(down net.Conn) {
	defer f.wg.Done()
	// This goroutine's thread is in the root namespace, so the dial reaches
	// the API server's loopback address.
	up, err := net.DialTimeout("tcp", f.addr, 5*time.Second)
	if err != nil {
		f.untrack(down)
		return
	}
	if !f.track(up) {
		up.Close()
		f.untrack(down)
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); done <- struct{}{} }()
	<-done
	// One side ended: end both, which also ends the other copy.
	f.untrack(up, down)
	<-done
}

// pause stops listening and drops every relayed connection, as a stopped API
// server would.
func (f *Forwarder) pause() {
	f.mu.Lock()
	if f.listener != nil {
		f.listener.Close()
		f.listener = nil
	}
	for c := range f.conns {
		c.Close()
		delete(f.conns, c)
	}
	f.mu.Unlock()
}

func (f *Forwarder) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.pause()
	f.wg.Wait()
}

// Pause cuts the namespace off the API server, as StopAPIServer does for
// every namespace: the forwarder stops listening and drops every relayed
// connection (watches included), so clients in the namespace see the API
// server go away while it keeps serving everyone else. Resume, or the next
// StartAPIServer, undoes it.
func (f *Forwarder) Pause() { f.pause() }

// Resume makes the forwarder listen again after Pause; while the API server
// is stopped it leaves it to the next StartAPIServer.
func (f *Forwarder) Resume() error {
	if f.cluster.APIServerPID() == 0 {
		return nil
	}
	return f.listen()
}

// Close stops forwarding and closes every relayed connection. It is
// idempotent.
func (f *Forwarder) Close() error {
	c := f.cluster
	c.mu.Lock()
	c.forwarders = slices.DeleteFunc(c.forwarders, func(g *Forwarder) bool { return g == f })
	c.mu.Unlock()
	f.close()
	return nil
}
