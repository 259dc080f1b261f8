package sockterm

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// diagFixture is a namespace with connected UDP sockets and TCP connections
// to known destinations, all on loopback, of both socket families (AF_INET6
// ones to IPv6 addresses and to IPv4-mapped ones, as a dual-stack client
// makes), and a sock_diag socket inside it.
type diagFixture struct {
	c *diagConn
	// udp and tcp map each client socket's cookie to its destination, as
	// sock_diag reports it (an IPv4-mapped one as IPv4).
	udp, tcp map[uint64]dest
}

// dest is where a client socket of the fixture is connected.
type dest struct {
	family uint8
	addr   netip.AddrPort
}

func (d dest) String() string { return familyName(d.family) + " socket to " + d.addr.String() }

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
	f := &diagFixture{udp: map[uint64]dest{}, tcp: map[uint64]dest{}}
	var closers []func() error
	t.Cleanup(func() {
		for _, c := range closers {
			c()
		}
	})
	ap := netip.MustParseAddrPort
	err = ns.Do(func() error {
		// connect() on UDP sends nothing: no server is needed.
		for _, d := range []dest{
			{unix.AF_INET, ap("127.0.0.2:53")}, {unix.AF_INET, ap("127.0.0.2:54")},
			{unix.AF_INET, ap("127.0.0.3:53")}, {unix.AF_INET, ap("127.0.0.4:5353")},
			{unix.AF_INET6, ap("[::1]:53")}, {unix.AF_INET6, ap("127.0.0.5:53")},
		} {
			cookie, closer, err := connectSocket(unix.SOCK_DGRAM, d)
			if err != nil {
				return err
			}
			closers = append(closers, closer)
			f.udp[cookie] = d
		}
		// An unconnected socket is no client of anyone.
		unconn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 9999})
		if err != nil {
			return err
		}
		closers = append(closers, unconn.Close)
		for _, d := range []dest{
			{unix.AF_INET, ap("127.0.0.1:8080")}, {unix.AF_INET, ap("127.0.0.1:8081")},
			{unix.AF_INET6, ap("[::1]:8082")}, {unix.AF_INET6, ap("127.0.0.1:8083")},
		} {
			ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(d.addr))
			if err != nil {
				return err
			}
			closers = append(closers, ln.Close)
			cookie, closer, err := connectSocket(unix.SOCK_STREAM, d)
			if err != nil {
				return err
			}
			closers = append(closers, closer)
			f.tcp[cookie] = d
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

// connectSocket opens a socket of d's family and type typ connected to
// d.addr, through its IPv4-mapped address for an AF_INET6 socket to an
// IPv4 one, and returns its cookie.
func connectSocket(typ int, d dest) (uint64, func() error, error) {
	fd, err := unix.Socket(int(d.family), typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, nil, err
	}
	closer := func() error { return unix.Close(fd) }
	var sa unix.Sockaddr
	if d.family == unix.AF_INET6 {
		sa = &unix.SockaddrInet6{Addr: d.addr.Addr().As16(), Port: int(d.addr.Port())}
	} else {
		sa = &unix.SockaddrInet4{Addr: d.addr.Addr().As4(), Port: int(d.addr.Port())}
	}
	if err := unix.Connect(fd, sa); err != nil {
		closer()
		return 0, nil, fmt.Errorf("connect %s: %w", d, err)
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		closer()
		return 0, nil, err
	}
	return cookie, closer, nil
}

func TestKernelFilterReturnsOnlySocketsConnectedToTheBackends(t *testing.T) {
	f := newDiagFixture(t)
	ap := netip.MustParseAddrPort
	v4 := func(a string) dest { return dest{unix.AF_INET, ap(a)} }
	v6 := func(a string) dest { return dest{unix.AF_INET6, ap(a)} }
	// Destinations no socket is connected to, to fill the filter program up
	// to its largest size.
	padding := func(n int) []netip.AddrPort {
		var out []netip.AddrPort
		for i := range n {
			out = append(out, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}), 53))
		}
		return out
	}
	padding6 := func(n int) []netip.AddrPort {
		var out []netip.AddrPort
		for i := range n {
			out = append(out, netip.AddrPortFrom(netip.AddrFrom16([16]byte{0: 0xfd, 14: byte(i >> 8), 15: byte(i)}), 53))
		}
		return out
	}
	tests := []struct {
		name   string
		proto  model.Protocol
		filter []netip.AddrPort
		want   []dest
	}{
		{"one UDP backend: the same address on another port is not it", model.UDP, []netip.AddrPort{ap("127.0.0.2:53")},
			[]dest{v4("127.0.0.2:53")}},
		{"two UDP backends", model.UDP, []netip.AddrPort{ap("127.0.0.4:5353"), ap("127.0.0.3:53")},
			[]dest{v4("127.0.0.3:53"), v4("127.0.0.4:5353")}},
		{"a backend no socket is connected to", model.UDP, []netip.AddrPort{ap("127.0.0.9:53")}, nil},
		{"an IPv6 UDP backend", model.UDP, []netip.AddrPort{ap("[::1]:53")}, []dest{v6("[::1]:53")}},
		{"an IPv4 backend that an AF_INET6 socket reached through its IPv4-mapped address", model.UDP,
			[]netip.AddrPort{ap("127.0.0.5:53")}, []dest{v6("127.0.0.5:53")}},
		{"both families in one program", model.UDP, []netip.AddrPort{ap("[::1]:53"), ap("127.0.0.3:53"), ap("127.0.0.5:53")},
			[]dest{v4("127.0.0.3:53"), v6("127.0.0.5:53"), v6("[::1]:53")}},
		{"the largest filter program the kernel is given", model.UDP, append(padding(maxFilterDests-1), ap("127.0.0.3:53")),
			[]dest{v4("127.0.0.3:53")}},
		{"the largest IPv6 filter program the kernel is given", model.UDP, append(padding6(maxFilterDests-1), ap("[::1]:53")),
			[]dest{v6("[::1]:53")}},
		{"no filter: every connected UDP socket, none unconnected", model.UDP, nil,
			[]dest{v4("127.0.0.2:53"), v4("127.0.0.2:54"), v4("127.0.0.3:53"), v4("127.0.0.4:5353"), v6("127.0.0.5:53"), v6("[::1]:53")}},
		{"a TCP backend: its client sockets, neither the listener nor the server's side", model.TCP, []netip.AddrPort{ap("127.0.0.1:8081")},
			[]dest{v4("127.0.0.1:8081")}},
		{"TCP backends of both families, one reached through an IPv4-mapped address", model.TCP,
			[]netip.AddrPort{ap("[::1]:8082"), ap("127.0.0.1:8083")}, []dest{v6("127.0.0.1:8083"), v6("[::1]:8082")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			states, mine := uint32(udpStates), f.udp
			if tt.proto == model.TCP {
				states, mine = tcpStates, f.tcp
			}
			var got []dest
			for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
				socks, err := f.c.dump(family, uint8(tt.proto), states, tt.filter)
				if err != nil {
					t.Fatalf("dump %s: %v", familyName(family), err)
				}
				for _, s := range socks {
					d := dest{s.family, s.remote}
					if want, ok := mine[s.cookie]; !ok || want != d || s.family != family {
						t.Errorf("%s dump returned %s %s cookie %d state %d, which is none of the test's client sockets",
							familyName(family), d, s.local, s.cookie, s.state)
						continue
					}
					got = append(got, d)
				}
			}
			slices.SortFunc(got, func(a, b dest) int {
				if a.family != b.family {
					return int(a.family) - int(b.family)
				}
				return a.addr.Compare(b.addr)
			})
			if !slices.Equal(got, tt.want) {
				t.Errorf("dump returned %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDestroyChecksTheCookie(t *testing.T) {
	f := newDiagFixture(t)
	socks, err := f.c.dump(unix.AF_INET, uint8(model.UDP), udpStates, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.2:53")})
	if err != nil || len(socks) != 1 {
		t.Fatalf("dump: %v, %d sockets; want one", err, len(socks))
	}
	ipv4UDP := 0
	for _, d := range f.udp {
		if d.family == unix.AF_INET {
			ipv4UDP++
		}
	}
	// The same addresses with another cookie: a socket that took the
	// addresses of the one found.
	stale := socks[0]
	stale.id[40]++
	if err := f.c.destroy(uint8(model.UDP), stale); err == nil {
		t.Fatalf("destroy with a stale cookie succeeded")
	}
	again, err := f.c.dump(unix.AF_INET, uint8(model.UDP), udpStates, nil)
	if err != nil || len(again) != ipv4UDP {
		t.Fatalf("after destroy with a stale cookie: %v, %d sockets, want all %d left", err, len(again), ipv4UDP)
	}
	if err := f.c.destroy(uint8(model.UDP), socks[0]); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	after, err := f.c.dump(unix.AF_INET, uint8(model.UDP), udpStates, nil)
	if err != nil || len(after) != ipv4UDP-1 || slices.ContainsFunc(after, func(s diagSocket) bool { return s.cookie == socks[0].cookie }) {
		t.Fatalf("after destroy: %v, %d sockets, want all but the destroyed one", err, len(after))
	}
}
