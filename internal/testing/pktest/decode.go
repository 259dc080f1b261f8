package pktest

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Field is one decoded header field of a frame: its name as in Diff
// ("ipv4.dst"), its value as text, and the bytes it came from.
type Field struct {
	Name  string
	Value string
	// Off and Len locate the field in the frame (Len 0 for fields that are
	// derived rather than read, such as "truncated").
	Off, Len int
}

// Span is the part of a frame one header (or the payload, or the link
// padding) occupies. Need is the length the header says it has, which is
// more than Len when the frame is cut short inside it.
type Span struct {
	Name           string
	Off, Len, Need int
}

// Ethernet is a decoded Ethernet header.
type Ethernet struct {
	Dst, Src net.HardwareAddr
	// Type is the EtherType of what follows the VLAN tags, if any.
	Type  uint16
	VLANs []uint16
}

// IPv4Header is a decoded IPv4 header.
type IPv4Header struct {
	Version, IHL   uint8
	TOS            uint8
	TotalLength    uint16
	ID             uint16
	DF, MF         bool
	FragOffset     int // in bytes
	TTL, Protocol  uint8
	Checksum       uint16
	Src, Dst       netip.Addr
	Options        []byte
	HeaderComplete bool
}

// IPv6Header is a decoded IPv6 header.
type IPv6Header struct {
	Version       uint8
	TrafficClass  uint8
	FlowLabel     uint32
	PayloadLength uint16
	NextHeader    uint8
	HopLimit      uint8
	Src, Dst      netip.Addr
}

// Ports are the ports of a TCP or UDP header.
type Ports struct {
	Src, Dst uint16
}

// TCPHeader is a decoded TCP header.
type TCPHeader struct {
	Ports
	Seq, Ack       uint32
	DataOffset     uint8
	Flags          TCPFlags
	Window         uint16
	Checksum       uint16
	Urgent         uint16
	Options        []byte
	HeaderComplete bool
}

// UDPHeader is a decoded UDP header.
type UDPHeader struct {
	Ports
	Length   uint16
	Checksum uint16
}

// ICMPHeader is a decoded ICMP or ICMPv6 header. Inner is the packet an
// error message quotes.
type ICMPHeader struct {
	Type, Code uint8
	Checksum   uint16
	Rest       [4]byte
	Inner      *Packet
}

// Packet is a decoded frame. Decoding never fails: it goes as far as the
// bytes allow and says where and why it stopped, so that malformed and
// truncated frames can be compared field by field too.
type Packet struct {
	Eth  *Ethernet
	IPv4 *IPv4Header
	IPv6 *IPv6Header
	TCP  *TCPHeader
	UDP  *UDPHeader
	ICMP *ICMPHeader
	// Payload is what follows the last decoded header, up to the IP total
	// length; Trailer is what follows the IP total length (link padding).
	Payload, Trailer []byte
	// Problems says what is truncated or malformed, if anything.
	Problems  []string
	Checksums []ChecksumCheck
	Fields    []Field
	Spans     []Span
}

// Decode decodes an Ethernet frame with Ethernet (and 802.1Q tags), IPv4 or
// IPv6, TCP, UDP and ICMP or ICMPv6 headers (with the packet an error
// quotes), and verifies every checksum in it. ARP frames get their link
// header decoded and the rest as payload, and so do IPv6 extension headers.
func Decode(frame []byte) *Packet {
	p := &Packet{}
	d := &decoder{p: p, frame: frame}
	d.ethernet()
	return p
}

// DecodeIPv4 decodes an IP packet without link header, such as the one an ICMP
// error quotes or Builder.IPBytes returns.
func DecodeIPv4(pkt []byte) *Packet {
	p := &Packet{}
	d := &decoder{p: p, frame: pkt}
	d.ipv4(0, len(pkt), "ipv4", false)
	return p
}

type decoder struct {
	p     *Packet
	frame []byte
}

func (d *decoder) field(name string, off, n int, format string, args ...any) {
	d.p.Fields = append(d.p.Fields, Field{Name: name, Value: fmt.Sprintf(format, args...), Off: off, Len: n})
}

func (d *decoder) span(name string, off, have, need int) {
	d.p.Spans = append(d.p.Spans, Span{Name: name, Off: off, Len: have, Need: need})
}

func (d *decoder) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	d.p.Problems = append(d.p.Problems, msg)
	d.field("problem", 0, 0, "%s", msg)
}

// need checks that the header name of n bytes at off fits below end, and
// records its span.
func (d *decoder) need(name string, off, end, n int) bool {
	have := min(n, end-off)
	d.span(name, off, have, n)
	if have < n {
		d.problem("truncated: %s header has %d of %d bytes", name, have, n)
		return false
	}
	return true
}

func (d *decoder) rest(name string, off, end int) []byte {
	if off >= end {
		return nil
	}
	b := d.frame[off:end]
	d.span(name, off, len(b), len(b))
	d.field(name, off, len(b), "%s", describeBytes(b))
	return b
}

func describeBytes(b []byte) string {
	const show = 32
	if len(b) <= show {
		return fmt.Sprintf("%d bytes %s", len(b), hex.EncodeToString(b))
	}
	return fmt.Sprintf("%d bytes %s...", len(b), hex.EncodeToString(b[:show]))
}

func (d *decoder) u8(off int) uint8   { return d.frame[off] }
func (d *decoder) u16(off int) uint16 { return binary.BigEndian.Uint16(d.frame[off:]) }
func (d *decoder) u32(off int) uint32 { return binary.BigEndian.Uint32(d.frame[off:]) }

func (d *decoder) ethernet() {
	if !d.need("ethernet", 0, len(d.frame), 14) {
		return
	}
	eth := &Ethernet{Dst: net.HardwareAddr(d.frame[0:6]), Src: net.HardwareAddr(d.frame[6:12])}
	d.p.Eth = eth
	d.field("eth.dst", 0, 6, "%s", eth.Dst)
	d.field("eth.src", 6, 6, "%s", eth.Src)
	typ := d.u16(12)
	d.field("eth.type", 12, 2, "%s", etherTypeName(typ))
	off := 14
	for i := 0; typ == EtherTypeVLAN || typ == 0x88a8; i++ {
		name := fmt.Sprintf("vlan[%d]", i)
		if !d.need(name, off, len(d.frame), 4) {
			return
		}
		id := d.u16(off) & 0x0fff
		eth.VLANs = append(eth.VLANs, id)
		d.field(name+".id", off, 2, "%d", id)
		typ = d.u16(off + 2)
		d.field(name+".type", off+2, 2, "%s", etherTypeName(typ))
		off += 4
	}
	eth.Type = typ
	switch typ {
	case EtherTypeIPv4:
		d.ipv4(off, len(d.frame), "ipv4", false)
	case EtherTypeIPv6:
		d.ipv6(off, len(d.frame), "ipv6", false)
	case EtherTypeARP:
		if d.need("arp", off, len(d.frame), 28) {
			d.field("arp.op", off+6, 2, "%d", d.u16(off+6))
			sender, _ := netip.AddrFromSlice(d.frame[off+14 : off+18])
			target, _ := netip.AddrFromSlice(d.frame[off+24 : off+28])
			d.field("arp.sender_ip", off+14, 4, "%s", sender)
			d.field("arp.target_ip", off+24, 4, "%s", target)
			d.p.Trailer = d.rest("trailer", off+28, len(d.frame))
		}
	default:
		d.p.Payload = d.rest("payload", off, len(d.frame))
	}
}

func etherTypeName(t uint16) string {
	names := map[uint16]string{
		EtherTypeIPv4: "IPv4", EtherTypeARP: "ARP", EtherTypeVLAN: "802.1Q",
		0x88a8: "802.1ad", EtherTypeIPv6: "IPv6",
	}
	if n, ok := names[t]; ok {
		return fmt.Sprintf("%#04x (%s)", t, n)
	}
	return fmt.Sprintf("%#04x", t)
}

func protoName(p uint8) string {
	switch p {
	case ProtoICMP:
		return "1 (ICMP)"
	case ProtoTCP:
		return "6 (TCP)"
	case ProtoUDP:
		return "17 (UDP)"
	case ProtoICMPv6:
		return "58 (ICMPv6)"
	}
	return fmt.Sprintf("%d", p)
}

// ipv4 decodes the IPv4 packet at off, whose bytes end at end. quoted is
// set for the packet inside an ICMP error, of which only the first 8 bytes
// after the IP header are present.
func (d *decoder) ipv4(off, end int, prefix string, quoted bool) {
	if !d.need(prefix, off, end, 20) {
		return
	}
	ip := &IPv4Header{
		Version:     d.u8(off) >> 4,
		IHL:         d.u8(off) & 0x0f,
		TOS:         d.u8(off + 1),
		TotalLength: d.u16(off + 2),
		ID:          d.u16(off + 4),
		DF:          d.u16(off+6)&0x4000 != 0,
		MF:          d.u16(off+6)&0x2000 != 0,
		FragOffset:  int(d.u16(off+6)&0x1fff) * 8,
		TTL:         d.u8(off + 8),
		Protocol:    d.u8(off + 9),
		Checksum:    d.u16(off + 10),
	}
	ip.Src, _ = netip.AddrFromSlice(d.frame[off+12 : off+16])
	ip.Dst, _ = netip.AddrFromSlice(d.frame[off+16 : off+20])
	if !quoted {
		d.p.IPv4 = ip
	}
	var flags []string
	if d.u16(off+6)&0x8000 != 0 {
		flags = append(flags, "reserved")
	}
	if ip.DF {
		flags = append(flags, "DF")
	}
	if ip.MF {
		flags = append(flags, "MF")
	}
	d.field(prefix+".version", off, 1, "%d", ip.Version)
	d.field(prefix+".ihl", off, 1, "%d", ip.IHL)
	d.field(prefix+".tos", off+1, 1, "%#02x", ip.TOS)
	d.field(prefix+".length", off+2, 2, "%d", ip.TotalLength)
	d.field(prefix+".id", off+4, 2, "%d", ip.ID)
	d.field(prefix+".flags", off+6, 1, "%s", strings.Join(flags, "|"))
	d.field(prefix+".frag_offset", off+6, 2, "%d", ip.FragOffset)
	d.field(prefix+".ttl", off+8, 1, "%d", ip.TTL)
	d.field(prefix+".protocol", off+9, 1, "%s", protoName(ip.Protocol))
	csumField := len(d.p.Fields)
	d.field(prefix+".checksum", off+10, 2, "%#04x", ip.Checksum)
	d.field(prefix+".src", off+12, 4, "%s", ip.Src)
	d.field(prefix+".dst", off+16, 4, "%s", ip.Dst)
	if ip.Version != 4 {
		d.problem("malformed: %s.version is %d", prefix, ip.Version)
	}
	hlen := int(ip.IHL) * 4
	if hlen < 20 {
		d.problem("malformed: %s.ihl %d is below 5", prefix, ip.IHL)
		d.rest("payload", off+20, end)
		return
	}
	if hlen > 20 {
		if !d.need(prefix+" options", off+20, end, hlen-20) {
			return
		}
		ip.Options = d.frame[off+20 : off+hlen]
		d.field(prefix+".options", off+20, hlen-20, "%x", ip.Options)
	}
	ip.HeaderComplete = true
	check := ChecksumCheck{Field: prefix + ".checksum", Got: ip.Checksum, Status: ChecksumOK}
	hdr := append([]byte(nil), d.frame[off:off+hlen]...)
	// A receiver accepts the header when all of it sums to all ones, which
	// both forms of a zero checksum do; Want is the form a sender computes.
	if fold(sum(hdr, 0)) != 0xffff {
		check.Status = ChecksumBad
	}
	hdr[10], hdr[11] = 0, 0
	check.Want = Checksum(hdr)
	d.p.Checksums = append(d.p.Checksums, check)
	d.p.Fields[csumField].Value = check.String()

	total := int(ip.TotalLength)
	ipEnd := off + total
	switch {
	case total < hlen:
		d.problem("malformed: %s.length %d is below the header length %d", prefix, total, hlen)
		ipEnd = end
	case ipEnd > end && !quoted:
		d.problem("truncated: %s packet has %d of %d bytes", prefix, end-off, total)
		ipEnd = end
	case ipEnd > end:
		ipEnd = end
	}
	l4 := l4Context{
		prefix: strings.TrimSuffix(prefix, "ipv4"), src: ip.Src.AsSlice(), dst: ip.Dst.AsSlice(),
		proto: ip.Protocol, fragment: ip.FragOffset > 0 || ip.MF, off: off + hlen, end: ipEnd,
		length: total - hlen, complete: off+total <= end && total >= hlen,
	}
	switch {
	case quoted:
		l4.unverifiable = "quoted in an ICMP error"
	case ip.FragOffset > 0 || ip.MF:
		l4.unverifiable = "fragment"
	case !l4.complete:
		l4.unverifiable = "truncated"
	}
	if ip.FragOffset > 0 {
		d.p.Payload = d.rest("payload", l4.off, ipEnd)
	} else {
		switch ip.Protocol {
		case ProtoTCP:
			d.tcp(l4)
		case ProtoUDP:
			d.udp(l4)
		case ProtoICMP:
			d.icmp(l4)
		default:
			d.p.Payload = d.rest("payload", l4.off, ipEnd)
		}
	}
	if !quoted && off+total < end && total >= hlen {
		d.p.Trailer = d.rest("trailer", off+total, end)
	}
}

// ipv6 decodes the IPv6 packet at off, whose bytes end at end, as ipv4
// does IPv4 ones: quoted is set for the packet inside an ICMPv6 error, which
// holds as much of it as fits in the minimum MTU, often all of it. A packet
// with extension headers has them decoded as payload.
func (d *decoder) ipv6(off, end int, prefix string, quoted bool) {
	if !d.need(prefix, off, end, 40) {
		return
	}
	vtc := d.u32(off)
	ip := &IPv6Header{
		Version: uint8(vtc >> 28), TrafficClass: uint8(vtc >> 20), FlowLabel: vtc & 0xfffff,
		PayloadLength: d.u16(off + 4), NextHeader: d.u8(off + 6), HopLimit: d.u8(off + 7),
	}
	ip.Src, _ = netip.AddrFromSlice(d.frame[off+8 : off+24])
	ip.Dst, _ = netip.AddrFromSlice(d.frame[off+24 : off+40])
	if !quoted {
		d.p.IPv6 = ip
	}
	d.field(prefix+".version", off, 1, "%d", ip.Version)
	d.field(prefix+".traffic_class", off, 2, "%#02x", ip.TrafficClass)
	d.field(prefix+".flow_label", off+1, 3, "%#05x", ip.FlowLabel)
	d.field(prefix+".length", off+4, 2, "%d", ip.PayloadLength)
	d.field(prefix+".next_header", off+6, 1, "%s", protoName(ip.NextHeader))
	d.field(prefix+".hop_limit", off+7, 1, "%d", ip.HopLimit)
	d.field(prefix+".src", off+8, 16, "%s", ip.Src)
	d.field(prefix+".dst", off+24, 16, "%s", ip.Dst)
	if ip.Version != 6 {
		d.problem("malformed: %s.version is %d", prefix, ip.Version)
	}
	total := 40 + int(ip.PayloadLength)
	ipEnd := off + total
	if ipEnd > end {
		if !quoted {
			d.problem("truncated: %s packet has %d of %d bytes", prefix, end-off, total)
		}
		ipEnd = end
	}
	l4 := l4Context{
		prefix: strings.TrimSuffix(prefix, "ipv6"), src: ip.Src.AsSlice(), dst: ip.Dst.AsSlice(),
		proto: ip.NextHeader, v6: true, off: off + 40, end: ipEnd,
		length: int(ip.PayloadLength), complete: off+total <= end,
	}
	if !l4.complete {
		l4.unverifiable = "truncated"
		if quoted {
			l4.unverifiable = "quote truncated"
		}
	}
	switch ip.NextHeader {
	case ProtoTCP:
		d.tcp(l4)
	case ProtoUDP:
		d.udp(l4)
	case ProtoICMPv6:
		d.icmp(l4)
	default:
		d.p.Payload = d.rest(l4.prefix+"payload", l4.off, ipEnd)
	}
	if !quoted && off+total < end {
		d.p.Trailer = d.rest("trailer", off+total, end)
	}
}

// l4Context is what an L4 decoder needs from the IP header around it.
type l4Context struct {
	prefix string // "" or "icmp.inner."
	// src, dst and proto are the IP header's, for the pseudo-header.
	src, dst []byte
	proto    uint8
	// v6 says the header is IPv6's: ICMPv6 has a pseudo-header.
	v6 bool
	// fragment says the packet is an IPv4 fragment.
	fragment     bool
	off, end     int
	length       int // L4 length by the IP header
	complete     bool
	unverifiable string // why the checksum cannot be verified, if it cannot
}

func (d *decoder) l4Checksum(c l4Context, name string, csumOff int, pseudo bool, udp bool) ChecksumCheck {
	got := d.u16(csumOff)
	check := ChecksumCheck{Field: name, Got: got}
	switch {
	case udp && got == 0:
		check.Status = ChecksumNone
		return check
	case c.unverifiable != "":
		check.Status = ChecksumUnverifiable
		check.Reason = c.unverifiable
		return check
	}
	seg := append([]byte(nil), d.frame[c.off:c.off+c.length]...)
	var acc uint32
	if pseudo {
		acc = pseudoHeaderSum(c.src, c.dst, c.proto, c.length)
	}
	check.Status = ChecksumOK
	if fold(sum(seg, acc)) != 0xffff {
		check.Status = ChecksumBad
	}
	at := csumOff - c.off
	seg[at], seg[at+1] = 0, 0
	check.Want = ^fold(sum(seg, acc))
	if udp && check.Want == 0 {
		check.Want = 0xffff
	}
	return check
}

func (d *decoder) tcp(c l4Context) {
	name := c.prefix + "tcp"
	quoted := c.prefix != ""
	if quoted && c.end-c.off >= 8 && c.end-c.off < 20 {
		// An ICMP error quotes only the ports and the sequence number.
		d.span(name, c.off, c.end-c.off, 20)
		d.field(name+".sport", c.off, 2, "%d", d.u16(c.off))
		d.field(name+".dport", c.off+2, 2, "%d", d.u16(c.off+2))
		d.field(name+".seq", c.off+4, 4, "%d", d.u32(c.off+4))
		return
	}
	if !d.need(name, c.off, c.end, 20) {
		return
	}
	o := c.off
	t := &TCPHeader{
		Ports:      Ports{Src: d.u16(o), Dst: d.u16(o + 2)},
		Seq:        d.u32(o + 4),
		Ack:        d.u32(o + 8),
		DataOffset: d.u8(o+12) >> 4,
		Flags:      TCPFlags(d.u8(o + 13)),
		Window:     d.u16(o + 14),
		Checksum:   d.u16(o + 16),
		Urgent:     d.u16(o + 18),
	}
	if !quoted {
		d.p.TCP = t
	}
	d.field(name+".sport", o, 2, "%d", t.Src)
	d.field(name+".dport", o+2, 2, "%d", t.Dst)
	d.field(name+".seq", o+4, 4, "%d", t.Seq)
	d.field(name+".ack", o+8, 4, "%d", t.Ack)
	d.field(name+".doff", o+12, 1, "%d", t.DataOffset)
	d.field(name+".flags", o+13, 1, "%s", t.Flags)
	d.field(name+".window", o+14, 2, "%d", t.Window)
	check := d.l4Checksum(c, name+".checksum", o+16, true, false)
	d.p.Checksums = append(d.p.Checksums, check)
	d.field(name+".checksum", o+16, 2, "%s", check)
	d.field(name+".urgent", o+18, 2, "%d", t.Urgent)
	hlen := int(t.DataOffset) * 4
	if hlen < 20 {
		d.problem("malformed: %s.doff %d is below 5", name, t.DataOffset)
		d.p.Payload = d.rest("payload", o+20, c.end)
		return
	}
	if hlen > 20 {
		if !d.need(name+" options", o+20, c.end, hlen-20) {
			return
		}
		t.Options = d.frame[o+20 : o+hlen]
		d.field(name+".options", o+20, hlen-20, "%x", t.Options)
	}
	t.HeaderComplete = true
	d.p.Payload = d.rest(c.prefix+"payload", o+hlen, c.end)
}

func (d *decoder) udp(c l4Context) {
	name := c.prefix + "udp"
	if !d.need(name, c.off, c.end, 8) {
		return
	}
	o := c.off
	u := &UDPHeader{
		Ports:    Ports{Src: d.u16(o), Dst: d.u16(o + 2)},
		Length:   d.u16(o + 4),
		Checksum: d.u16(o + 6),
	}
	quoted := c.prefix != ""
	if !quoted {
		d.p.UDP = u
	}
	d.field(name+".sport", o, 2, "%d", u.Src)
	d.field(name+".dport", o+2, 2, "%d", u.Dst)
	d.field(name+".length", o+4, 2, "%d", u.Length)
	check := d.l4Checksum(c, name+".checksum", o+6, true, true)
	d.p.Checksums = append(d.p.Checksums, check)
	d.field(name+".checksum", o+6, 2, "%s", check)
	if c.complete && !quoted && int(u.Length) != c.length && !c.fragment {
		d.problem("malformed: %s.length %d differs from the IP payload length %d", name, u.Length, c.length)
	}
	d.p.Payload = d.rest(c.prefix+"payload", o+8, c.end)
}

func (d *decoder) icmp(c l4Context) {
	name := c.prefix + "icmp"
	if c.v6 {
		name += "v6"
	}
	if !d.need(name, c.off, c.end, 8) {
		return
	}
	o := c.off
	m := &ICMPHeader{Type: d.u8(o), Code: d.u8(o + 1), Checksum: d.u16(o + 2)}
	copy(m.Rest[:], d.frame[o+4:o+8])
	quoted := c.prefix != ""
	if !quoted {
		d.p.ICMP = m
	}
	d.field(name+".type", o, 1, "%d", m.Type)
	d.field(name+".code", o+1, 1, "%d", m.Code)
	// ICMPv6's checksum covers a pseudo-header, ICMP's does not.
	check := d.l4Checksum(c, name+".checksum", o+2, c.v6, false)
	d.p.Checksums = append(d.p.Checksums, check)
	d.field(name+".checksum", o+2, 2, "%s", check)
	echo, isError := m.Type == ICMPEchoRequest || m.Type == ICMPEchoReply,
		m.Type == ICMPDestUnreachable || m.Type == ICMPTimeExceeded || m.Type == 4 || m.Type == 5 || m.Type == 12
	if c.v6 {
		// Errors are the types below 128 (RFC 4443 2.1); those defined
		// quote the packet they are about.
		echo, isError = m.Type == ICMPv6EchoRequest || m.Type == ICMPv6EchoRequest+1,
			m.Type >= ICMPv6DestUnreachable && m.Type <= ICMPv6ParamProblem
	}
	switch {
	case echo:
		d.field(name+".id", o+4, 2, "%d", d.u16(o+4))
		d.field(name+".seq", o+6, 2, "%d", d.u16(o+6))
	case c.v6 && m.Type == ICMPv6PacketTooBig:
		d.field(name+".mtu", o+4, 4, "%d", d.u32(o+4))
	default:
		d.field(name+".rest", o+4, 4, "%x", m.Rest)
	}
	if !isError || quoted {
		d.p.Payload = d.rest(c.prefix+"payload", o+8, c.end)
		return
	}
	inner := &Packet{}
	sub := &decoder{p: inner, frame: d.frame}
	if c.v6 {
		sub.ipv6(o+8, c.end, name+".inner.ipv6", true)
	} else {
		sub.ipv4(o+8, c.end, name+".inner.ipv4", true)
	}
	m.Inner = inner
	d.p.Fields = append(d.p.Fields, inner.Fields...)
	d.p.Spans = append(d.p.Spans, inner.Spans...)
	d.p.Problems = append(d.p.Problems, inner.Problems...)
	// The quoted IPv4 header is whole and its checksum must be right; the
	// quoted L4 checksum covers bytes that are not there. An ICMPv6 error
	// quotes a packet whole unless it is too long: its L4 checksum must be
	// right then.
	for _, ck := range inner.Checksums {
		if ck.Field == "icmp.inner.ipv4.checksum" || (c.v6 && ck.Status != ChecksumUnverifiable) {
			d.p.Checksums = append(d.p.Checksums, ck)
		}
	}
}

// String returns the flags as "SYN|ACK".
func (f TCPFlags) String() string {
	names := []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"}
	var set []string
	for i, n := range names {
		if f&(1<<i) != 0 {
			set = append(set, n)
		}
	}
	if len(set) == 0 {
		return "none"
	}
	return strings.Join(set, "|")
}

// String renders the decoded packet one field per line.
func (p *Packet) String() string {
	var sb strings.Builder
	for _, f := range p.Fields {
		fmt.Fprintf(&sb, "%s: %s\n", f.Name, f.Value)
	}
	return sb.String()
}
