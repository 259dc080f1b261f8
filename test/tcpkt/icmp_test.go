package tcpkt_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// famPacket is what a table written once for both IP families needs of a
// packet builder: pktest.Builder for IPv4, pktest.Builder6 for IPv6.
type famPacket[B any] interface {
	WithMACs(src, dst net.HardwareAddr) B
	WithSrc(netip.AddrPort) B
	WithDst(netip.AddrPort) B
	WithPayload([]byte) B
	WithTTL(uint8) B
	Bytes() []byte
	IPBytes() []byte
}

// icmpFamily is one IP family's side of TestICMPErrors: its fixture, the
// fixture's addresses in that family, and its packets.
type icmpFamily[B famPacket[B]] struct {
	f                                               *fixture
	node, nodeB, router                             netip.Addr
	client, localWeb, remoteWeb, remoteDNS, snatSrc netip.AddrPort
	tcp                                             func(src, dst netip.AddrPort, flags pktest.TCPFlags) B
	udp                                             func(src, dst netip.AddrPort) B
	// icmp is an ICMP (ICMPv6) message quoting quote.
	icmp func(from, to netip.Addr, typ, code uint8, quote []byte) B
	// tooBig is what a router says of a packet that does not fit the
	// next hop: fragmentation needed with an MTU (ICMPv6: packet too big).
	tooBig func(from, to netip.Addr, quote []byte) B
	// The types and codes of the messages the table sends.
	unreachable, portUnreachable, timeExceeded, echo uint8
	// paramProblem is the type of the parameter problem error, IPv6's
	// only (0: none).
	paramProblem uint8
	// ipHeader is the length of the IP header of the packets.
	ipHeader int
}

func (fam icmpFamily[B]) np(port uint16) netip.AddrPort { return netip.AddrPortFrom(fam.node, port) }

func famFromOutside[B famPacket[B]](b B) B { return b.WithMACs(clientMAC, deviceMAC) }
func famToRouter[B famPacket[B]](b B) B    { return b.WithMACs(deviceMAC, routerMAC) }
func famToNodeB[B famPacket[B]](b B) B     { return b.WithMACs(deviceMAC, nodeBMAC) }
func famFromNodeB[B famPacket[B]](b B) B   { return b.WithMACs(nodeBMAC, deviceMAC) }

// icmpMTU is the MTU the routers of TestICMPErrors report.
const icmpMTU = 1400

// TestICMPErrors: ICMP and ICMPv6 errors about tracked flows reach the host
// that sent the quoted packet, quoting it as that host sent it: path MTU
// discovery through a NodePort, and a backend's port unreachable reaching
// the client. The outer and quoted addresses, ports and checksums are
// compared byte for byte with frames built apart (the ICMPv6 checksum over
// its pseudo-header, the quoted TCP and UDP checksums over theirs).
func TestICMPErrors(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) {
		f := newFixture(t, loadOptions{})
		f.sync(t, fixtureState())
		testICMPErrors(t, icmpFamily[pktest.Builder]{
			f: f, node: nodeAddr, nodeB: nodeBAddr, router: netip.MustParseAddr("198.51.100.1"),
			client: client, localWeb: localWeb, remoteWeb: remoteWeb, remoteDNS: remoteDNS, snatSrc: snatSrc,
			tcp: pktest.TCP, udp: pktest.UDP, icmp: pktest.ICMPError,
			tooBig: func(from, to netip.Addr, quote []byte) pktest.Builder {
				return pktest.ICMPUnreachable(from, to, pktest.ICMPFragNeeded, quote).WithNextHopMTU(icmpMTU)
			},
			unreachable: pktest.ICMPDestUnreachable, portUnreachable: pktest.ICMPPortUnreachable,
			timeExceeded: pktest.ICMPTimeExceeded, echo: pktest.ICMPEchoRequest, ipHeader: 20,
		})
	})
	t.Run("IPv6", func(t *testing.T) {
		f := newFixture6(t, loadOptions{})
		f.sync6(t, fixtureState6())
		testICMPErrors(t, icmpFamily[pktest.Builder6]{
			f: f.fixture, node: node6, nodeB: nodeB6, router: netip.MustParseAddr("2001:db8:51::1"),
			client: client6, localWeb: localWeb6, remoteWeb: remoteWeb6, remoteDNS: remoteDNS6, snatSrc: snatSrc6,
			tcp: pktest.TCP6, udp: pktest.UDP6, icmp: pktest.ICMPv6,
			tooBig: func(from, to netip.Addr, quote []byte) pktest.Builder6 {
				return pktest.ICMPv6(from, to, pktest.ICMPv6PacketTooBig, 0, quote).WithMTU(icmpMTU)
			},
			unreachable: pktest.ICMPv6DestUnreachable, portUnreachable: pktest.ICMPv6PortUnreachable,
			timeExceeded: pktest.ICMPv6TimeExceeded, echo: pktest.ICMPv6EchoRequest,
			paramProblem: pktest.ICMPv6ParamProblem, ipHeader: 40,
		})
	})
}

func testICMPErrors[B famPacket[B]](t *testing.T, fam icmpFamily[B]) {
	f := fam.f
	node, router, client := fam.node, fam.router, fam.client
	portUnreachable := func(from, to netip.Addr, quote []byte) B {
		return fam.icmp(from, to, fam.unreachable, fam.portUnreachable, quote)
	}
	synLocal := famFromOutside(fam.tcp(client, fam.np(npWebLocal), pktest.SYN))
	synRemote := famFromOutside(fam.tcp(client, fam.np(npWebRemote), pktest.SYN))
	query := famFromOutside(fam.udp(client, fam.np(npDNSRemote)).WithPayload([]byte("query")))
	// Replies as they left the node, and as their backends sent them.
	bigLocal := fam.tcp(fam.np(npWebLocal), client, pktest.ACK).WithPayload(make([]byte, 100))
	bigLocalSent := fam.tcp(fam.localWeb, client, pktest.ACK).WithPayload(make([]byte, 100))
	bigRemote := fam.tcp(fam.np(npWebRemote), client, pktest.ACK).WithPayload(make([]byte, 100))
	bigRemoteSent := fam.tcp(fam.remoteWeb, fam.snatSrc, pktest.ACK).WithPayload(make([]byte, 100))
	// The packets as node-b's pods got them, and as the client sent them
	// (the quote keeps the hop the node took off).
	synGot := fam.tcp(fam.snatSrc, fam.remoteWeb, pktest.SYN).WithTTL(63)
	synSent := fam.tcp(client, fam.np(npWebRemote), pktest.SYN).WithTTL(63)
	queryGot := fam.udp(fam.snatSrc, fam.remoteDNS).WithPayload([]byte("query")).WithTTL(63)
	querySent := fam.udp(client, fam.np(npDNSRemote)).WithPayload([]byte("query")).WithTTL(63)
	xlated, xlatedOK := f.counted(bpfobj.TcLbMetricLB_M_TC_ICMP_XLATE, 1)
	passed, passedOK := f.counted(bpfobj.TcLbMetricLB_M_TC_ICMP_XLATE, 0)

	rows := []row{
		{Case: pktest.Case{Name: "flow to a local backend", In: synLocal.Bytes(), Verdict: pktest.TCActOK, Out: synLocal.WithDst(fam.localWeb).Bytes()}},
		{Case: pktest.Case{Name: "flow to a remote backend", In: synRemote.Bytes(), Verdict: pktest.TCActRedirect, Out: famToNodeB(synRemote.WithSrc(fam.snatSrc).WithDst(fam.remoteWeb).WithTTL(63)).Bytes()}},
		{Case: pktest.Case{Name: "UDP flow to a remote backend", In: query.Bytes(), Verdict: pktest.TCActRedirect, Out: famToNodeB(queryGot).Bytes()}},
		{Case: pktest.Case{
			Name:    "too big for a local backend's reply: to the pod, about its own packet",
			In:      famFromOutside(fam.tooBig(router, node, bigLocal.IPBytes())).Bytes(),
			Verdict: pktest.TCActOK, Out: famFromOutside(fam.tooBig(router, fam.localWeb.Addr(), bigLocalSent.IPBytes())).Bytes(),
			Setup: xlated, Check: xlatedOK,
		}},
		{Case: pktest.Case{
			Name:    "too big for a remote backend's reply: to node-b's pod, about its packet to the SNAT port",
			In:      famFromOutside(fam.tooBig(router, node, bigRemote.IPBytes())).Bytes(),
			Verdict: pktest.TCActRedirect, Out: famToNodeB(fam.tooBig(router, fam.remoteWeb.Addr(), bigRemoteSent.IPBytes()).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "too big from a router on the way to node-b: to the client, about its own segment, from the router",
			In:      famFromOutside(fam.tooBig(router, node, synGot.IPBytes())).Bytes(),
			Verdict: pktest.TCActRedirect, Out: famToRouter(fam.tooBig(router, client.Addr(), synSent.IPBytes()).WithTTL(63)).Bytes(),
			Setup: xlated, Check: xlatedOK,
		}},
		{Case: pktest.Case{
			Name:    "port unreachable from node-b's pod: to the client from the NodePort, about its own datagram",
			In:      famFromNodeB(portUnreachable(fam.remoteDNS.Addr(), node, queryGot.IPBytes())).Bytes(),
			Verdict: pktest.TCActRedirect,
			Out:     famToRouter(portUnreachable(node, client.Addr(), querySent.IPBytes()).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "time exceeded on the way to node-b: to the client, about its own datagram",
			In:      famFromOutside(fam.icmp(router, node, fam.timeExceeded, 0, queryGot.IPBytes())).Bytes(),
			Verdict: pktest.TCActRedirect,
			Out:     famToRouter(fam.icmp(router, client.Addr(), fam.timeExceeded, 0, querySent.IPBytes()).WithTTL(63)).Bytes(),
		}},
		{egress: true, Case: pktest.Case{
			Name: "port unreachable from a local pod: from the NodePort, about the client's packet",
			In: famToRouter(portUnreachable(fam.localWeb.Addr(), client.Addr(),
				synLocal.WithDst(fam.localWeb).IPBytes())).Bytes(),
			Verdict: pktest.TCActOK,
			Out:     famToRouter(portUnreachable(node, client.Addr(), synLocal.IPBytes())).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "an error about a flow nobody tracks passes",
			In:      famFromOutside(fam.tooBig(router, node, fam.tcp(fam.np(22), client, pktest.ACK).IPBytes())).Bytes(),
			Verdict: pktest.TCActUnspec, Setup: passed, Check: passedOK,
		}},
		{Case: pktest.Case{
			Name:    "an error about a tracked flow but addressed elsewhere passes",
			In:      famFromOutside(fam.tooBig(router, fam.nodeB, bigLocal.IPBytes())).Bytes(),
			Verdict: pktest.TCActUnspec, Setup: passed, Check: passedOK,
		}},
		{Case: pktest.Case{
			Name:    "an error whose quote ends before the destination port passes",
			In:      famFromOutside(fam.tooBig(router, node, bigLocal.IPBytes()[:fam.ipHeader+3])).Bytes(),
			Verdict: pktest.TCActUnspec, Setup: passed, Check: passedOK,
		}},
		{Case: pktest.Case{
			Name:    "an echo request carrying a tracked reply passes",
			In:      famFromOutside(fam.icmp(router, node, fam.echo, 0, bigLocal.IPBytes())).Bytes(),
			Verdict: pktest.TCActUnspec, Setup: passed, Check: passedOK,
		}},
	}
	if fam.paramProblem != 0 {
		rows = append(rows, row{Case: pktest.Case{
			Name:    "parameter problem from node-b's pod: to the client from the NodePort, about its own segment",
			In:      famFromNodeB(fam.icmp(fam.remoteWeb.Addr(), node, fam.paramProblem, 0, synGot.IPBytes())).Bytes(),
			Verdict: pktest.TCActRedirect,
			Out:     famToRouter(fam.icmp(node, client.Addr(), fam.paramProblem, 0, synSent.IPBytes()).WithTTL(63)).Bytes(),
		}})
	}
	f.run(t, rows)
}
