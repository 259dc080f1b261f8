package pktest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Default link addresses of built frames. Programs that bounce a packet
// (XDP_TX) usually swap them; say so in the expected packet with WithMACs.
var (
	DefaultSrcMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	DefaultDstMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
)

// Defaults of built IPv4 headers.
const (
	DefaultTTL = 64
	DefaultID  = 1
)

// TCPFlags are the flag bits of a TCP header.
type TCPFlags uint8

// TCP flags.
const (
	FIN TCPFlags = 1 << iota
	SYN
	RST
	PSH
	ACK
	URG
	ECE
	CWR
)

// ICMP types and destination-unreachable codes the proxy deals in.
const (
	ICMPEchoReply       = 0
	ICMPDestUnreachable = 3
	ICMPEchoRequest     = 8
	ICMPTimeExceeded    = 11

	ICMPNetUnreachable   = 0
	ICMPHostUnreachable  = 1
	ICMPProtoUnreachable = 2
	ICMPPortUnreachable  = 3
	ICMPFragNeeded       = 4
)

// IP protocol numbers.
const (
	ProtoICMP = 1
	ProtoTCP  = 6
	ProtoUDP  = 17
)

// EtherTypes of built frames.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeVLAN = 0x8100
	EtherTypeIPv6 = 0x86dd
)

// IPOption is one IPv4 header option. OptionLength counts the type and
// length bytes, as on the wire; NOP (1) and end of list (0) are one byte and
// ignore it.
type IPOption = layers.IPv4Option

// TCPOption is one TCP header option; the builder fills in OptionLength.
type TCPOption = layers.TCPOption

// IPOptNOP is the one-byte no-operation option.
func IPOptNOP() IPOption { return IPOption{OptionType: 1} }

// IPOptEOL is the one-byte end-of-options-list option.
func IPOptEOL() IPOption { return IPOption{OptionType: 0} }

// IPOptRouterAlert is the router alert option (RFC 2113) that IGMP and RSVP
// packets carry: the most common option on real networks.
func IPOptRouterAlert() IPOption {
	return IPOption{OptionType: 148, OptionLength: 4, OptionData: []byte{0, 0}}
}

// IPOptRecordRoute is an empty record route option with room for n
// addresses (at most 9 fit in the header).
func IPOptRecordRoute(n int) IPOption {
	data := make([]byte, 1+4*n)
	data[0] = 4 // pointer to the first free slot, counted from the option's start
	return IPOption{OptionType: 7, OptionLength: uint8(3 + 4*n), OptionData: data}
}

// TCPOptMSS is the maximum segment size option.
func TCPOptMSS(mss uint16) TCPOption {
	return TCPOption{OptionType: layers.TCPOptionKindMSS, OptionData: binary.BigEndian.AppendUint16(nil, mss)}
}

// TCPOptWindowScale is the window scale option.
func TCPOptWindowScale(shift uint8) TCPOption {
	return TCPOption{OptionType: layers.TCPOptionKindWindowScale, OptionData: []byte{shift}}
}

// TCPOptSACKPermitted is the SACK permitted option.
func TCPOptSACKPermitted() TCPOption {
	return TCPOption{OptionType: layers.TCPOptionKindSACKPermitted}
}

// TCPOptTimestamps is the timestamps option.
func TCPOptTimestamps(val, echo uint32) TCPOption {
	data := binary.BigEndian.AppendUint32(nil, val)
	return TCPOption{OptionType: layers.TCPOptionKindTimestamps, OptionData: binary.BigEndian.AppendUint32(data, echo)}
}

// TCPOptNOP is the one-byte no-operation option.
func TCPOptNOP() TCPOption { return TCPOption{OptionType: layers.TCPOptionKindNop} }

type l4Kind uint8

const (
	l4None l4Kind = iota
	l4TCP
	l4UDP
	l4ICMP
)

// override is a header field set by hand rather than computed.
type override[T any] struct {
	set bool
	v   T
}

func (o override[T]) or(def T) T {
	if o.set {
		return o.v
	}
	return def
}

func set[T any](v T) override[T] { return override[T]{set: true, v: v} }

// csumSpec says how a checksum field is filled: computed, a given value, or
// computed and then made wrong.
type csumSpec struct {
	mode  csumMode
	value uint16
}

type csumMode uint8

const (
	csumComputed csumMode = iota
	csumValue
	csumBad
)

// Builder describes an Ethernet frame carrying an IPv4 packet. The
// constructors (TCP, UDP, ICMPEcho, ICMPUnreachable, ICMPError, IPv4) set
// every field to a sensible default with correct lengths and checksums; the
// With methods return a modified copy, so one Builder can be the base of a
// whole table:
//
//	in := pktest.UDP(client, frontend).WithPayload([]byte("query"))
//	out := in.WithDst(backend)
//	pktest.Case{Name: "rewrite", In: in.Bytes(), Verdict: pktest.XDPTX, Out: out.Bytes()}
type Builder struct {
	srcMAC, dstMAC net.HardwareAddr
	vlans          []uint16
	etherType      override[uint16]

	src, dst netip.Addr
	tos, ttl uint8
	id       uint16
	df, mf   bool
	fragOff  int // in bytes
	ipOpts   []IPOption
	proto    uint8
	version  override[uint8]
	ihl      override[uint8]
	totalLen override[uint16]
	ipCsum   csumSpec

	l4             l4Kind
	sport, dport   uint16
	tcpFlags       TCPFlags
	seq, ack       uint32
	window, urgent uint16
	tcpOpts        []TCPOption
	icmpType       uint8
	icmpCode       uint8
	icmpRest       [4]byte
	l4Csum         csumSpec
	payload        []byte
	padding        int
}

func base(src, dst netip.Addr, proto uint8) Builder {
	return Builder{
		srcMAC: DefaultSrcMAC,
		dstMAC: DefaultDstMAC,
		src:    src,
		dst:    dst,
		ttl:    DefaultTTL,
		id:     DefaultID,
		proto:  proto,
	}
}

// TCP describes a TCP segment from src to dst with the given flags,
// sequence number 1, acknowledgment number 1 when ACK is set (else 0) and
// window 65535.
func TCP(src, dst netip.AddrPort, flags TCPFlags) Builder {
	b := base(src.Addr(), dst.Addr(), ProtoTCP)
	b.l4 = l4TCP
	b.sport, b.dport = src.Port(), dst.Port()
	b.tcpFlags = flags
	b.seq = 1
	if flags&ACK != 0 {
		b.ack = 1
	}
	b.window = 65535
	return b
}

// UDP describes a UDP datagram from src to dst.
func UDP(src, dst netip.AddrPort) Builder {
	b := base(src.Addr(), dst.Addr(), ProtoUDP)
	b.l4 = l4UDP
	b.sport, b.dport = src.Port(), dst.Port()
	return b
}

// ICMPEcho describes an ICMP echo request.
func ICMPEcho(src, dst netip.Addr, id, seq uint16) Builder {
	b := base(src, dst, ProtoICMP)
	b.l4 = l4ICMP
	b.icmpType = ICMPEchoRequest
	binary.BigEndian.PutUint16(b.icmpRest[0:], id)
	binary.BigEndian.PutUint16(b.icmpRest[2:], seq)
	return b
}

// ICMPEchoReplyTo describes an ICMP echo reply.
func ICMPEchoReplyTo(src, dst netip.Addr, id, seq uint16) Builder {
	b := ICMPEcho(src, dst, id, seq)
	b.icmpType = ICMPEchoReply
	return b
}

// ICMPError describes an ICMP error message of the given type and code
// from src to dst that quotes the IP packet quoted (as produced by
// Builder.Quote or Builder.IPBytes).
func ICMPError(src, dst netip.Addr, typ, code uint8, quoted []byte) Builder {
	b := base(src, dst, ProtoICMP)
	b.l4 = l4ICMP
	b.icmpType, b.icmpCode = typ, code
	b.payload = slices.Clone(quoted)
	return b
}

// ICMPUnreachable describes a destination unreachable message with the
// given code (ICMPPortUnreachable, ...) quoting an IP packet, such as the
// one a proxy sends back for a Service without endpoints:
//
//	pktest.ICMPUnreachable(node, client, pktest.ICMPPortUnreachable, req.Quote())
func ICMPUnreachable(src, dst netip.Addr, code uint8, quoted []byte) Builder {
	return ICMPError(src, dst, ICMPDestUnreachable, code, quoted)
}

// IPv4 describes an IPv4 packet of any protocol whose payload is given
// with WithPayload: for protocols the programs do not know (GRE, SCTP, ...).
func IPv4(src, dst netip.Addr, proto uint8) Builder {
	return base(src, dst, proto)
}

func (b Builder) clone() Builder {
	b.vlans = slices.Clone(b.vlans)
	b.ipOpts = slices.Clone(b.ipOpts)
	b.tcpOpts = slices.Clone(b.tcpOpts)
	b.payload = slices.Clone(b.payload)
	return b
}

func (b Builder) with(f func(*Builder)) Builder {
	c := b.clone()
	f(&c)
	return c
}

// WithMACs sets the Ethernet source and destination.
func (b Builder) WithMACs(src, dst net.HardwareAddr) Builder {
	return b.with(func(c *Builder) { c.srcMAC, c.dstMAC = src, dst })
}

// WithVLAN puts the frame into 802.1Q tags, outermost first.
func (b Builder) WithVLAN(ids ...uint16) Builder {
	return b.with(func(c *Builder) { c.vlans = slices.Clone(ids) })
}

// WithEtherType sets the EtherType that announces the IP header (the inner
// one under VLAN tags), for frames that lie about what they carry.
func (b Builder) WithEtherType(t uint16) Builder {
	return b.with(func(c *Builder) { c.etherType = set(t) })
}

// WithSrc sets the source address and port.
func (b Builder) WithSrc(a netip.AddrPort) Builder {
	return b.with(func(c *Builder) { c.src, c.sport = a.Addr(), a.Port() })
}

// WithDst sets the destination address and port.
func (b Builder) WithDst(a netip.AddrPort) Builder {
	return b.with(func(c *Builder) { c.dst, c.dport = a.Addr(), a.Port() })
}

// WithSrcAddr sets the source address only.
func (b Builder) WithSrcAddr(a netip.Addr) Builder {
	return b.with(func(c *Builder) { c.src = a })
}

// WithDstAddr sets the destination address only.
func (b Builder) WithDstAddr(a netip.Addr) Builder {
	return b.with(func(c *Builder) { c.dst = a })
}

// WithSrcPort sets the TCP or UDP source port only.
func (b Builder) WithSrcPort(p uint16) Builder {
	return b.with(func(c *Builder) { c.sport = p })
}

// WithDstPort sets the TCP or UDP destination port only.
func (b Builder) WithDstPort(p uint16) Builder {
	return b.with(func(c *Builder) { c.dport = p })
}

// WithTOS sets the type of service byte (DSCP and ECN).
func (b Builder) WithTOS(tos uint8) Builder {
	return b.with(func(c *Builder) { c.tos = tos })
}

// WithTTL sets the time to live.
func (b Builder) WithTTL(ttl uint8) Builder {
	return b.with(func(c *Builder) { c.ttl = ttl })
}

// WithID sets the IP identification.
func (b Builder) WithID(id uint16) Builder {
	return b.with(func(c *Builder) { c.id = id })
}

// WithDF sets the don't-fragment flag.
func (b Builder) WithDF() Builder {
	return b.with(func(c *Builder) { c.df = true })
}

// WithMF sets the more-fragments flag: the packet becomes a first (or, with
// WithFragOffset, a middle) fragment that still carries its L4 header.
func (b Builder) WithMF() Builder {
	return b.with(func(c *Builder) { c.mf = true })
}

// WithFragOffset sets the fragment offset in bytes (a multiple of 8). The
// L4 header stays in the payload, so a non-first fragment starts with bytes
// that look like ports: exactly what a program must not parse as such.
// For real fragments of one datagram use Fragments.
func (b Builder) WithFragOffset(bytes int) Builder {
	return b.with(func(c *Builder) { c.fragOff = bytes })
}

// WithIPOptions sets the IPv4 options; the header is padded to a multiple
// of four bytes and IHL follows.
func (b Builder) WithIPOptions(opts ...IPOption) Builder {
	return b.with(func(c *Builder) { c.ipOpts = slices.Clone(opts) })
}

// WithProtocol sets the IP protocol field without changing what follows
// the header.
func (b Builder) WithProtocol(p uint8) Builder {
	return b.with(func(c *Builder) { c.proto = p })
}

// WithVersion sets the IP version field (4 by default) of a malformed packet.
func (b Builder) WithVersion(v uint8) Builder {
	return b.with(func(c *Builder) { c.version = set(v) })
}

// WithIHL sets the header length field (in 32-bit words) without changing
// the header's bytes, for malformed packets: below 5, or past the options.
func (b Builder) WithIHL(words uint8) Builder {
	return b.with(func(c *Builder) { c.ihl = set(words) })
}

// WithTotalLength sets the IP total length field without changing the
// packet's bytes, for malformed packets.
func (b Builder) WithTotalLength(n uint16) Builder {
	return b.with(func(c *Builder) { c.totalLen = set(n) })
}

// WithIPChecksum sets the IP header checksum to v instead of computing it.
func (b Builder) WithIPChecksum(v uint16) Builder {
	return b.with(func(c *Builder) { c.ipCsum = csumSpec{mode: csumValue, value: v} })
}

// WithBadIPChecksum makes the IP header checksum wrong.
func (b Builder) WithBadIPChecksum() Builder {
	return b.with(func(c *Builder) { c.ipCsum = csumSpec{mode: csumBad} })
}

// WithL4Checksum sets the TCP, UDP or ICMP checksum to v instead of
// computing it. For UDP, 0 means the sender computed none (RFC 768).
func (b Builder) WithL4Checksum(v uint16) Builder {
	return b.with(func(c *Builder) { c.l4Csum = csumSpec{mode: csumValue, value: v} })
}

// WithBadL4Checksum makes the TCP, UDP or ICMP checksum wrong (never 0 for
// UDP, which would mean no checksum).
func (b Builder) WithBadL4Checksum() Builder {
	return b.with(func(c *Builder) { c.l4Csum = csumSpec{mode: csumBad} })
}

// WithPayload sets the bytes after the L4 header (after the IP header for
// IPv4, and after the quoted packet's place for ICMP errors: it replaces it).
func (b Builder) WithPayload(p []byte) Builder {
	return b.with(func(c *Builder) { c.payload = slices.Clone(p) })
}

// WithPadding appends n zero bytes after the IP packet, as Ethernet pads
// short frames to 60 bytes: the IP total length, not the frame, says where
// the packet ends.
func (b Builder) WithPadding(n int) Builder {
	return b.with(func(c *Builder) { c.padding = n })
}

// WithTCPFlags sets the TCP flags.
func (b Builder) WithTCPFlags(f TCPFlags) Builder {
	return b.with(func(c *Builder) { c.tcpFlags = f })
}

// WithSeq sets the TCP sequence number.
func (b Builder) WithSeq(seq uint32) Builder {
	return b.with(func(c *Builder) { c.seq = seq })
}

// WithAck sets the TCP acknowledgment number.
func (b Builder) WithAck(ack uint32) Builder {
	return b.with(func(c *Builder) { c.ack = ack })
}

// WithWindow sets the TCP window.
func (b Builder) WithWindow(w uint16) Builder {
	return b.with(func(c *Builder) { c.window = w })
}

// WithTCPOptions sets the TCP options; the header is padded to a multiple
// of four bytes and the data offset follows.
func (b Builder) WithTCPOptions(opts ...TCPOption) Builder {
	return b.with(func(c *Builder) { c.tcpOpts = slices.Clone(opts) })
}

// WithNextHopMTU sets the next-hop MTU of a fragmentation-needed message
// (the second half of the ICMP header's rest).
func (b Builder) WithNextHopMTU(mtu uint16) Builder {
	return b.with(func(c *Builder) { binary.BigEndian.PutUint16(c.icmpRest[2:], mtu) })
}

// Bytes returns the frame. It panics if the Builder describes something
// that cannot be encoded (an IPv6 address in the IPv4 header, an option
// longer than its length byte): a fixture is code, and a broken one must
// stop the test rather than feed the program something else.
func (b Builder) Bytes() []byte {
	pkt, err := b.Build()
	if err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return pkt
}

// IPBytes returns the IP packet without its link header (and without link
// padding).
func (b Builder) IPBytes() []byte {
	frame := b.Bytes()
	return frame[b.linkLen() : len(frame)-b.padding]
}

// Quote returns what an ICMP error about this packet carries (RFC 792):
// its IP header and the first 8 bytes of what follows, which hold the ports.
func (b Builder) Quote() []byte {
	ip := b.IPBytes()
	n := int(ip[0]&0x0f)*4 + 8
	return ip[:min(n, len(ip))]
}

// Build returns the frame, or an error if the Builder describes something
// that cannot be encoded.
func (b Builder) Build() ([]byte, error) {
	frame, err := b.serialize(b.l4Layers(), b.ipOpts, b.fragOff, b.mf)
	if err != nil {
		return nil, err
	}
	return frame, nil
}

// Fragments splits the packet into IPv4 fragments as a router would:
// each carries at most size bytes of the original IP payload (a multiple of
// 8 for all but the last), the first one all options and the L4 header with
// the checksum over the whole datagram, the later ones only the options
// marked to be copied. A size smaller than the L4 header splits the header
// itself across fragments.
func (b Builder) Fragments(size int) ([][]byte, error) {
	if size <= 0 || size%8 != 0 {
		return nil, fmt.Errorf("fragment size %d is not a positive multiple of 8", size)
	}
	whole, err := b.Build()
	if err != nil {
		return nil, err
	}
	ip := whole[b.linkLen() : len(whole)-b.padding]
	ihl := int(ip[0]&0x0f) * 4
	body := ip[ihl:]
	var copied []IPOption
	for _, o := range b.ipOpts {
		if o.OptionType&0x80 != 0 {
			copied = append(copied, o)
		}
	}
	var frags [][]byte
	for off := 0; off < len(body); off += size {
		chunk := body[off:min(off+size, len(body))]
		opts := b.ipOpts
		if off > 0 {
			opts = copied
		}
		last := off+size >= len(body)
		frame, err := b.serialize([]gopacket.SerializableLayer{gopacket.Payload(chunk)}, opts, b.fragOff+off, !last || b.mf)
		if err != nil {
			return nil, err
		}
		frags = append(frags, frame)
	}
	return frags, nil
}

// MustFragments is Fragments for fixtures: it panics on a bad size.
func (b Builder) MustFragments(size int) [][]byte {
	frags, err := b.Fragments(size)
	if err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return frags
}

func (b Builder) linkLen() int { return 14 + 4*len(b.vlans) }

func (b Builder) l4Layers() []gopacket.SerializableLayer {
	payload := gopacket.Payload(b.payload)
	switch b.l4 {
	case l4TCP:
		return []gopacket.SerializableLayer{&layers.TCP{
			SrcPort: layers.TCPPort(b.sport), DstPort: layers.TCPPort(b.dport),
			Seq: b.seq, Ack: b.ack, Window: b.window, Urgent: b.urgent,
			FIN: b.tcpFlags&FIN != 0, SYN: b.tcpFlags&SYN != 0, RST: b.tcpFlags&RST != 0,
			PSH: b.tcpFlags&PSH != 0, ACK: b.tcpFlags&ACK != 0, URG: b.tcpFlags&URG != 0,
			ECE: b.tcpFlags&ECE != 0, CWR: b.tcpFlags&CWR != 0,
			Options: slices.Clone(b.tcpOpts),
		}, payload}
	case l4UDP:
		return []gopacket.SerializableLayer{&layers.UDP{
			SrcPort: layers.UDPPort(b.sport), DstPort: layers.UDPPort(b.dport),
		}, payload}
	case l4ICMP:
		return []gopacket.SerializableLayer{&layers.ICMPv4{
			TypeCode: layers.CreateICMPv4TypeCode(b.icmpType, b.icmpCode),
			Id:       binary.BigEndian.Uint16(b.icmpRest[0:]),
			Seq:      binary.BigEndian.Uint16(b.icmpRest[2:]),
		}, payload}
	}
	return []gopacket.SerializableLayer{payload}
}

// serialize encodes the frame with the given layers above IPv4, then
// applies the hand-set fields and checksums.
func (b Builder) serialize(upper []gopacket.SerializableLayer, opts []IPOption, fragOff int, mf bool) ([]byte, error) {
	if !b.src.Is4() || !b.dst.Is4() {
		return nil, fmt.Errorf("IPv4 packet needs IPv4 addresses, have %v -> %v", b.src, b.dst)
	}
	if fragOff%8 != 0 || fragOff/8 > 0x1fff || fragOff < 0 {
		return nil, fmt.Errorf("fragment offset %d is not a multiple of 8 below 65536", fragOff)
	}
	var flags layers.IPv4Flag
	if b.df {
		flags |= layers.IPv4DontFragment
	}
	if mf {
		flags |= layers.IPv4MoreFragments
	}
	ip := &layers.IPv4{
		Version: 4, TOS: b.tos, Id: b.id, Flags: flags, FragOffset: uint16(fragOff / 8),
		TTL: b.ttl, Protocol: layers.IPProtocol(b.proto),
		SrcIP: b.src.AsSlice(), DstIP: b.dst.AsSlice(),
		Options: slices.Clone(opts),
	}
	for _, l := range upper {
		switch l4 := l.(type) {
		case *layers.TCP:
			if err := l4.SetNetworkLayerForChecksum(ip); err != nil {
				return nil, err
			}
		case *layers.UDP:
			if err := l4.SetNetworkLayerForChecksum(ip); err != nil {
				return nil, err
			}
		}
	}
	buf := gopacket.NewSerializeBuffer()
	all := append([]gopacket.SerializableLayer{ip}, upper...)
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, all...); err != nil {
		return nil, fmt.Errorf("encode %v packet: %w", layers.IPProtocol(b.proto), err)
	}
	link, err := linkHeader(b.srcMAC, b.dstMAC, b.vlans, b.etherType.or(EtherTypeIPv4))
	if err != nil {
		return nil, err
	}
	frame := append(link, buf.Bytes()...)
	hdr := frame[len(link):]
	ihl := int(hdr[0]&0x0f) * 4
	if _, onlyPayload := upper[0].(gopacket.Payload); !onlyPayload {
		if err := b.applyL4Checksum(hdr[:ihl], hdr[ihl:]); err != nil {
			return nil, err
		}
	}
	if b.version.set || b.ihl.set || b.totalLen.set {
		hdr[0] = b.version.or(4)<<4 | b.ihl.or(hdr[0]&0x0f)&0x0f
		if b.totalLen.set {
			binary.BigEndian.PutUint16(hdr[2:], b.totalLen.v)
		}
		// The checksum covers the header a receiver sees: as long as the
		// declared length says, within the packet.
		declared := min(max(int(hdr[0]&0x0f)*4, 20), len(hdr))
		hdr[10], hdr[11] = 0, 0
		binary.BigEndian.PutUint16(hdr[10:], Checksum(hdr[:declared]))
	}
	applyChecksum(hdr[10:12], b.ipCsum)
	return append(frame, make([]byte, b.padding)...), nil
}

// linkHeader encodes an Ethernet header with 802.1Q tags. It is written
// here because the packet library pads every frame to the 60-byte Ethernet
// minimum, and whether a frame is padded is for the fixture to say
// (WithPadding): a frame from a veth peer is not.
func linkHeader(src, dst net.HardwareAddr, vlans []uint16, etherType uint16) ([]byte, error) {
	if len(src) != 6 || len(dst) != 6 {
		return nil, fmt.Errorf("ethernet addresses must be 6 bytes, have %v -> %v", src, dst)
	}
	h := make([]byte, 0, 14+4*len(vlans))
	h = append(h, dst...)
	h = append(h, src...)
	for _, id := range vlans {
		if id > 0x0fff {
			return nil, fmt.Errorf("VLAN id %d does not fit in 12 bits", id)
		}
		h = binary.BigEndian.AppendUint16(h, EtherTypeVLAN)
		h = binary.BigEndian.AppendUint16(h, id)
	}
	return binary.BigEndian.AppendUint16(h, etherType), nil
}

// applyL4Checksum sets the hand-set L4 checksum, if any, on the segment l4
// that follows the IP header ip.
func (b Builder) applyL4Checksum(ip, l4 []byte) error {
	if b.l4Csum.mode == csumComputed {
		return nil
	}
	var off int
	switch b.l4 {
	case l4TCP:
		off = 16
	case l4UDP:
		off = 6
	case l4ICMP:
		off = 2
	default:
		return errors.New("checksum override on a packet without TCP, UDP or ICMP header")
	}
	applyChecksum(l4[off:off+2], b.l4Csum)
	return nil
}

// applyChecksum rewrites a computed checksum field as spec says. A bad
// checksum is one that no verifier accepts: neither the right value nor
// its other ones' complement form, nor UDP's "no checksum" zero.
func applyChecksum(field []byte, spec csumSpec) {
	switch spec.mode {
	case csumValue:
		binary.BigEndian.PutUint16(field, spec.value)
	case csumBad:
		good := binary.BigEndian.Uint16(field)
		bad := ^good
		if good == 0 || good == 0xffff {
			bad = 0x1234
		}
		binary.BigEndian.PutUint16(field, bad)
	}
}
