package sockterm

import (
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// diagFixture is a namespace with connected UDP sockets and TCP connections
// to known destinations, all on loopback, and a sock_diag socket inside it.
type diagFixture struct {
	c *diagConn
	// udp and tcp map each client socket's cookie to its destination.
	udp, tcp map[uint64]netip.AddrPort
}

func newDiagFixture(t *testing.T) *diagFixture {
	t.Helper()
	sandbox.RequireRoot(t)
	ns, err := sandbox.NewNetns("diag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Errorf("close netns: %v", err)
		}
	})
	f := &diagFixture{udp: map[uint64]netip.AddrPort{}, tcp: map[uint64]netip.AddrPort{}}
	var closers []func() error
	t.Cleanup(func() {
		for _, c := range closers {
			c()
		}
	})
	err = ns.Do(func() error {
		// connect() on UDP sends nothing: no server is needed.
		for _, d := range []string{"127.0.0.2:53", "127.0.0.2:54", "127.0.0.3:53", "127.0.0.4:5353"} {
			dst := netip.MustParseAddrPort(d)
			conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
			if err != nil {
				return err
			}
			closers = append(closers, conn.Close)
			f.udp[cookieOf(t, conn)] = dst
		}
		// An unconnected socket is no client of anyone.
		unconn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 9999})
		if err != nil {
			return err
		}
		closers = append(closers, unconn.Close)
		for _, port := range []int{8080, 8081} {
			ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
			if err != nil {
				return err
			}
			closers = append(closers, ln.Close)
			dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
			conn, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(dst))
			if err != nil {
				return err
			}
			closers = append(closers, conn.Close)
			f.tcp[cookieOf(t, conn)] = dst
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.c, err = openDiag(ns.Handle()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.c.Close)
	return f
}

func cookieOf(t *testing.T, c syscall.Conn) uint64 {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var (
		cookie uint64
		serr   error
	)
	if err := raw.Control(func(fd uintptr) {
		cookie, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
	}); err != nil || serr != nil {
		t.Fatalf("SO_COOKIE: %v %v", err, serr)
	}
	return cookie
}

func TestKernelFilterReturnsOnlySocketsConnectedToTheBackends(t *testing.T) {
	f := newDiagFixture(t)
	ap := netip.MustParseAddrPort
	// Destinations no socket is connected to, to fill the filter program up
	// to its largest size.
	padding := func(n int) []netip.AddrPort {
		var out []netip.AddrPort
		for i := range n {
			out = append(out, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}), 53))
		}
		return out
	}
	tests := []struct {
		name   string
		proto  model.Protocol
		filter []netip.AddrPort
		want   []netip.AddrPort
	}{
		{"one UDP backend: the same address on another port is not it", model.UDP, []netip.AddrPort{ap("127.0.0.2:53")},
			[]netip.AddrPort{ap("127.0.0.2:53")}},
		{"two UDP backends", model.UDP, []netip.AddrPort{ap("127.0.0.4:5353"), ap("127.0.0.3:53")},
			[]netip.AddrPort{ap("127.0.0.3:53"), ap("127.0.0.4:5353")}},
		{"a backend no socket is connected to", model.UDP, []netip.AddrPort{ap("127.0.0.5:53")}, nil},
		{"the largest filter program the kernel is given", model.UDP, append(padding(maxFilterDests-1), ap("127.0.0.3:53")),
			[]netip.AddrPort{ap("127.0.0.3:53")}},
		{"no filter: every connected UDP socket, none unconnected", model.UDP, nil,
			[]netip.AddrPort{ap("127.0.0.2:53"), ap("127.0.0.2:54"), ap("127.0.0.3:53"), ap("127.0.0.4:5353")}},
		{"a TCP backend: its client sockets, neither the listener nor the server's side", model.TCP, []netip.AddrPort{ap("127.0.0.1:8081")},
			[]netip.AddrPort{ap("127.0.0.1:8081")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			states, mine := uint32(udpStates), f.udp
			if tt.proto == model.TCP {
				states, mine = tcpStates, f.tcp
			}
			socks, err := f.c.dump(uint8(tt.proto), states, tt.filter)
			if err != nil {
				t.Fatalf("dump: %v", err)
			}
			var got []netip.AddrPort
			for _, s := range socks {
				if dst, ok := mine[s.cookie]; !ok || dst != s.remote {
					t.Errorf("dump returned socket %s -> %s cookie %d state %d, which is none of the test's client sockets",
						s.local, s.remote, s.cookie, s.state)
					continue
				}
				got = append(got, s.remote)
			}
			slices.SortFunc(got, netip.AddrPort.Compare)
			if !slices.Equal(got, tt.want) {
				t.Errorf("dump returned sockets connected to %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDestroyChecksTheCookie(t *testing.T) {
	f := newDiagFixture(t)
	socks, err := f.c.dump(uint8(model.UDP), udpStates, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.2:53")})
	if err != nil || len(socks) != 1 {
		t.Fatalf("dump: %v, %d sockets; want one", err, len(socks))
	}
	// The same addresses with another cookie: a socket that took the
	// addresses of the one found.
	stale := socks[0]
	stale.id[40]++
	if err := f.c.destroy(uint8(model.UDP), stale); err == nil {
		t.Fatalf("destroy with a stale cookie succeeded")
	}
	again, err := f.c.dump(uint8(model.UDP), udpStates, nil)
	if err != nil || len(again) != len(f.udp) {
		t.Fatalf("after destroy with a stale cookie: %v, %d sockets, want all %d left", err, len(again), len(f.udp))
	}
	if err := f.c.destroy(uint8(model.UDP), socks[0]); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	after, err := f.c.dump(uint8(model.UDP), udpStates, nil)
	if err != nil || len(after) != len(f.udp)-1 || slices.ContainsFunc(after, func(s diagSocket) bool { return s.cookie == socks[0].cookie }) {
		t.Fatalf("after destroy: %v, %d sockets, want all but the destroyed one", err, len(after))
	}
}
