package tcpkt_test

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// The packet generator of the fuzzer: frames of both families to the fuzz
// world's frontends, its tracked flows in both directions, near misses
// (the right address with the wrong port or protocol, a ClusterIP, the
// localhost NodePort) and random addresses, then mutated: random header
// fields, TTLs that end, lengths that lie, truncation anywhere, IPv4
// options and fragments, IPv6 extension headers, unknown protocols and
// EtherTypes, bad or absent checksums and flipped bytes, with the
// checksums fixed up afterwards or not.

// fuzzFamily is what the generator draws from for one family.
type fuzzFamily struct {
	v6        bool
	frontends []feKey
	flows     []trackedFlow
	// clients: inside the LoadBalancer source ranges first, then outside.
	clients []netip.Addr
	// misses are addresses that are no frontend (a ClusterIP, loopback,
	// a pod, the node).
	misses []netip.Addr
	node   netip.Addr
}

type fuzzGen struct {
	r    *rand.Rand
	fams [2]fuzzFamily
}

func newFuzzGen(seed uint64, w *fuzzWorld, fams [2]fuzzFamily) *fuzzGen {
	g := &fuzzGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), fams: fams}
	for k := range w.frontends {
		i := 0
		if k.ap.Addr().Is6() {
			i = 1
		}
		g.fams[i].frontends = append(g.fams[i].frontends, k)
	}
	for i := range g.fams {
		slices.SortFunc(g.fams[i].frontends, func(a, b feKey) int {
			if c := a.ap.Compare(b.ap); c != 0 {
				return c
			}
			return int(a.proto) - int(b.proto)
		})
	}
	for _, f := range w.flows {
		i := 0
		if f.client.Addr().Is6() {
			i = 1
		}
		g.fams[i].flows = append(g.fams[i].flows, f)
	}
	return g
}

func (g *fuzzGen) chance(p float64) bool { return g.r.Float64() < p }

func pick[T any](g *fuzzGen, s []T) T { return s[g.r.IntN(len(s))] }

func (g *fuzzGen) randAddr(v6 bool) netip.Addr {
	if v6 {
		var b [16]byte
		for i := range b {
			b[i] = byte(g.r.Uint32())
		}
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{byte(g.r.Uint32()), byte(g.r.Uint32()), byte(g.r.Uint32()), byte(g.r.Uint32())})
}

func (g *fuzzGen) port() uint16 {
	switch g.r.IntN(4) {
	case 0:
		return uint16(g.r.Uint32())
	case 1:
		return uint16(61000 + g.r.IntN(4536)) // the source NAT range
	}
	return uint16(40000 + g.r.IntN(16))
}

// tuple is what a base frame is built from.
type tuple struct {
	src, dst netip.AddrPort
	proto    uint8
}

// base draws the addresses and ports of the next frame.
func (g *fuzzGen) base(fam *fuzzFamily) tuple {
	client := func() netip.Addr {
		switch {
		case g.chance(0.2):
			return g.randAddr(fam.v6)
		case g.chance(0.05):
			return pick(g, fam.misses) // the node, a pod, loopback
		}
		return pick(g, fam.clients)
	}
	switch n := g.r.IntN(100); {
	case n < 35:
		fe := pick(g, fam.frontends)
		return tuple{netip.AddrPortFrom(client(), g.port()), fe.ap, fe.proto}
	case n < 50 && len(fam.flows) > 0:
		f := pick(g, fam.flows)
		if g.chance(0.2) {
			// The client's port to another frontend, which may share
			// the flow's backend (a source port clash).
			fe := pick(g, fam.frontends)
			return tuple{f.client, fe.ap, fe.proto}
		}
		return tuple{f.client, f.frontend, f.proto}
	case n < 62 && len(fam.flows) > 0:
		f := pick(g, fam.flows)
		if f.snat.IsValid() && g.chance(0.7) {
			return tuple{f.backend, f.snat, f.proto}
		}
		// A backend's packet to the client itself, as a local one
		// replies (at egress), or to a wrong port.
		dst := f.client
		if g.chance(0.2) {
			dst = netip.AddrPortFrom(f.client.Addr(), g.port())
		}
		return tuple{f.backend, dst, f.proto}
	case n < 80:
		// Near misses.
		fe := pick(g, fam.frontends)
		t := tuple{netip.AddrPortFrom(client(), g.port()), fe.ap, fe.proto}
		switch g.r.IntN(5) {
		case 0:
			t.dst = netip.AddrPortFrom(fe.ap.Addr(), fe.ap.Port()+uint16(g.r.IntN(3))-1)
		case 1:
			t.dst = netip.AddrPortFrom(fe.ap.Addr(), uint16(g.r.Uint32()))
		case 2:
			t.proto = pktest.ProtoTCP + pktest.ProtoUDP - fe.proto
		case 3:
			t.dst = netip.AddrPortFrom(pick(g, fam.misses), fe.ap.Port())
		default:
			t.dst = netip.AddrPortFrom(fam.node, g.port())
		}
		return t
	}
	proto := uint8(pktest.ProtoTCP)
	if g.chance(0.5) {
		proto = pktest.ProtoUDP
	}
	return tuple{netip.AddrPortFrom(g.randAddr(fam.v6), g.port()), netip.AddrPortFrom(g.randAddr(fam.v6), g.port()), proto}
}

func (g *fuzzGen) flags() pktest.TCPFlags {
	common := []pktest.TCPFlags{pktest.SYN, pktest.ACK, pktest.SYN | pktest.ACK, pktest.PSH | pktest.ACK,
		pktest.FIN | pktest.ACK, pktest.RST, pktest.RST | pktest.ACK, pktest.FIN, 0}
	if g.chance(0.2) {
		return pktest.TCPFlags(g.r.Uint32())
	}
	return pick(g, common)
}

func (g *fuzzGen) ttl() uint8 {
	if g.chance(0.1) {
		return uint8(g.r.IntN(3))
	}
	if g.chance(0.1) {
		return uint8(g.r.Uint32())
	}
	return pktest.DefaultTTL
}

func (g *fuzzGen) payload() []byte {
	n := g.r.IntN(48)
	switch {
	case g.chance(0.03):
		n = 500 + g.r.IntN(800) // longer than an ICMP error quotes
	case g.chance(0.1):
		n = g.r.IntN(400)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.r.Uint32())
	}
	return b
}

// frame returns the next frame.
func (g *fuzzGen) frame() []byte {
	fam := &g.fams[g.r.IntN(2)]
	if g.chance(0.1) {
		return g.icmp(fam)
	}
	t := g.base(fam)
	var frame []byte
	smac, dmac := clientMAC, deviceMAC
	if fam.v6 {
		var b pktest.Builder6
		if t.proto == pktest.ProtoTCP {
			b = pktest.TCP6(t.src, t.dst, g.flags()).WithSeq(g.r.Uint32(), g.r.Uint32()).WithWindow(uint16(g.r.Uint32()))
		} else {
			b = pktest.UDP6(t.src, t.dst)
		}
		b = b.WithPayload(g.payload()).WithHopLimit(g.ttl()).WithMACs(smac, dmac)
		switch {
		case g.chance(0.04):
			frame = pktest.IPv6WithExtHeader(smac, dmac, t.src, t.dst, g.payload())
		case g.chance(0.04):
			frame = pktest.IPv6Fragment(smac, dmac, t.src, t.dst, g.payload())
		case g.chance(0.03):
			frame = b.WithL4Checksum(0).Bytes()
		default:
			frame = b.Bytes()
		}
		if g.chance(0.1) {
			// Traffic class and flow label.
			frame[pktest.MinFrameLen] = 0x60 | byte(g.r.IntN(16))
			frame[pktest.MinFrameLen+1] = byte(g.r.Uint32())
			fixChecksums(frame)
		}
		if g.chance(0.03) {
			frame = append(frame, make([]byte, 1+g.r.IntN(20))...) // link padding
		}
	} else {
		var b pktest.Builder
		if t.proto == pktest.ProtoTCP {
			b = pktest.TCP(t.src, t.dst, g.flags()).WithSeq(g.r.Uint32()).WithAck(g.r.Uint32()).WithWindow(uint16(g.r.Uint32()))
			if g.chance(0.1) {
				b = b.WithTCPOptions(pktest.TCPOptMSS(1460), pktest.TCPOptSACKPermitted(), pktest.TCPOptTimestamps(g.r.Uint32(), 0))
			}
		} else {
			b = pktest.UDP(t.src, t.dst)
		}
		b = b.WithPayload(g.payload()).WithTTL(g.ttl()).WithTOS(uint8(g.r.Uint32())).WithID(uint16(g.r.Uint32())).WithMACs(smac, dmac)
		if g.chance(0.3) {
			b = b.WithDF()
		}
		if g.chance(0.1) {
			b = b.WithIPOptions(pick(g, [][]pktest.IPOption{
				{pktest.IPOptNOP()}, {pktest.IPOptRouterAlert()}, {pktest.IPOptRecordRoute(1 + g.r.IntN(8))},
				{pktest.IPOptNOP(), pktest.IPOptEOL()},
			})...)
		}
		switch {
		case g.chance(0.04):
			b = b.WithMF()
		case g.chance(0.04):
			b = b.WithFragOffset(8 * (1 + g.r.IntN(100)))
			if g.chance(0.5) {
				b = b.WithMF()
			}
		}
		switch {
		case g.chance(0.04):
			b = b.WithBadIPChecksum()
		case g.chance(0.05):
			b = b.WithBadL4Checksum()
		case t.proto == pktest.ProtoUDP && g.chance(0.1):
			b = b.WithL4Checksum(0)
		}
		if g.chance(0.05) {
			b = b.WithPadding(1 + g.r.IntN(20))
		}
		frame = b.Bytes()
	}
	if t.proto == pktest.ProtoUDP && g.chance(0.3) {
		g.zeroAfter(fam, frame, t)
	}
	return g.mutate(frame)
}

// zeroAfter makes frame, a UDP datagram of tuple t, one whose checksum
// becomes zero when a tracked flow's translation rewrites it, where it
// must be sent as all ones (zero says "no checksum"): the checksum field
// set to what gives that, and two payload bytes to keep the datagram's
// checksum right.
func (g *fuzzGen) zeroAfter(fam *fuzzFamily, frame []byte, t tuple) {
	var to tuple
	for _, f := range fam.flows {
		switch {
		case f.proto != t.proto:
			continue
		case t.src == f.client && t.dst == f.frontend:
			to = tuple{f.client, f.backend, t.proto}
			if f.snat.IsValid() {
				to.src = f.snat
			}
		case t.src == f.backend && (t.dst == f.snat || t.dst == f.client):
			to = tuple{f.frontend, f.client, t.proto}
		default:
			continue
		}
	}
	v := parseFrame(frame, false)
	if !to.src.IsValid() || !v.l4 || v.l3len-v.ihl < 10 {
		return
	}
	tupleSum := func(t tuple) uint32 {
		return uint32(residual(nil, onesSum(t.dst.Addr().AsSlice(), onesSum(t.src.Addr().AsSlice(), 0))+
			uint32(t.src.Port())+uint32(t.dst.Port())))
	}
	// The new checksum's complement is the old one's plus what the tuple
	// adds: all ones (a computed zero) when the old one's complement is
	// what the tuple takes away.
	seg := frame[v.l4off() : pktest.MinFrameLen+v.l3len]
	binary.BigEndian.PutUint16(seg[6:], ^residual(nil, tupleSum(t)+uint32(^uint16(tupleSum(to)))))
	seg[8], seg[9] = 0, 0
	fix := ^residual(seg, pseudoSum(v.src, v.dst, v.proto, len(seg)))
	binary.BigEndian.PutUint16(seg[8:], fix)
}

// icmp is an ICMP (ICMPv6) message: an echo, an error about a packet of a
// tracked flow, or one quoting a packet of none.
func (g *fuzzGen) icmp(fam *fuzzFamily) []byte {
	if len(fam.flows) > 0 && g.chance(0.6) {
		return g.icmpTracked(fam)
	}
	t := g.base(fam)
	if fam.v6 {
		quoted := pktest.UDP6(t.dst, netip.AddrPortFrom(g.randAddr(true), g.port())).IPBytes()
		typ := uint8(1 + g.r.IntN(4))
		if g.chance(0.3) {
			typ = pktest.ICMPv6EchoRequest
		}
		b := pktest.ICMPv6(g.randAddr(true), t.dst.Addr(), typ, 0, quoted[:min(len(quoted), 8+g.r.IntN(len(quoted)))])
		return g.mutate(b.WithMACs(clientMAC, deviceMAC).Bytes())
	}
	if g.chance(0.3) {
		return g.mutate(pktest.ICMPEcho(t.src.Addr(), t.dst.Addr(), uint16(g.r.Uint32()), 1).WithMACs(clientMAC, deviceMAC).Bytes())
	}
	quoted := pktest.UDP(t.dst, netip.AddrPortFrom(g.randAddr(false), g.port())).Quote()
	b := pktest.ICMPError(g.randAddr(false), t.dst.Addr(), pick(g, []uint8{pktest.ICMPDestUnreachable, pktest.ICMPTimeExceeded}),
		uint8(g.r.IntN(5)), quoted[:8+g.r.IntN(len(quoted)-7)])
	return g.mutate(b.WithMACs(clientMAC, deviceMAC).Bytes())
}

// mutate changes frame in place or returns a shorter one: some fields at
// random, each mutation with its checksums fixed up or not.
func (g *fuzzGen) mutate(frame []byte) []byte {
	ip := frame[pktest.MinFrameLen:]
	v6 := binary.BigEndian.Uint16(frame[12:]) == pktest.EtherTypeIPv6
	changed := false
	if g.chance(0.05) {
		// A length that lies.
		off := 2
		if v6 {
			off = 4
		}
		n := int(binary.BigEndian.Uint16(ip[off:])) + g.r.IntN(41) - 20
		if g.chance(0.2) {
			n = g.r.IntN(65536)
		}
		binary.BigEndian.PutUint16(ip[off:], uint16(n))
		changed = true
	}
	if !v6 && g.chance(0.04) {
		ip[0] = 0x40 | byte(g.r.IntN(16)) // header length
		changed = true
	}
	if g.chance(0.03) {
		ip[0] = byte(g.r.Uint32())&0xf0 | ip[0]&0x0f // version
		changed = true
	}
	if g.chance(0.04) {
		// Protocol or next header: an unknown one, ICMP, an extension
		// header, or the other of TCP and UDP.
		off := 9
		if v6 {
			off = 6
		}
		ip[off] = pick(g, []uint8{0, 1, 6, 17, 43, 44, 47, 50, 58, 60, 132, 255, uint8(g.r.Uint32())})
		changed = true
	}
	if g.chance(0.04) {
		// TCP data offset (or whatever sits there).
		off := 20 + 12
		if v6 {
			off = 40 + 12
		}
		if off < len(ip) {
			ip[off] = byte(g.r.Uint32())
			changed = true
		}
	}
	if g.chance(0.1) {
		for range 1 + g.r.IntN(4) {
			i := g.r.IntN(min(len(frame), 100))
			frame[i] ^= byte(1 + g.r.IntN(255))
		}
		changed = true
	}
	if changed && g.chance(0.6) {
		fixChecksums(frame)
	}
	if g.chance(0.03) {
		// Another EtherType: ARP, a VLAN tag, the other family's.
		binary.BigEndian.PutUint16(frame[12:], pick(g, []uint16{pktest.EtherTypeARP, pktest.EtherTypeVLAN,
			pktest.EtherTypeIPv4, pktest.EtherTypeIPv6, uint16(g.r.Uint32())}))
	}
	if g.chance(0.08) && len(frame) > pktest.MinFrameLen {
		frame = frame[:pktest.MinFrameLen+g.r.IntN(len(frame)-pktest.MinFrameLen)]
	}
	return frame
}

// fixChecksums recomputes the IPv4 header checksum and the TCP, UDP
// (unless none), ICMP or ICMPv6 checksum of frame where the headers say
// where they are and the bytes are there, so that a mutated frame is a
// valid one with odd fields.
func fixChecksums(frame []byte) {
	if len(frame) < pktest.MinFrameLen+20 {
		return
	}
	ip := frame[pktest.MinFrameLen:]
	var v view
	switch {
	case binary.BigEndian.Uint16(frame[12:]) == pktest.EtherTypeIPv4 && ip[0]>>4 == 4:
		ihl := int(ip[0]&0x0f) * 4
		if ihl < 20 || ihl > len(ip) {
			return
		}
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], pktest.Checksum(ip[:ihl]))
		if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			return
		}
		v = view{src: netip.AddrFrom4([4]byte(ip[12:16])), dst: netip.AddrFrom4([4]byte(ip[16:20])), proto: ip[9],
			ihl: ihl, l3len: int(binary.BigEndian.Uint16(ip[2:]))}
	case binary.BigEndian.Uint16(frame[12:]) == pktest.EtherTypeIPv6 && len(ip) >= 40:
		v = view{v6: true, src: netip.AddrFrom16([16]byte(ip[8:24])), dst: netip.AddrFrom16([16]byte(ip[24:40])), proto: ip[6],
			ihl: 40, l3len: 40 + int(binary.BigEndian.Uint16(ip[4:]))}
	default:
		return
	}
	if v.l3len > len(ip) || v.l3len < v.ihl {
		return
	}
	seg := ip[v.ihl:v.l3len]
	var off int
	var acc uint32
	switch v.proto {
	case pktest.ProtoTCP:
		off, acc = 16, pseudoSum(v.src, v.dst, v.proto, len(seg))
	case pktest.ProtoUDP:
		off, acc = 6, pseudoSum(v.src, v.dst, v.proto, len(seg))
		if len(seg) >= 8 && seg[6] == 0 && seg[7] == 0 && !v.v6 {
			return
		}
	case pktest.ProtoICMP:
		off = 2
	case pktest.ProtoICMPv6:
		off, acc = 2, pseudoSum(v.src, v.dst, v.proto, len(seg))
	default:
		return
	}
	if len(seg) < off+2 {
		return
	}
	seg[off], seg[off+1] = 0, 0
	c := ^residual(seg, acc)
	if c == 0 && v.proto == pktest.ProtoUDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(seg[off:], c)
}

// icmpTracked is an ICMP (ICMPv6) error about a packet of a tracked flow:
// a reply the node sent to its client (from a router on the way), or a
// packet the node sent to its backend (from the backend, or a router).
func (g *fuzzGen) icmpTracked(fam *fuzzFamily) []byte {
	f := pick(g, fam.flows)
	var q tuple
	var from, to netip.Addr
	router := g.randAddr(fam.v6)
	switch g.r.IntN(3) {
	case 0:
		q = tuple{f.frontend, f.client, f.proto}
		from, to = router, f.frontend.Addr()
	default:
		sender := f.client
		if f.snat.IsValid() {
			sender = f.snat
		}
		q = tuple{sender, f.backend, f.proto}
		from, to = f.backend.Addr(), sender.Addr()
		if g.chance(0.3) {
			from = router
		}
	}
	if g.chance(0.1) {
		to = pick(g, fam.clients)
	}
	var quoted []byte
	if fam.v6 {
		var b pktest.Builder6
		if q.proto == pktest.ProtoTCP {
			b = pktest.TCP6(q.src, q.dst, g.flags()).WithSeq(g.r.Uint32(), g.r.Uint32())
		} else {
			b = pktest.UDP6(q.src, q.dst)
		}
		quoted = b.WithPayload(g.payload()).IPBytes()
	} else {
		var b pktest.Builder
		if q.proto == pktest.ProtoTCP {
			b = pktest.TCP(q.src, q.dst, g.flags()).WithSeq(g.r.Uint32())
		} else {
			b = pktest.UDP(q.src, q.dst)
			if g.chance(0.2) {
				b = b.WithL4Checksum(0)
			}
		}
		if g.chance(0.1) {
			b = b.WithIPOptions(pktest.IPOptRouterAlert())
		}
		switch {
		case g.chance(0.05):
			b = b.WithMF() // a first fragment: its ports are there
		case g.chance(0.05):
			b = b.WithFragOffset(8 * (1 + g.r.IntN(100))) // a later one: no ports
		}
		quoted = b.WithPayload(g.payload()).IPBytes()
	}
	// As much as the sender quotes: all of it, the IP header and 8 bytes
	// (IPv4's minimum), or anything down to the ports.
	switch g.r.IntN(3) {
	case 0:
		n := 8 + int(quoted[0]&0x0f)*4
		if fam.v6 {
			n = 48
		}
		quoted = quoted[:min(n, len(quoted))]
	case 1:
		quoted = quoted[:g.r.IntN(len(quoted)+1)]
	}
	if fam.v6 {
		typ := uint8(1 + g.r.IntN(4))
		b := pktest.ICMPv6(from, to, typ, uint8(g.r.IntN(5)), quoted).WithMTU(1280).WithHopLimit(g.ttl())
		return g.mutate(b.WithMACs(clientMAC, deviceMAC).Bytes())
	}
	typ := pick(g, []uint8{pktest.ICMPDestUnreachable, pktest.ICMPTimeExceeded})
	b := pktest.ICMPError(from, to, typ, uint8(g.r.IntN(5)), quoted).WithTTL(g.ttl())
	if typ == pktest.ICMPDestUnreachable && g.chance(0.5) {
		b = pktest.ICMPUnreachable(from, to, pktest.ICMPFragNeeded, quoted).WithNextHopMTU(1400).WithTTL(g.ttl())
	}
	if g.chance(0.1) {
		b = b.WithIPOptions(pktest.IPOptRecordRoute(1 + g.r.IntN(8)))
	}
	return g.mutate(b.WithMACs(clientMAC, deviceMAC).Bytes())
}
