package tcpkt_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// How the fuzzer judges a run against the model's outcomes: the verdict,
// then the frame. A translation must be the input with exactly the
// outcome's addresses, ports, hop count and link addresses, every other
// byte the same, and each checksum as right (or as wrong, by the same
// amount) as in the input; a reply (ICMP error, TCP reset) is built here
// from the input field by field with right checksums.

// passVerdict and dropVerdict are the program family's.
func passVerdict(p prog) pktest.Verdict {
	if p.xdp() {
		return pktest.XDPPass
	}
	return pktest.TCActUnspec
}

func dropVerdict(p prog) pktest.Verdict {
	if p.xdp() {
		return pktest.XDPDrop
	}
	return pktest.TCActShot
}

// wantVerdict is the verdict of outcome o for program p.
func (o outcome) wantVerdict(p prog) pktest.Verdict {
	switch o.kind {
	case pass:
		return passVerdict(p)
	case drop:
		return dropVerdict(p)
	}
	return o.verdict
}

// trims says the program cuts the frame in for outcome o, which leaves a
// CHECKSUM_COMPLETE skb CHECKSUM_NONE: the run must then start with one.
func (o outcome) trims(v view, in []byte) bool {
	switch o.kind {
	case unreach:
		return quoteLen(v) < v.l3len
	case reset:
		return len(in) > resetLen(v)
	}
	return false
}

// match checks a run's result res of program p on frame in (viewed as v)
// against the model's outcomes alts; ctChanged says whether the run left
// connection tracking different from before. It returns the outcome that
// matched, or an error that says how the result differs from each.
func (w *fuzzWorld) match(p prog, in []byte, v view, alts []outcome, res pktest.Result, ctChanged bool) (outcome, error) {
	var errs []string
	for _, o := range alts {
		err := w.matchOne(p, in, v, o, res, ctChanged)
		if err == nil {
			if o.sticky != "" && o.kind == xlate {
				w.seen[o.sticky] = o.dsts[0]
			}
			if o.svc != "" && o.kind == xlate {
				if w.chosen[o.svc] == nil {
					w.chosen[o.svc] = map[netip.AddrPort]int{}
				}
				w.chosen[o.svc][o.dsts[0]]++
				w.offered(o.svc, alts)
			}
			return o, nil
		}
		errs = append(errs, fmt.Sprintf("want %s (%s): %v", o.kind, o.why, err))
	}
	return outcome{}, errors.New(strings.Join(errs, "\n"))
}

// offered notes that a new flow of svc could go to each of the n backends
// its alternatives alts translate to: under a uniform choice, each was
// passed over with chance 1-1/n.
func (w *fuzzWorld) offered(svc string, alts []outcome) {
	var to []netip.AddrPort
	for _, a := range alts {
		if a.kind == xlate && a.svc == svc && len(a.dsts) > 0 {
			to = append(to, a.dsts[0])
		}
	}
	if len(to) < 2 {
		return
	}
	if w.missLog[svc] == nil {
		w.missLog[svc] = map[netip.AddrPort]float64{}
	}
	for _, b := range to {
		w.missLog[svc][b] += math.Log(1 - 1/float64(len(to)))
	}
}

func (w *fuzzWorld) matchOne(p prog, in []byte, v view, o outcome, res pktest.Result, ctChanged bool) error {
	if want := o.wantVerdict(p); res.Verdict != want {
		return fmt.Errorf("verdict %v, want %v", res.Verdict, want)
	}
	switch {
	case ctChanged && !o.ctChanges && (o.kind != xlate || o.inner != nil):
		return errors.New("connection tracking changed")
	case !ctChanged && o.kind == xlate && o.svc != "":
		return errors.New("new flow translated but not recorded in connection tracking")
	}
	switch o.kind {
	case pass:
		if d := pktest.Diff(res.Out, in); d != "" {
			return fmt.Errorf("frame changed:\n%s", d)
		}
		return nil
	case drop:
		return nil
	case unreach:
		want := unreachFrame(in, v)
		return compareReply(res.Out, want, v.v6, replyChecksums(v.v6, false), v.v6)
	case reset:
		want := resetFrame(in, v)
		return compareReply(res.Out, want, v.v6, replyChecksums(v.v6, true), true)
	}
	return w.matchXlate(in, v, o, res.Out)
}

// matchXlate checks a translation: out must be in with o's tuple.
func (w *fuzzWorld) matchXlate(in []byte, v view, o outcome, out []byte) error {
	if len(out) != len(in) {
		return fmt.Errorf("%d-byte frame out of %d bytes in", len(out), len(in))
	}
	if o.inner != nil {
		return w.matchICMPXlate(in, v, o, out)
	}
	src := o.src
	if o.snat.IsValid() {
		// Any free source NAT port: read it from the output.
		port := binary.BigEndian.Uint16(out[v.l4off():])
		if port < w.snatMin || port > w.snatMax || slices.Contains(o.busy, port) {
			return fmt.Errorf("source NAT port %d: not a free one of %d-%d (busy %v)", port, w.snatMin, w.snatMax, o.busy)
		}
		src = netip.AddrPortFrom(o.snat, port)
	}
	want := slices.Clone(in)
	ip := want[pktest.MinFrameLen:]
	dst := o.dsts[0]
	if v.v6 {
		copy(ip[8:24], src.Addr().AsSlice())
		copy(ip[24:40], dst.Addr().AsSlice())
		if o.fwd {
			ip[7]--
		}
	} else {
		copy(ip[12:16], src.Addr().AsSlice())
		copy(ip[16:20], dst.Addr().AsSlice())
		if o.fwd {
			ip[8]--
		}
	}
	binary.BigEndian.PutUint16(ip[v.ihl:], src.Port())
	binary.BigEndian.PutUint16(ip[v.ihl+2:], dst.Port())
	if o.fwd {
		smac, dmac := w.toward(dst.Addr())
		copy(want[0:6], dmac)
		copy(want[6:12], smac)
	}
	offs := xlateChecksums(v)
	if d := pktest.Diff(masked(out, offs), masked(want, offs)); d != "" {
		return fmt.Errorf("translated frame differs (checksums aside):\n%s", d)
	}
	if !v.v6 {
		if got, was := residual(out[pktest.MinFrameLen:v.l4off()], 0), residual(in[pktest.MinFrameLen:v.l4off()], 0); got != was {
			return fmt.Errorf("IPv4 header checksum: residual %#04x, the input's was %#04x", got, was)
		}
	}
	csumOff := offs[len(offs)-1]
	inSum, outSum := binary.BigEndian.Uint16(in[csumOff:]), binary.BigEndian.Uint16(out[csumOff:])
	if v.proto == pktest.ProtoUDP && (inSum == 0) != (outSum == 0) {
		return fmt.Errorf("UDP checksum %#04x from %#04x: none must stay none, and a computed one never becomes none", outSum, inSum)
	}
	if v.proto == pktest.ProtoUDP && inSum == 0 {
		return nil
	}
	if got, was := l4Residual(out, parseFrame(out, false)), l4Residual(in, v); got != was {
		return fmt.Errorf("L4 checksum %#04x: residual %#04x, the input's was %#04x", outSum, got, was)
	}
	return nil
}

// xlateChecksums are the checksum fields a translation changes, the L4
// one last.
func xlateChecksums(v view) []int {
	l4 := v.l4off() + 6
	if v.proto == pktest.ProtoTCP {
		l4 = v.l4off() + 16
	}
	if v.v6 {
		return []int{l4}
	}
	return []int{pktest.MinFrameLen + 10, l4}
}

// masked is frame with the 2-byte fields at offs zeroed.
func masked(frame []byte, offs []int) []byte {
	out := slices.Clone(frame)
	for _, o := range offs {
		if o+2 <= len(out) {
			out[o], out[o+1] = 0, 0
		}
	}
	return out
}

// onesSum adds b to acc as big-endian 16-bit words (RFC 1071), an odd
// last byte padded with zero.
func onesSum(b []byte, acc uint32) uint32 {
	for ; len(b) >= 2; b = b[2:] {
		acc += uint32(b[0])<<8 | uint32(b[1])
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	return acc
}

// residual is the folded ones' complement sum of b with acc: 0xffff for
// a right checksum, and for a wrong one how far off it is. Zero and 0xffff
// are the same number.
func residual(b []byte, acc uint32) uint16 {
	acc = onesSum(b, acc)
	for acc > 0xffff {
		acc = acc&0xffff + acc>>16
	}
	if acc == 0 {
		return 0xffff
	}
	return uint16(acc)
}

// l4Residual is the residual of the TCP or UDP checksum of frame (viewed
// as v): the segment by the IP header's length with its pseudo-header.
func l4Residual(frame []byte, v view) uint16 {
	seg := frame[v.l4off() : pktest.MinFrameLen+v.l3len]
	return residual(seg, pseudoSum(v.src, v.dst, v.proto, len(seg)))
}

func pseudoSum(src, dst netip.Addr, proto uint8, n int) uint32 {
	return onesSum(dst.AsSlice(), onesSum(src.AsSlice(), 0)) + uint32(proto) + uint32(n)
}

// quoteLen is how much of v's packet an ICMP error quotes: as much as
// fits in 576 bytes (IPv4, RFC 1812) or the minimum MTU (IPv6, RFC 4443).
func quoteLen(v view) int {
	if v.v6 {
		return min(v.l3len, 1280-48)
	}
	return min(v.l3len, 576-28)
}

// unreachFrame is the port unreachable that refuses in (viewed as v): back
// out of the device to the sender, from the address it was sent to,
// quoting the packet (the link padding stays behind it when the whole
// packet is quoted).
func unreachFrame(in []byte, v view) []byte {
	q := quoteLen(v)
	body := in[pktest.MinFrameLen:]
	if q < v.l3len {
		body = body[:q]
	}
	out := append(slices.Clone(in[6:12]), in[0:6]...)
	var hdr []byte
	if v.v6 {
		out = binary.BigEndian.AppendUint16(out, pktest.EtherTypeIPv6)
		hdr = binary.BigEndian.AppendUint32(nil, 6<<28)
		hdr = binary.BigEndian.AppendUint16(hdr, uint16(8+q))
		hdr = append(hdr, pktest.ProtoICMPv6, 64)
		hdr = append(append(hdr, v.dst.AsSlice()...), v.src.AsSlice()...)
		icmp := []byte{pktest.ICMPv6DestUnreachable, pktest.ICMPv6PortUnreachable, 0, 0, 0, 0, 0, 0}
		c := ^residual(append(slices.Clone(icmp), body[:q]...), pseudoSum(v.dst, v.src, pktest.ProtoICMPv6, 8+q))
		binary.BigEndian.PutUint16(icmp[2:], c)
		hdr = append(hdr, icmp...)
	} else {
		out = binary.BigEndian.AppendUint16(out, pktest.EtherTypeIPv4)
		hdr = []byte{0x45, 0, 0, 0, 0, 0, 0, 0, 64, pktest.ProtoICMP, 0, 0}
		binary.BigEndian.PutUint16(hdr[2:], uint16(28+q))
		hdr = append(append(hdr, v.dst.AsSlice()...), v.src.AsSlice()...)
		binary.BigEndian.PutUint16(hdr[10:], pktest.Checksum(hdr))
		icmp := []byte{pktest.ICMPDestUnreachable, pktest.ICMPPortUnreachable, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint16(icmp[2:], pktest.Checksum(append(slices.Clone(icmp), body[:q]...)))
		hdr = append(hdr, icmp...)
	}
	return append(append(out, hdr...), body...)
}

// resetLen is the length of the reset frame for a segment of v's family.
func resetLen(v view) int {
	if v.v6 {
		return pktest.MinFrameLen + 40 + 20
	}
	return pktest.MinFrameLen + 20 + 20
}

// resetFrame is the reset a host without the connection answers the
// segment in (viewed as v) with (RFC 793, "Reset Generation"), as the
// kernel sends it: back out of the device, window 0, no options, TTL 64,
// IPv4 DF and ID 0, the segment's DSCP without ECN, no flow label.
func resetFrame(in []byte, v view) []byte {
	out := append(slices.Clone(in[6:12]), in[0:6]...)
	seg := in[v.l4off():]
	thlen := int(seg[12]>>4) * 4
	tcp := make([]byte, 20)
	copy(tcp[0:2], seg[2:4])
	copy(tcp[2:4], seg[0:2])
	tcp[12] = 5 << 4
	if pktest.TCPFlags(seg[13])&pktest.ACK != 0 {
		copy(tcp[4:8], seg[8:12])
		tcp[13] = byte(pktest.RST)
	} else {
		n := uint32(v.l3len - v.ihl - thlen)
		if v.flags&pktest.SYN != 0 {
			n++
		}
		if v.flags&pktest.FIN != 0 {
			n++
		}
		binary.BigEndian.PutUint32(tcp[8:12], binary.BigEndian.Uint32(seg[4:8])+n)
		tcp[13] = byte(pktest.RST | pktest.ACK)
	}
	var hdr []byte
	if v.v6 {
		out = binary.BigEndian.AppendUint16(out, pktest.EtherTypeIPv6)
		vtc := binary.BigEndian.Uint32(in[pktest.MinFrameLen:]) & 0xff300000
		hdr = binary.BigEndian.AppendUint32(nil, vtc)
		hdr = binary.BigEndian.AppendUint16(hdr, 20)
		hdr = append(hdr, pktest.ProtoTCP, 64)
		hdr = append(append(hdr, v.dst.AsSlice()...), v.src.AsSlice()...)
	} else {
		out = binary.BigEndian.AppendUint16(out, pktest.EtherTypeIPv4)
		hdr = []byte{0x45, v.tos &^ 3, 0, 40, 0, 0, 0x40, 0, 64, pktest.ProtoTCP, 0, 0}
		hdr = append(append(hdr, v.dst.AsSlice()...), v.src.AsSlice()...)
		binary.BigEndian.PutUint16(hdr[10:], pktest.Checksum(hdr))
	}
	return append(append(out, hdr...), tcp...)
}

// replyChecksums are the checksum fields of a reply frame: the IPv4
// header's, then the ICMP (ICMPv6) or TCP one.
func replyChecksums(v6, tcp bool) []int {
	l4 := pktest.MinFrameLen + 2
	if tcp {
		l4 = pktest.MinFrameLen + 16
	}
	if v6 {
		return []int{l4 + 40}
	}
	return []int{pktest.MinFrameLen + 10, l4 + 20}
}

// compareReply checks a reply frame out against want with its checksums
// set aside, then its checksums, which must be right whatever the input's
// were: the reply is a new packet. pseudo says its L4 checksum covers a
// pseudo-header (TCP's, ICMPv6's; ICMP's does not).
func compareReply(out, want []byte, v6 bool, offs []int, pseudo bool) error {
	if d := pktest.Diff(masked(out, offs), masked(want, offs)); d != "" {
		return fmt.Errorf("reply differs (checksums aside):\n%s", d)
	}
	ov := parseFrame(out, false)
	if !v6 {
		if r := residual(out[pktest.MinFrameLen:pktest.MinFrameLen+20], 0); r != 0xffff {
			return fmt.Errorf("reply's IPv4 header checksum is off by %#04x", ^r)
		}
	}
	seg := out[ov.l4off() : pktest.MinFrameLen+ov.l3len]
	var acc uint32
	if pseudo {
		acc = pseudoSum(ov.src, ov.dst, ov.proto, len(seg))
	}
	if r := residual(seg, acc); r != 0xffff {
		return fmt.Errorf("reply's L4 checksum is off by %#04x", ^r)
	}
	return nil
}

// describeRun says what a mismatching run was, for the failure report.
func describeRun(p prog, in []byte, res pktest.Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "program %s\ninput frame (%d bytes): %x\n%s", p, len(in), in, pktest.Decode(in))
	fmt.Fprintf(&b, "got %v, output frame (%d bytes): %x\n%s", res.Verdict, len(res.Out), res.Out, pktest.Decode(res.Out))
	return b.String()
}

// matchICMPXlate checks a translated ICMP error: out must be in with the
// outer addresses of o and the quoted packet's source and destination
// o.innerSrc and o.innerDst; the outer IPv4 header, the ICMP message and
// the quoted IPv4 header each as right as before; the quoted L4 checksum,
// where quoted, changed by exactly the addresses and ports (a quoted UDP
// datagram without checksum keeping none).
func (w *fuzzWorld) matchICMPXlate(in []byte, v view, o outcome, out []byte) error {
	q := o.inner
	want := slices.Clone(in)
	ip := want[pktest.MinFrameLen:]
	setAddrs := func(b []byte, v6 bool, src, dst netip.Addr) {
		if v6 {
			copy(b[8:24], src.AsSlice())
			copy(b[24:40], dst.AsSlice())
		} else {
			copy(b[12:16], src.AsSlice())
			copy(b[16:20], dst.AsSlice())
		}
	}
	setAddrs(ip, v.v6, o.src.Addr(), o.dsts[0].Addr())
	if o.fwd {
		if v.v6 {
			ip[7]--
		} else {
			ip[8]--
		}
		smac, dmac := w.toward(o.dsts[0].Addr())
		copy(want[0:6], dmac)
		copy(want[6:12], smac)
	}
	setAddrs(want[q.ipOff:], v.v6, o.innerSrc.Addr(), o.innerDst.Addr())
	binary.BigEndian.PutUint16(want[q.l4Off:], o.innerSrc.Port())
	binary.BigEndian.PutUint16(want[q.l4Off+2:], o.innerDst.Port())
	offs := []int{v.l4off() + 2}
	if !v.v6 {
		offs = append(offs, pktest.MinFrameLen+10, q.ipOff+10)
	}
	if q.checkOff != 0 {
		offs = append(offs, q.checkOff)
	}
	if d := pktest.Diff(masked(out, offs), masked(want, offs)); d != "" {
		return fmt.Errorf("translated ICMP error differs (checksums aside):\n%s", d)
	}
	if !v.v6 {
		for _, h := range [][2]int{{pktest.MinFrameLen, v.l4off()}, {q.ipOff, q.l4Off}} {
			if got, was := residual(out[h[0]:h[1]], 0), residual(in[h[0]:h[1]], 0); got != was {
				return fmt.Errorf("IPv4 header checksum at byte %d: residual %#04x, the input's was %#04x", h[0], got, was)
			}
		}
	}
	icmpSum := func(frame []byte) uint16 {
		fv := parseFrame(frame, false)
		seg := frame[fv.l4off() : pktest.MinFrameLen+fv.l3len]
		var acc uint32
		if fv.v6 {
			acc = pseudoSum(fv.src, fv.dst, fv.proto, len(seg))
		}
		return residual(seg, acc)
	}
	if got, was := icmpSum(out), icmpSum(in); got != was {
		return fmt.Errorf("ICMP checksum: residual %#04x, the input's was %#04x", got, was)
	}
	if q.checkOff == 0 {
		return nil
	}
	inSum, outSum := binary.BigEndian.Uint16(in[q.checkOff:]), binary.BigEndian.Uint16(out[q.checkOff:])
	if q.proto == pktest.ProtoUDP && (inSum == 0) != (outSum == 0) {
		return fmt.Errorf("quoted UDP checksum %#04x from %#04x: none must stay none, and a computed one never becomes none", outSum, inSum)
	}
	if q.proto == pktest.ProtoUDP && inSum == 0 {
		return nil
	}
	// The checksum covers the quoted tuple (addresses in the pseudo-
	// header, ports in the header) and bytes that stay as they are: its
	// complement changes by what the tuple does.
	tuple := func(frame []byte) uint32 {
		a := 12
		n := 8
		if v.v6 {
			a, n = 8, 32
		}
		return onesSum(frame[q.l4Off:q.l4Off+4], onesSum(frame[q.ipOff+a:q.ipOff+a+n], 0))
	}
	if l, r := residual(nil, uint32(^inSum)+tuple(out)), residual(nil, uint32(^outSum)+tuple(in)); l != r {
		return fmt.Errorf("quoted L4 checksum %#04x from %#04x does not follow the quoted tuple's change", outSum, inSum)
	}
	return nil
}
