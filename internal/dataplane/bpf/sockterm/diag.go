package sockterm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// The sock_diag protocol for AF_INET and AF_INET6 sockets, from
// linux/inet_diag.h: a dump request is an inet_diag_req_v2 for one family
// followed by an optional filter program (INET_DIAG_REQ_BYTECODE); every
// socket comes back as an inet_diag_msg, and SOCK_DESTROY takes an
// inet_diag_req_v2 naming one socket.
const (
	// sizeofReqV2 is sizeof(struct inet_diag_req_v2).
	sizeofReqV2 = 56
	// sizeofSockID is sizeof(struct inet_diag_sockid).
	sizeofSockID = 48
	// sizeofDiagMsg is sizeof(struct inet_diag_msg).
	sizeofDiagMsg = 72
	// reqBytecode is INET_DIAG_REQ_BYTECODE.
	reqBytecode = 1

	// Filter program opcodes (enum INET_DIAG_BC_*).
	bcJmp   = 1
	bcDCond = 8
	// bcOpLen is sizeof(struct inet_diag_bc_op): code, yes, no.
	bcOpLen = 4
	// bcCondLen is a D_COND operation with its inet_diag_hostcond, without
	// the address (4 bytes for IPv4, 16 for IPv6).
	bcCondLen = bcOpLen + 8
)

// TCP states (include/net/tcp_states.h) and the masks that select them.
const (
	tcpEstablished = 1
	tcpSynSent     = 2
	tcpSynRecv     = 3
	tcpFinWait1    = 4
	tcpFinWait2    = 5
	tcpCloseWait   = 8
	tcpLastAck     = 9
	tcpClosing     = 11

	// tcpStates are the states of a TCP socket that may still carry data
	// or wait for its peer: all but LISTEN, CLOSE, TIME_WAIT and the
	// request sockets of NEW_SYN_RECV, which belong to a listener.
	tcpStates = 1<<tcpEstablished | 1<<tcpSynSent | 1<<tcpSynRecv | 1<<tcpFinWait1 |
		1<<tcpFinWait2 | 1<<tcpCloseWait | 1<<tcpLastAck | 1<<tcpClosing
	// udpStates selects connected UDP sockets: connect() puts a UDP socket
	// in TCP_ESTABLISHED, an unconnected one stays in TCP_CLOSE.
	udpStates = 1 << tcpEstablished
)

// maxFilterDests bounds the destinations the kernel filter program tests
// (20 bytes each for IPv4, 32 for IPv6, tested in turn for every socket of
// the namespace); with more, the dump is filtered by state only and
// destinations are checked in userspace.
const maxFilterDests = 256

// diagSocket is one socket of a dump.
type diagSocket struct {
	// family is unix.AF_INET or unix.AF_INET6.
	family uint8
	state  uint8
	local  netip.AddrPort
	// remote is the peer, an IPv4 address also for an AF_INET6 socket
	// connected to an IPv4-mapped one (::ffff:a.b.c.d).
	remote netip.AddrPort
	cookie uint64
	inode  uint32
	// id is the inet_diag_sockid as the kernel sent it, which SOCK_DESTROY
	// takes back verbatim (the bound interface and the cookie included).
	id [sizeofSockID]byte
}

// diagConn is a NETLINK_SOCK_DIAG socket inside one network namespace; the
// kernel answers it about the sockets of that namespace.
type diagConn struct {
	h *nl.SocketHandle
}

// openDiag opens a sock_diag socket inside the namespace ns.
func openDiag(ns vnetns.NsHandle) (*diagConn, error) {
	var s *nl.NetlinkSocket
	err := netns.DoHandle(ns, func() (err error) {
		// With both namespaces closed, the library creates the socket in
		// the thread's namespace and leaves the thread alone.
		s, err = nl.GetNetlinkSocketAt(vnetns.None(), vnetns.None(), unix.NETLINK_SOCK_DIAG)
		return err
	})
	if err != nil {
		if s != nil {
			s.Close()
		}
		return nil, fmt.Errorf("open sock_diag socket: %w", err)
	}
	// Bounded waits: the kernel answers at once, but an agent must never
	// hang on a namespace.
	tv := unix.NsecToTimeval(diagTimeout.Nanoseconds())
	if err := errors.Join(s.SetSendTimeout(&tv), s.SetReceiveTimeout(&tv)); err != nil {
		s.Close()
		return nil, fmt.Errorf("set sock_diag socket timeouts: %w", err)
	}
	return &diagConn{h: &nl.SocketHandle{Socket: s}}, nil
}

func (c *diagConn) Close() { c.h.Close() }

// dump lists the namespace's sockets of address family family (AF_INET or
// AF_INET6) and protocol proto whose state is in the mask states; with
// dests, the kernel returns only sockets connected to one of them. An IPv4
// destination also selects AF_INET6 sockets connected to its IPv4-mapped
// address, as a dual-stack client's are.
func (c *diagConn) dump(family, proto uint8, states uint32, dests []netip.AddrPort) ([]diagSocket, error) {
	req := nl.NewNetlinkRequest(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_SOCK_DIAG: c.h}
	var id [sizeofSockID]byte
	req.AddData(reqV2(family, proto, states, id))
	if len(dests) > 0 {
		req.AddData(nl.NewRtAttr(reqBytecode, destFilter(dests)))
	}
	var (
		out  []diagSocket
		perr error
	)
	err := req.ExecuteIter(unix.NETLINK_SOCK_DIAG, unix.SOCK_DIAG_BY_FAMILY, func(msg []byte) bool {
		s, err := parseDiagMsg(msg)
		if err != nil {
			perr = err
			return false
		}
		out = append(out, s)
		return true
	})
	if err != nil {
		return out, err
	}
	return out, perr
}

// destroy destroys the socket s of protocol proto (SOCK_DESTROY). The kernel
// finds it by its addresses and checks its cookie, so a socket that closed
// since the dump, and one that took its addresses since, are left alone: it
// returns ENOENT (UDP) or ESTALE (TCP) for them.
func (c *diagConn) destroy(proto uint8, s diagSocket) error {
	req := nl.NewNetlinkRequest(unix.SOCK_DESTROY, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_SOCK_DIAG: c.h}
	req.AddData(reqV2(s.family, proto, 0, s.id))
	_, err := req.Execute(unix.NETLINK_SOCK_DIAG, 0)
	return err
}

// rawData is a part of a netlink request already encoded. The request's
// fixed header must be added as data, not with AddRawData, which the library
// puts after the attributes.
type rawData []byte

func (d rawData) Len() int          { return len(d) }
func (d rawData) Serialize() []byte { return d }

// reqV2 encodes an inet_diag_req_v2.
func reqV2(family, proto uint8, states uint32, id [sizeofSockID]byte) rawData {
	b := make(rawData, sizeofReqV2)
	b[0] = family
	b[1] = proto
	binary.NativeEndian.PutUint32(b[4:8], states)
	copy(b[8:], id[:])
	return b
}

// parseDiagMsg decodes an inet_diag_msg of an AF_INET or AF_INET6 socket.
func parseDiagMsg(b []byte) (diagSocket, error) {
	if len(b) < sizeofDiagMsg {
		return diagSocket{}, fmt.Errorf("sock_diag message of %d bytes, want at least %d", len(b), sizeofDiagMsg)
	}
	var s diagSocket
	s.family = b[0]
	s.state = b[1]
	copy(s.id[:], b[4:4+sizeofSockID])
	sport := binary.BigEndian.Uint16(b[4:6])
	dport := binary.BigEndian.Uint16(b[6:8])
	// inet_diag_sockid holds each address in 16 bytes; an IPv4 one is the
	// first 4.
	switch s.family {
	case unix.AF_INET:
		s.local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[8:12])), sport)
		s.remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[24:28])), dport)
	case unix.AF_INET6:
		s.local = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), sport)
		s.remote = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[24:40])).Unmap(), dport)
	default:
		return diagSocket{}, fmt.Errorf("sock_diag message for address family %d, want AF_INET or AF_INET6", s.family)
	}
	s.cookie = uint64(binary.NativeEndian.Uint32(b[44:48])) | uint64(binary.NativeEndian.Uint32(b[48:52]))<<32
	s.inode = binary.NativeEndian.Uint32(b[68:72])
	return s, nil
}

// destFilter compiles a sock_diag filter program that accepts a socket
// connected to one of dests (address and port, IPv4 or IPv6). The kernel
// matches an IPv4 destination against AF_INET sockets and against AF_INET6
// sockets connected to its IPv4-mapped address, and an IPv6 destination
// against AF_INET6 sockets only, so one program serves the dumps of both
// families.
//
// The kernel runs the program with len set to its length: an operation that
// holds jumps "yes" bytes ahead, one that fails jumps "no" bytes ahead; the
// socket is accepted if the program ends exactly at its end (len == 0) and
// rejected if it jumps past it. The kernel's audit walks the "yes" chain, so
// every "yes" must lead to the next operation. Hence, per destination:
//
//	D_COND dest  yes: the JMP below      no: the next D_COND, or 4 past the end
//	JMP          yes: (never taken)      no: the end, accepting
func destFilter(dests []netip.AddrPort) []byte {
	condLen := func(d netip.AddrPort) int { return bcCondLen + d.Addr().BitLen()/8 }
	n := 0
	for _, d := range dests {
		n += condLen(d) + bcOpLen
	}
	b := make([]byte, n)
	off := 0
	for i, d := range dests {
		cl := condLen(d)
		step := cl + bcOpLen
		rest := n - off
		no := step
		if i == len(dests)-1 {
			no = rest + 4
		}
		putOp(b[off:], bcDCond, cl, no)
		// struct inet_diag_hostcond: family, prefix length, port (-1 is
		// any) in host order, then the address.
		a := d.Addr().AsSlice()
		b[off+4] = unix.AF_INET
		if d.Addr().Is6() {
			b[off+4] = unix.AF_INET6
		}
		b[off+5] = uint8(8 * len(a))
		binary.NativeEndian.PutUint32(b[off+8:], uint32(d.Port()))
		copy(b[off+bcCondLen:], a)
		putOp(b[off+cl:], bcJmp, bcOpLen, rest-cl)
		off += step
	}
	return b
}

// putOp encodes a struct inet_diag_bc_op.
func putOp(b []byte, code uint8, yes, no int) {
	b[0] = code
	b[1] = uint8(yes)
	binary.NativeEndian.PutUint16(b[2:4], uint16(no))
}
