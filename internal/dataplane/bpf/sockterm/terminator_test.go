package sockterm_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf/sockterm"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

var (
	pod0IP   = netip.MustParseAddr("10.244.1.10")
	pod1IP   = netip.MustParseAddr("10.244.1.11")
	clientIP = netip.MustParseAddr("10.244.1.100")
)

// dnsPort is where both pods serve, over UDP and TCP, as CoreDNS does.
const dnsPort = 53

// cluster is one node with two DNS-like pods and a client pod, all in a
// sandbox; its Translated stands in for the lookup in sock4_revnat_v1.
type cluster struct {
	sb     *sandbox.Sandbox
	client *sandbox.Client
	// hosts are every namespace of the sandbox, the ones Terminate searches.
	hosts []*sandbox.Host

	mu   sync.Mutex
	ours map[uint64]netip.AddrPort // socket cookie -> backend it was translated to
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	sb := sandbox.ForTest(t)
	c := &cluster{sb: sb, ours: map[uint64]netip.AddrPort{}}
	node, err := sb.AddNode("node1")
	if err != nil {
		t.Fatal(err)
	}
	c.hosts = append(c.hosts, sb.Router, node.Host)
	for i, ip := range []netip.Addr{pod0IP, pod1IP} {
		pod, err := sb.AddPod(node, fmt.Sprintf("pod-%d", i), ip)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pod.StartUDPServer(dnsPort); err != nil {
			t.Fatal(err)
		}
		if _, err := pod.StartTCPServer(dnsPort); err != nil {
			t.Fatal(err)
		}
		c.hosts = append(c.hosts, pod.Host)
	}
	if c.client, err = sb.AddClient(node, "client", clientIP); err != nil {
		t.Fatal(err)
	}
	c.hosts = append(c.hosts, c.client.Host)
	return c
}

// markOurs records that the load balancer translated the socket with cookie
// to backend.
func (c *cluster) markOurs(cookie uint64, backend netip.AddrPort) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ours[cookie] = backend
}

func (c *cluster) translated(cookie uint64, backend netip.AddrPort) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.ours[cookie]
	return ok && b == backend
}

// namespaces lists the sandbox's namespaces only.
func (c *cluster) namespaces(context.Context) ([]sockterm.Namespace, error) {
	var out []sockterm.Namespace
	for _, h := range c.hosts {
		out = append(out, sockterm.Namespace{Path: h.NS.Path(), Inode: h.NS.Inode()})
	}
	return out, nil
}

func (c *cluster) terminator(t *testing.T) *sockterm.Terminator {
	t.Helper()
	term, err := sockterm.New(sockterm.Config{Namespaces: c.namespaces, Translated: c.translated, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return term
}

// startStream starts a resolver-like UDP client whose first query must be
// answered by pod-0.
func (c *cluster) startStream(t *testing.T, addrs ...netip.AddrPort) *sandbox.UDPStream {
	t.Helper()
	st, err := c.client.StartUDPStream(t.Context(), addrs, sandbox.UDPStreamOptions{Interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Stop() })
	if f := st.First; f.Err != "" || f.Server != "pod-0" || f.Peer != addrs[0] || f.Cookie == 0 {
		t.Fatalf("first query %+v, want an answer from pod-0 on a socket connected to %s", f, addrs[0])
	}
	return st
}

// hold opens a TCP connection that must reach pod name.
func (c *cluster) hold(t *testing.T, dst netip.AddrPort, name string) *sandbox.Held {
	t.Helper()
	h, err := c.client.Hold(t.Context(), dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if f := h.First; !f.Connected || f.Err != "" || f.Server != name || f.Cookie == 0 {
		t.Fatalf("held connection %+v, want one to %s", f, name)
	}
	return h
}

// queriesAfter reads the stream's queries until the first one sent at or
// after from and returns it with the ones read before it.
func queriesAfter(t *testing.T, st *sandbox.UDPStream, from time.Time) (sandbox.UDPQuery, []sandbox.UDPQuery) {
	t.Helper()
	// A bound, not an expectation: a query is due every 100ms.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var before []sandbox.UDPQuery
	for {
		q, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for a query sent after %s: %v (read before: %+v)", from.Format(time.StampMicro), err, before)
		}
		if !q.Sent.Before(from) {
			return q, before
		}
		before = append(before, q)
	}
}

func backends(proto model.Protocol, dsts ...netip.AddrPort) []sockterm.Backend {
	var out []sockterm.Backend
	for _, d := range dsts {
		out = append(out, sockterm.Backend{Addr: d, Proto: proto})
	}
	return out
}

// padding returns n backends nothing is connected to.
func padding(proto model.Protocol, n int) []sockterm.Backend {
	var out []sockterm.Backend
	for i := range n {
		out = append(out, sockterm.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 200 + byte(i>>8), byte(i)}), dnsPort), Proto: proto})
	}
	return out
}

// family is how a client reaches the pods: the address it connects to
// and the backend the agent names when the pod is removed.
type family struct {
	name string
	// dial is the address a client connects to for a pod's address.
	dial func(netip.Addr) netip.Addr
	// backend is the removed backend the agent names for a pod's address.
	backend func(netip.Addr) netip.Addr
}

var families = []family{
	{"IPv4", same, same},
	{"IPv6", sandbox.IPv6Of, sandbox.IPv6Of},
	// A dual-stack client (an AF_INET6 socket) of an IPv4 Service: the
	// hooks translate it as IPv4, and the agent names the IPv4 backend.
	{"IPv4-mapped on AF_INET6 sockets", mapped, same},
}

func same(a netip.Addr) netip.Addr   { return a }
func mapped(a netip.Addr) netip.Addr { return netip.AddrFrom16(a.As16()) }

func TestRemovedBackendLosesItsTranslatedSockets(t *testing.T) {
	sandbox.RequireRoot(t)
	tests := []struct {
		name string
		// extra removed backends that nothing is connected to.
		extra int
	}{
		{"the kernel filters by backend", 0},
		{"too many removed backends for the kernel's filter: userspace filters", 400},
	}
	for _, fam := range families {
		for _, tt := range tests {
			t.Run(fam.name+"/"+tt.name, func(t *testing.T) { testRemovedBackend(t, fam, tt.extra) })
		}
	}
}

func testRemovedBackend(t *testing.T, fam family, extra int) {
	pod0, pod1 := netip.AddrPortFrom(fam.dial(pod0IP), dnsPort), netip.AddrPortFrom(fam.dial(pod1IP), dnsPort)
	be0, be1 := netip.AddrPortFrom(fam.backend(pod0IP), dnsPort), netip.AddrPortFrom(fam.backend(pod1IP), dnsPort)
	c := newCluster(t)
	term := c.terminator(t)

	// A resolver whose socket the load balancer pointed at pod-0; on
	// a new socket it reaches pod-1, as connect4 would pick a live
	// backend. Beside it, one that connected to pod-0 itself.
	ours := c.startStream(t, pod0, pod1)
	c.markOurs(ours.First.Cookie, be0)
	notOurs := c.startStream(t, pod0)
	// TCP connections: translated to pod-0, to pod-1, and made to
	// pod-0 directly.
	tcp0 := c.hold(t, pod0, "pod-0")
	c.markOurs(tcp0.First.Cookie, be0)
	tcp1 := c.hold(t, pod1, "pod-1")
	c.markOurs(tcp1.First.Cookie, be1)
	tcp0Direct := c.hold(t, pod0, "pod-0")

	// Without termination the resolver sticks to pod-0.
	for range 3 {
		q, err := ours.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if q.Err != "" || q.Server != "pod-0" || q.Cookie != ours.First.Cookie {
			t.Fatalf("query %+v before termination, want pod-0 on the first socket", q)
		}
	}

	t.Run("UDP backend removed: the resolver's next query is answered by the live backend", func(t *testing.T) {
		removed := append(backends(model.UDP, be0), padding(model.UDP, extra)...)
		start := time.Now()
		stats, err := term.Terminate(t.Context(), removed)
		done := time.Now()
		if err != nil {
			t.Fatalf("Terminate: %v", err)
		}
		want := sockterm.Stats{Namespaces: len(c.hosts), DestroyedUDP: 1, NotTranslated: 1}
		if stats != want {
			t.Errorf("stats %+v, want %+v", stats, want)
		}
		next, before := queriesAfter(t, ours, done)
		// Queries sent while Terminate ran may still have used the
		// old socket; none may have waited for a timeout.
		for _, q := range append(before, next) {
			if q.Err != "" || slices.Contains(q.Retries, "ETIMEDOUT") {
				t.Errorf("query %+v failed; the resolver must move at once", q)
			}
		}
		if next.Server != "pod-1" || next.Cookie == ours.First.Cookie || next.Peer != pod1 {
			t.Fatalf("first query sent after termination: %+v, want an answer from pod-1 on a new socket", next)
		}
		// The time a user would measure: from the backend's removal
		// to the first answer from a live backend.
		t.Logf("terminated in %s; the next query, sent %s after, was answered by %s %s after termination (retries %v)",
			done.Sub(start), next.Sent.Sub(done), next.Server, next.Answered.Sub(done), next.Retries)
		if len(next.Retries) == 0 && len(before) == 0 {
			t.Errorf("the resolver reached pod-1 without a socket error: was its socket destroyed?")
		}
		// It stays on the new socket.
		for range 3 {
			q, err := ours.Next(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if q.Err != "" || q.Server != "pod-1" || q.Cookie != next.Cookie {
				t.Errorf("query %+v, want pod-1 on socket %d", q, next.Cookie)
			}
		}
		// The socket that is not ours goes on with pod-0.
		other, _ := queriesAfter(t, notOurs, done)
		if other.Err != "" || other.Server != "pod-0" || other.Cookie != notOurs.First.Cookie || len(other.Retries) != 0 {
			t.Errorf("untranslated resolver's query %+v, want pod-0 on its first socket", other)
		}
		// TCP to the same address and port is another backend.
		for name, h := range map[string]*sandbox.Held{"translated to pod-0": tcp0, "translated to pod-1": tcp1, "direct to pod-0": tcp0Direct} {
			if err := h.Ping(); err != nil {
				t.Errorf("TCP connection %s after the UDP backend's removal: %v", name, err)
			}
		}
	})

	t.Run("TCP backend removed: its translated connection is aborted, others carry on", func(t *testing.T) {
		removed := append(backends(model.TCP, be0), padding(model.TCP, extra)...)
		stats, err := term.Terminate(t.Context(), removed)
		if err != nil {
			t.Fatalf("Terminate: %v", err)
		}
		want := sockterm.Stats{Namespaces: len(c.hosts), DestroyedTCP: 1, NotTranslated: 1}
		if stats != want {
			t.Errorf("stats %+v, want %+v", stats, want)
		}
		err = tcp0.Ping()
		if err == nil || !strings.Contains(err.Error(), "ECONNABORTED") && !strings.Contains(err.Error(), "ECONNRESET") {
			t.Errorf("ping on the connection translated to pod-0: %v, want ECONNABORTED or ECONNRESET", err)
		}
		t.Logf("the application's next call on the destroyed connection: %v", err)
		for name, h := range map[string]*sandbox.Held{"translated to pod-1": tcp1, "direct to pod-0": tcp0Direct} {
			if err := h.Ping(); err != nil {
				t.Errorf("TCP connection %s: %v", name, err)
			}
		}
	})

	res, err := ours.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if res.Sockets != 2 || res.Failures != 0 {
		t.Errorf("resolver %+v: want 2 sockets and no failed query", res)
	}
	t.Logf("the resolver met these socket errors: %v", res.Errors)
}

func TestTerminateSearchesEveryNamespaceOfTheNode(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	pod0, pod1 := netip.AddrPortFrom(pod0IP, dnsPort), netip.AddrPortFrom(pod1IP, dnsPort)
	ours := c.startStream(t, pod0, pod1)
	c.markOurs(ours.First.Cookie, pod0)
	// The agent's configuration: every namespace of the node. Only the
	// test's own socket is translated, so nothing else on the machine is
	// touched.
	term, err := sockterm.New(sockterm.Config{Translated: c.translated, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stats, err := term.Terminate(t.Context(), backends(model.UDP, pod0))
	done := time.Now()
	// A machine may shield some process from root (this project's build
	// machines shield their PID 1): that is reported, and nothing else may
	// fail.
	if err != nil && !errors.Is(err, sockterm.ErrNamespaceAccess) {
		t.Fatalf("Terminate: %v", err)
	}
	if err != nil {
		t.Logf("Terminate: %v", err)
	}
	if stats.DestroyedUDP != 1 || stats.Namespaces < len(c.hosts) || stats.NamespaceErrors != 0 {
		t.Errorf("stats %+v, want the one socket destroyed and at least the sandbox's %d namespaces searched", stats, len(c.hosts))
	}
	next, _ := queriesAfter(t, ours, done)
	if next.Server != "pod-1" {
		t.Errorf("first query sent after termination: %+v, want an answer from pod-1", next)
	}
}

func TestVanishedNamespacesAreNotErrors(t *testing.T) {
	sandbox.RequireRoot(t)
	ns, err := sandbox.NewNetns("vanish")
	if err != nil {
		t.Fatal(err)
	}
	gone := sockterm.Namespace{Path: ns.Path(), Inode: ns.Inode()}
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ns   sockterm.Namespace
	}{
		{"its mount was removed", gone},
		{"its process exited", sockterm.Namespace{Path: "/proc/4194305/ns/net", Inode: 4026531840}},
		{"its path now leads to another namespace", sockterm.Namespace{Path: "/proc/self/ns/net", Inode: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			term, err := sockterm.New(sockterm.Config{
				Namespaces: func(context.Context) ([]sockterm.Namespace, error) { return []sockterm.Namespace{tt.ns}, nil },
				Translated: func(uint64, netip.AddrPort) bool { return true },
			})
			if err != nil {
				t.Fatal(err)
			}
			stats, err := term.Terminate(t.Context(), backends(model.UDP, netip.MustParseAddrPort("10.244.1.10:53")))
			if err != nil || stats != (sockterm.Stats{Vanished: 1}) {
				t.Errorf("Terminate = %+v, %v; want one vanished namespace and no error", stats, err)
			}
		})
	}
}

func TestBadInputIsRejected(t *testing.T) {
	if _, err := sockterm.New(sockterm.Config{}); err == nil || !strings.Contains(err.Error(), "Translated is required") {
		t.Errorf("New without Translated: %v, want an error", err)
	}
	tests := []struct {
		name    string
		backend sockterm.Backend
	}{
		{"SCTP", sockterm.Backend{Addr: netip.MustParseAddrPort("10.244.1.10:53"), Proto: model.SCTP}},
		{"an IPv6 link-local address with a zone", sockterm.Backend{Addr: netip.MustParseAddrPort("[fe80::1%eth0]:53"), Proto: model.UDP}},
		{"no port", sockterm.Backend{Addr: netip.MustParseAddrPort("10.244.1.10:0"), Proto: model.TCP}},
		{"no address", sockterm.Backend{Proto: model.TCP}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			listed := false
			term, err := sockterm.New(sockterm.Config{
				Namespaces: func(context.Context) ([]sockterm.Namespace, error) { listed = true; return nil, nil },
				Translated: func(uint64, netip.AddrPort) bool { return true },
			})
			if err != nil {
				t.Fatal(err)
			}
			stats, err := term.Terminate(t.Context(), []sockterm.Backend{tt.backend})
			if !errors.Is(err, sockterm.ErrUnsupportedBackend) || !strings.Contains(err.Error(), tt.backend.String()) {
				t.Errorf("Terminate(%s): %v, want ErrUnsupportedBackend naming it", tt.backend, err)
			}
			if listed || stats != (sockterm.Stats{}) {
				t.Errorf("with nothing to do, Terminate searched namespaces (listed %v, stats %+v)", listed, stats)
			}
		})
	}
}
