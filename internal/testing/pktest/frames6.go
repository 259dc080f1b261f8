package pktest

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// ICMPv6 types and codes the proxy deals in: the error messages (RFC 4443
// 3), which quote the packet they are about, and informational ones.
const (
	ICMPv6DestUnreachable = 1
	ICMPv6PacketTooBig    = 2
	ICMPv6TimeExceeded    = 3
	ICMPv6ParamProblem    = 4
	ICMPv6EchoRequest     = 128
	ICMPv6NeighborSolicit = 135

	ICMPv6PortUnreachable = 4 // code of ICMPv6DestUnreachable

	ProtoICMPv6 = 58
)

// Builder6 describes an IPv6 frame with a TCP or UDP packet or an ICMPv6
// message, as Builder does IPv4 ones: every With method returns a modified
// copy, and Bytes encodes it with correct lengths and checksums (the TCP,
// UDP or ICMPv6 checksum over the IPv6 pseudo-header). The zero hop limit
// is DefaultTTL.
type Builder6 struct {
	src, dst       netip.AddrPort
	proto          uint8
	flags          TCPFlags
	seq, ack       uint32
	window         uint16
	payload        []byte
	hopLimit       uint8
	srcMAC, dstMAC net.HardwareAddr
	// l4Check, when set, replaces the computed L4 checksum.
	l4Check *uint16
	// The ICMPv6 type, code and the header's last four bytes (an
	// error's MTU or pointer, an echo's identifier and sequence).
	icmpType, icmpCode uint8
	icmpRest           uint32
}

// TCP6 is an IPv6 TCP segment from src to dst with flags.
func TCP6(src, dst netip.AddrPort, flags TCPFlags) Builder6 {
	return Builder6{src: src, dst: dst, proto: ProtoTCP, flags: flags, seq: 1000, window: 64240,
		srcMAC: DefaultSrcMAC, dstMAC: DefaultDstMAC}
}

// UDP6 is an IPv6 UDP datagram from src to dst.
func UDP6(src, dst netip.AddrPort) Builder6 {
	return Builder6{src: src, dst: dst, proto: ProtoUDP, srcMAC: DefaultSrcMAC, dstMAC: DefaultDstMAC}
}

// ICMPv6 is an ICMPv6 message of type typ and code from src to dst whose
// body, after the header's last four bytes (zero; see WithMTU), is body:
// for an error (ICMPv6DestUnreachable, ICMPv6PacketTooBig, ...) the packet
// it quotes, as Builder6.IPBytes returns it or a prefix.
func ICMPv6(src, dst netip.Addr, typ, code uint8, body []byte) Builder6 {
	return Builder6{src: netip.AddrPortFrom(src, 0), dst: netip.AddrPortFrom(dst, 0), proto: ProtoICMPv6,
		icmpType: typ, icmpCode: code, payload: slices.Clone(body), srcMAC: DefaultSrcMAC, dstMAC: DefaultDstMAC}
}

// WithMTU sets the MTU of a packet too big message (the ICMPv6 header's
// last four bytes; a parameter problem's pointer is in the same place).
func (b Builder6) WithMTU(mtu uint32) Builder6 { b.icmpRest = mtu; return b }

// WithSrc sets the source address and port.
func (b Builder6) WithSrc(ap netip.AddrPort) Builder6 { b.src = ap; return b }

// WithDst sets the destination address and port.
func (b Builder6) WithDst(ap netip.AddrPort) Builder6 { b.dst = ap; return b }

// WithPayload sets the L4 payload.
func (b Builder6) WithPayload(p []byte) Builder6 { b.payload = slices.Clone(p); return b }

// WithHopLimit sets the hop limit.
func (b Builder6) WithHopLimit(h uint8) Builder6 { b.hopLimit = h; return b }

// WithTTL is WithHopLimit, for tests written once for both families.
func (b Builder6) WithTTL(h uint8) Builder6 { return b.WithHopLimit(h) }

// WithSeq sets the TCP sequence and acknowledgement numbers.
func (b Builder6) WithSeq(seq, ack uint32) Builder6 { b.seq, b.ack = seq, ack; return b }

// WithWindow sets the TCP window.
func (b Builder6) WithWindow(w uint16) Builder6 { b.window = w; return b }

// WithMACs sets the Ethernet source and destination.
func (b Builder6) WithMACs(src, dst net.HardwareAddr) Builder6 {
	b.srcMAC, b.dstMAC = src, dst
	return b
}

// WithL4Checksum sets the L4 checksum field to c rather than the computed
// one (a UDP checksum of 0 says "none", which IPv6 forbids).
func (b Builder6) WithL4Checksum(c uint16) Builder6 { b.l4Check = &c; return b }

func (b Builder6) ipLayer(next layers.IPProtocol) *layers.IPv6 {
	hop := b.hopLimit
	if hop == 0 {
		hop = DefaultTTL
	}
	if !b.src.Addr().Is6() || !b.dst.Addr().Is6() {
		panic(fmt.Sprintf("pktest: IPv6 frame with addresses %s -> %s", b.src, b.dst))
	}
	return &layers.IPv6{Version: 6, HopLimit: hop, NextHeader: next,
		SrcIP: b.src.Addr().AsSlice(), DstIP: b.dst.Addr().AsSlice()}
}

func (b Builder6) l4Layer(ip *layers.IPv6) gopacket.SerializableLayer {
	if b.proto == ProtoICMPv6 {
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(b.icmpType, b.icmpCode)}
		if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
			panic(fmt.Sprintf("pktest: %v", err))
		}
		return icmp
	}
	if b.proto == ProtoTCP {
		f := b.flags
		tcp := &layers.TCP{SrcPort: layers.TCPPort(b.src.Port()), DstPort: layers.TCPPort(b.dst.Port()),
			Seq: b.seq, Ack: b.ack, Window: b.window,
			FIN: f&FIN != 0, SYN: f&SYN != 0, RST: f&RST != 0, PSH: f&PSH != 0, ACK: f&ACK != 0,
			URG: f&URG != 0, ECE: f&ECE != 0, CWR: f&CWR != 0}
		if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
			panic(fmt.Sprintf("pktest: %v", err))
		}
		return tcp
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(b.src.Port()), DstPort: layers.UDPPort(b.dst.Port())}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return udp
}

// IPBytes is the IPv6 packet without its link header.
func (b Builder6) IPBytes() []byte {
	ip := b.ipLayer(layers.IPProtocol(b.proto))
	payload := b.payload
	if b.proto == ProtoICMPv6 {
		payload = binary.BigEndian.AppendUint32(nil, b.icmpRest)
		payload = append(payload, b.payload...)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		ip, b.l4Layer(ip), gopacket.Payload(payload)); err != nil {
		panic(fmt.Sprintf("pktest: encode IPv6 packet: %v", err))
	}
	out := slices.Clone(buf.Bytes())
	if b.l4Check != nil {
		off := 40 + 6 // UDP
		switch b.proto {
		case ProtoTCP:
			off = 40 + 16
		case ProtoICMPv6:
			off = 40 + 2
		}
		out[off], out[off+1] = byte(*b.l4Check>>8), byte(*b.l4Check)
	}
	return out
}

// Bytes is the whole frame.
func (b Builder6) Bytes() []byte {
	link, err := linkHeader(b.srcMAC, b.dstMAC, nil, EtherTypeIPv6)
	if err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return append(link, b.IPBytes()...)
}

// ICMPv6Unreachable is a frame holding an ICMPv6 destination unreachable
// with code, from `from` to `to`, quoting quote, with hop limit 64, as the
// kernel's REJECT sends it.
func ICMPv6Unreachable(srcMAC, dstMAC net.HardwareAddr, from, to netip.Addr, code uint8, quote []byte) []byte {
	return ICMPv6(from, to, ICMPv6DestUnreachable, code, quote).WithHopLimit(64).WithMACs(srcMAC, dstMAC).Bytes()
}

// IPv6WithExtHeader is a frame holding a UDP datagram behind a hop-by-hop
// options header (padding only), as a packet with extension headers.
func IPv6WithExtHeader(srcMAC, dstMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: DefaultTTL, NextHeader: layers.IPProtocolIPv6HopByHop,
		SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	hbh := &layers.IPv6HopByHop{}
	hbh.NextHeader = layers.IPProtocolUDP
	hbh.Options = []*layers.IPv6HopByHopOption{{OptionType: 1, OptionLength: 4, OptionData: []byte{0, 0, 0, 0}}}
	udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return serializeFrame(srcMAC, dstMAC, EtherTypeIPv6, ip, hbh, udp, gopacket.Payload(payload))
}

// IPv6Fragment is a frame holding the first fragment of a UDP datagram
// from src to dst (a fragment header with the more-fragments bit, then the
// UDP header and payload).
func IPv6Fragment(srcMAC, dstMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: DefaultTTL, NextHeader: layers.IPProtocolIPv6Fragment,
		SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	frag := &layers.IPv6Fragment{NextHeader: layers.IPProtocolUDP, MoreFragments: true, Identification: 7}
	udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port()), Length: uint16(8 + 2*len(payload))}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, udp, gopacket.Payload(payload)); err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return serializeFrame(srcMAC, dstMAC, EtherTypeIPv6, ip, frag, gopacket.Payload(buf.Bytes()))
}

// IPv6NeighborSolicit is a frame holding a neighbour solicitation for
// target from src, to target's solicited-node multicast address.
func IPv6NeighborSolicit(srcMAC net.HardwareAddr, src, target netip.Addr) []byte {
	t := target.As16()
	dst := netip.AddrFrom16([16]byte{0xff, 0x02, 11: 1, 12: 0xff, 13: t[13], 14: t[14], 15: t[15]})
	dstMAC := net.HardwareAddr{0x33, 0x33, 0xff, t[13], t[14], t[15]}
	ip := &layers.IPv6{Version: 6, HopLimit: 255, NextHeader: layers.IPProtocolICMPv6,
		SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(ICMPv6NeighborSolicit, 0)}
	if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	ns := &layers.ICMPv6NeighborSolicitation{TargetAddress: target.AsSlice(),
		Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptSourceAddress, Data: srcMAC}}}
	return serializeFrame(srcMAC, dstMAC, EtherTypeIPv6, ip, icmp, ns)
}
