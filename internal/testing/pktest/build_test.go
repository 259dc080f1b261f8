package pktest

import (
	"bytes"
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

var (
	client   = netip.MustParseAddrPort("192.0.2.10:40000")
	frontend = netip.MustParseAddrPort("10.96.0.10:53")
	backend  = netip.MustParseAddrPort("10.0.1.5:5353")
)

// checksumsOf returns the status of every checksum in frame by field name.
func checksumsOf(frame []byte) map[string]ChecksumStatus {
	m := map[string]ChecksumStatus{}
	for _, c := range Decode(frame).Checksums {
		m[c.Field] = c.Status
	}
	return m
}

// TestBuildersMakeValidPackets checks every builder against gopacket's
// decoder, an implementation independent of this package's, and against
// the verifier.
func TestBuildersMakeValidPackets(t *testing.T) {
	udp := UDP(client, frontend).WithPayload([]byte("query"))
	tests := []struct {
		name  string
		frame []byte
		// want are the checksum statuses the verifier must report.
		want map[string]ChecksumStatus
		// check looks at gopacket's decoding of the frame.
		check func(t *testing.T, p gopacket.Packet)
	}{
		{
			name:  "UDP with payload",
			frame: udp.Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumOK},
			check: func(t *testing.T, p gopacket.Packet) {
				u := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
				if u.SrcPort != 40000 || u.DstPort != 53 || u.Length != 13 || string(u.Payload) != "query" {
					t.Errorf("UDP header: %+v", u)
				}
			},
		},
		{
			name:  "TCP SYN with options",
			frame: TCP(client, frontend, SYN).WithTCPOptions(TCPOptMSS(1460), TCPOptSACKPermitted(), TCPOptTimestamps(7, 0), TCPOptNOP(), TCPOptWindowScale(7)).Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "tcp.checksum": ChecksumOK},
			check: func(t *testing.T, p gopacket.Packet) {
				tcp := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
				if !tcp.SYN || tcp.ACK || tcp.DataOffset != 10 || len(tcp.Options) != 5 {
					t.Errorf("TCP header: %+v", tcp)
				}
			},
		},
		{
			name:  "IP options, TTL, ID, TOS and DF",
			frame: udp.WithIPOptions(IPOptRouterAlert(), IPOptNOP(), IPOptRecordRoute(2)).WithTTL(3).WithID(4242).WithTOS(0xb8).WithDF().Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumOK},
			check: func(t *testing.T, p gopacket.Packet) {
				ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				if ip.IHL != 5+4 || ip.TTL != 3 || ip.Id != 4242 || ip.TOS != 0xb8 || ip.Flags != layers.IPv4DontFragment || len(ip.Options) != 3 {
					t.Errorf("IPv4 header: %+v", ip)
				}
			},
		},
		{
			name:  "ICMP echo request",
			frame: ICMPEcho(client.Addr(), frontend.Addr(), 7, 9).WithPayload([]byte("ping")).Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "icmp.checksum": ChecksumOK},
			check: func(t *testing.T, p gopacket.Packet) {
				m := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
				if m.TypeCode.Type() != ICMPEchoRequest || m.Id != 7 || m.Seq != 9 {
					t.Errorf("ICMP header: %+v", m)
				}
			},
		},
		{
			name:  "port unreachable quoting a UDP packet",
			frame: ICMPUnreachable(frontend.Addr(), client.Addr(), ICMPPortUnreachable, udp.Quote()).Bytes(),
			want: map[string]ChecksumStatus{
				"ipv4.checksum": ChecksumOK, "icmp.checksum": ChecksumOK, "icmp.inner.ipv4.checksum": ChecksumOK,
			},
			check: func(t *testing.T, p gopacket.Packet) {
				m := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
				if m.TypeCode != layers.CreateICMPv4TypeCode(3, 3) || len(m.Payload) != 28 {
					t.Errorf("ICMP header: %+v", m)
				}
			},
		},
		{
			name:  "VLAN tagged",
			frame: udp.WithVLAN(100).Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumOK},
			check: func(t *testing.T, p gopacket.Packet) {
				if v := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q); v.VLANIdentifier != 100 {
					t.Errorf("VLAN: %+v", v)
				}
			},
		},
		{
			name:  "link padding after the IP packet",
			frame: udp.WithPadding(13).Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumOK},
			check: func(t *testing.T, p gopacket.Packet) {
				if ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ip.Length != 33 {
					t.Errorf("IPv4 length %d, want 33", ip.Length)
				}
			},
		},
		{
			name:  "UDP without checksum",
			frame: udp.WithL4Checksum(0).Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumNone},
		},
		{
			name:  "bad IP checksum",
			frame: udp.WithBadIPChecksum().Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumBad, "udp.checksum": ChecksumOK},
		},
		{
			name:  "bad UDP checksum",
			frame: udp.WithBadL4Checksum().Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumBad},
		},
		{
			name:  "bad TCP checksum",
			frame: TCP(client, frontend, ACK|PSH).WithPayload([]byte("x")).WithBadL4Checksum().Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "tcp.checksum": ChecksumBad},
		},
		{
			name:  "bad ICMP checksum",
			frame: ICMPEcho(client.Addr(), frontend.Addr(), 1, 1).WithBadL4Checksum().Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "icmp.checksum": ChecksumBad},
		},
		{
			name:  "bad checksum in the quoted header",
			frame: ICMPUnreachable(frontend.Addr(), client.Addr(), ICMPPortUnreachable, udp.WithBadIPChecksum().Quote()).Bytes(),
			want: map[string]ChecksumStatus{
				"ipv4.checksum": ChecksumOK, "icmp.checksum": ChecksumOK, "icmp.inner.ipv4.checksum": ChecksumBad,
			},
		},
		{
			name:  "first fragment carrying the UDP header",
			frame: udp.WithMF().Bytes(),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumUnverifiable},
		},
		{
			name:  "truncated UDP payload",
			frame: Truncate(udp.Bytes(), 14+20+8+2),
			want:  map[string]ChecksumStatus{"ipv4.checksum": ChecksumOK, "udp.checksum": ChecksumUnverifiable},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checksumsOf(tt.frame); !mapsEqual(got, tt.want) {
				t.Errorf("checksums: got %v want %v\n%s", got, tt.want, Decode(tt.frame))
			}
			p := gopacket.NewPacket(tt.frame, layers.LayerTypeEthernet, gopacket.Default)
			if tt.check != nil {
				tt.check(t, p)
			}
			// gopacket's own verification must agree with ours wherever
			// ours gives a verdict.
			for name, lt := range map[string]gopacket.LayerType{
				"ipv4.checksum": layers.LayerTypeIPv4, "tcp.checksum": layers.LayerTypeTCP,
				"udp.checksum": layers.LayerTypeUDP, "icmp.checksum": layers.LayerTypeICMPv4,
			} {
				ours, known := tt.want[name]
				if !known || ours != ChecksumOK && ours != ChecksumBad {
					continue
				}
				l, ok := p.Layer(lt).(interface {
					VerifyChecksum() (error, gopacket.ChecksumVerificationResult)
				})
				if !ok {
					t.Errorf("gopacket found no %v layer", lt)
					continue
				}
				if l4, ok := l.(interface {
					SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
				}); ok {
					if err := l4.SetNetworkLayerForChecksum(p.NetworkLayer()); err != nil {
						t.Fatal(err)
					}
				}
				err, r := l.VerifyChecksum()
				if err != nil {
					t.Errorf("gopacket cannot verify %s: %v", name, err)
				} else if r.Valid != (ours == ChecksumOK) {
					t.Errorf("%s: gopacket says valid=%v, we say %v", name, r.Valid, ours)
				}
			}
		})
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestWithCopies(t *testing.T) {
	base := UDP(client, frontend).WithPayload([]byte("abc")).WithIPOptions(IPOptNOP())
	before := base.Bytes()
	_ = base.WithPayload([]byte("changed")).WithIPOptions(IPOptRouterAlert()).WithDst(backend).WithTTL(1).Bytes()
	if !bytes.Equal(base.Bytes(), before) {
		t.Fatal("a With method changed the Builder it was called on")
	}
	out := base.WithDst(backend)
	p := Decode(out.Bytes())
	if p.IPv4.Dst != backend.Addr() || p.UDP.Dst != backend.Port() || p.IPv4.Src != client.Addr() || p.UDP.Src != client.Port() {
		t.Errorf("WithDst: got %v:%d -> %v:%d", p.IPv4.Src, p.UDP.Src, p.IPv4.Dst, p.UDP.Dst)
	}
}

func TestBuildErrors(t *testing.T) {
	v6 := netip.MustParseAddrPort("[2001:db8::1]:53")
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"IPv6 address in an IPv4 header", func() error { _, err := UDP(client, v6).Build(); return err }, "IPv4 addresses"},
		{"fragment offset not a multiple of 8", func() error { _, err := UDP(client, frontend).WithFragOffset(12).Build(); return err }, "multiple of 8"},
		{"fragment size not a multiple of 8", func() error { _, err := UDP(client, frontend).Fragments(12); return err }, "multiple of 8"},
		{"VLAN id above 4095", func() error { _, err := UDP(client, frontend).WithVLAN(5000).Build(); return err }, "12 bits"},
		{"IP option shorter than its header", func() error {
			_, err := UDP(client, frontend).WithIPOptions(IPOption{OptionType: 148, OptionLength: 1}).Build()
			return err
		}, "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestFragments(t *testing.T) {
	payload := make([]byte, 100)
	for i := range payload {
		payload[i] = byte(i)
	}
	for _, tt := range []struct {
		name string
		b    Builder
		size int
		// wantLens are the IP payload lengths of the fragments.
		wantLens []int
	}{
		{"UDP in three fragments", UDP(client, frontend).WithPayload(payload).WithID(77), 48, []int{48, 48, 12}},
		{"TCP header split across fragments", TCP(client, frontend, ACK).WithPayload(payload[:10]).WithID(78), 8, []int{8, 8, 8, 6}},
		{"copied and uncopied options", UDP(client, frontend).WithPayload(payload).WithIPOptions(IPOptRouterAlert(), IPOptRecordRoute(1)).WithID(79), 56, []int{56, 52}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			whole := Decode(tt.b.Bytes())
			frags := tt.b.MustFragments(tt.size)
			if len(frags) != len(tt.wantLens) {
				t.Fatalf("got %d fragments, want %d", len(frags), len(tt.wantLens))
			}
			var body []byte
			for i, f := range frags {
				p := Decode(f)
				ip := p.IPv4
				hlen := int(ip.IHL) * 4
				if got := int(ip.TotalLength) - hlen; got != tt.wantLens[i] {
					t.Errorf("fragment %d carries %d bytes, want %d", i, got, tt.wantLens[i])
				}
				if ip.FragOffset != len(body) || ip.MF != (i < len(frags)-1) || ip.ID != whole.IPv4.ID {
					t.Errorf("fragment %d: offset %d MF %v id %d", i, ip.FragOffset, ip.MF, ip.ID)
				}
				// Router alert (148) has the copy bit, record route (7) does not.
				wantOpts := whole.IPv4.Options
				if i > 0 && len(wantOpts) > 0 {
					wantOpts = []byte{148, 4, 0, 0}
				}
				if !bytes.Equal(ip.Options, wantOpts) {
					t.Errorf("fragment %d options %x, want %x", i, ip.Options, wantOpts)
				}
				st := checksumsOf(f)
				if st["ipv4.checksum"] != ChecksumOK {
					t.Errorf("fragment %d: IP checksum %v", i, st["ipv4.checksum"])
				}
				if s, ok := st["udp.checksum"]; ok && s != ChecksumUnverifiable {
					t.Errorf("fragment %d: UDP checksum %v, want not verifiable", i, s)
				}
				body = append(body, f[14+hlen:]...)
			}
			wholeIP := tt.b.IPBytes()
			if want := wholeIP[int(wholeIP[0]&0xf)*4:]; !bytes.Equal(body, want) {
				t.Errorf("fragments reassemble to %x, want %x", body, want)
			}
		})
	}
}

func TestCuts(t *testing.T) {
	frame := UDP(client, frontend).WithIPOptions(IPOptRouterAlert()).WithPayload([]byte("ab")).Bytes()
	cuts := Cuts(frame)
	if len(cuts) != len(frame)-MinFrameLen {
		t.Fatalf("got %d cuts of a %d-byte frame", len(cuts), len(frame))
	}
	var boundaries []string
	for _, c := range cuts {
		if len(c.Frame) != c.Len || !bytes.Equal(c.Frame, frame[:c.Len]) {
			t.Fatalf("cut %d has %d bytes", c.Len, len(c.Frame))
		}
		if c.Boundary {
			boundaries = append(boundaries, c.Name())
		}
	}
	want := []string{
		"truncated to 14 bytes, after the ethernet header",
		"truncated to 34 bytes, after the ipv4 header",
		"truncated to 38 bytes, after the ipv4 options header",
		"truncated to 46 bytes, after the udp header",
	}
	if !slices.Equal(boundaries, want) {
		t.Errorf("boundaries:\n%s\nwant:\n%s", strings.Join(boundaries, "\n"), strings.Join(want, "\n"))
	}
	if got, want := cuts[37-MinFrameLen].Name(), "truncated to 37 bytes, inside the ipv4 options header (3 of 4 bytes)"; got != want {
		t.Errorf("got %q want %q", got, want)
	}
	if got, want := cuts[43-MinFrameLen].Name(), "truncated to 43 bytes, inside the udp header (5 of 8 bytes)"; got != want {
		t.Errorf("got %q want %q", got, want)
	}
}

func TestDecodeMalformed(t *testing.T) {
	udp := UDP(client, frontend).WithPayload([]byte("query"))
	tests := []struct {
		name  string
		frame []byte
		want  string // a problem the decoder must report
	}{
		{"IHL below 5", udp.WithIHL(4).Bytes(), "malformed: ipv4.ihl 4 is below 5"},
		{"IHL past the packet", Truncate(udp.WithIHL(15).Bytes(), 40), "truncated: ipv4 options header has 6 of 40 bytes"},
		{"total length below the header", udp.WithTotalLength(12).Bytes(), "malformed: ipv4.length 12 is below the header length 20"},
		{"total length past the frame", udp.WithTotalLength(200).Bytes(), "truncated: ipv4 packet has 33 of 200 bytes"},
		{"version 6 in an IPv4 frame", udp.WithVersion(6).Bytes(), "malformed: ipv4.version is 6"},
		{"TCP data offset below 5", setByte(TCP(client, frontend, SYN).Bytes(), 14+20+12, 0x40), "malformed: tcp.doff 4 is below 5"},
		{"UDP length differs from IP", setByte(udp.Bytes(), 14+20+5, 99), "malformed: udp.length 99 differs from the IP payload length 13"},
		{"truncated Ethernet header", Truncate(udp.Bytes(), 9), "truncated: ethernet header has 9 of 14 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Decode(tt.frame)
			if !slices.Contains(p.Problems, tt.want) {
				t.Errorf("problems %q, want %q", p.Problems, tt.want)
			}
		})
	}
	if p := Decode(udp.Bytes()); len(p.Problems) != 0 {
		t.Errorf("well-formed frame has problems %q", p.Problems)
	}
	// A header length that is set by hand still gets a correct checksum.
	if st := checksumsOf(udp.WithIHL(6).Bytes()); st["ipv4.checksum"] != ChecksumOK {
		t.Errorf("WithIHL: IP checksum %v", st["ipv4.checksum"])
	}
}

func setByte(b []byte, off int, v byte) []byte {
	b = slices.Clone(b)
	b[off] = v
	return b
}

func TestDiff(t *testing.T) {
	in := UDP(client, frontend).WithPayload(bytes.Repeat([]byte{'a'}, 64))
	tests := []struct {
		name      string
		got, want []byte
		lines     []string
		notLines  []string
	}{
		{
			name: "equal frames",
			got:  in.Bytes(), want: in.Bytes(),
		},
		{
			name: "destination address",
			got:  in.WithDstAddr(netip.MustParseAddr("10.0.0.1")).Bytes(),
			want: in.WithDstAddr(netip.MustParseAddr("10.0.0.2")).Bytes(),
			lines: []string{
				"ipv4.dst: got 10.0.0.1 want 10.0.0.2",
				"first difference at byte 25 (ipv4.checksum)",
			},
		},
		{
			name: "address rewritten without fixing the L4 checksum",
			got: func() []byte {
				b := in.Bytes()
				copy(b[14+16:], netip.MustParseAddr("10.0.1.5").AsSlice())
				binary.BigEndian.PutUint16(b[14+10:], 0)
				binary.BigEndian.PutUint16(b[14+10:], Checksum(b[14:34]))
				return b
			}(),
			want:     in.WithDstAddr(backend.Addr()).Bytes(),
			lines:    []string{"udp.checksum: got", "(bad, want", "(ok)"},
			notLines: []string{"ipv4"},
		},
		{
			name:  "payload beyond what the fields show",
			got:   setByte(in.Bytes(), len(in.Bytes())-1, 'b'),
			want:  in.Bytes(),
			lines: []string{"udp.checksum: got", "(bad, want", "first difference at byte 105 (payload): got 0x62 want 0x61"},
		},
		{
			name:  "lengths differ",
			got:   Truncate(in.Bytes(), 40),
			want:  in.Bytes(),
			lines: []string{"udp.sport: got (absent) want 40000", "length: got 40 want 106 bytes"},
		},
		{
			name:  "TCP flags",
			got:   TCP(client, frontend, SYN).Bytes(),
			want:  TCP(client, frontend, SYN|ACK).WithAck(0).Bytes(),
			lines: []string{"tcp.flags: got SYN want SYN|ACK"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Diff(tt.got, tt.want)
			if len(tt.lines) == 0 {
				if d != "" {
					t.Fatalf("diff of equal frames: %q", d)
				}
				return
			}
			if d == "" {
				t.Fatal("no diff for different frames")
			}
			for _, l := range tt.lines {
				if !strings.Contains(d, l) {
					t.Errorf("diff lacks %q:\n%s", l, d)
				}
			}
			for _, l := range tt.notLines {
				if strings.Contains(d, l) {
					t.Errorf("diff reports %q, which is equal:\n%s", l, d)
				}
			}
		})
	}
}

func TestVerdicts(t *testing.T) {
	tests := []struct {
		v    Verdict
		name string
		code int32
		xdp  bool
	}{
		{XDPPass, "XDP_PASS", 2, true},
		{XDPAborted, "XDP_ABORTED", 0, true},
		{TCActOK, "TC_ACT_OK", 0, false},
		{TCActUnspec, "TC_ACT_UNSPEC", -1, false},
		{TCActRedirect, "TC_ACT_REDIRECT", 7, false},
		{xdpVerdict(9), "XDP action 9", 9, true},
	}
	for _, tt := range tests {
		if tt.v.String() != tt.name || tt.v.Code() != tt.code || tt.v.isXDP() != tt.xdp || tt.v.isTC() == tt.xdp {
			t.Errorf("%v: code %d xdp %v", tt.v, tt.v.Code(), tt.v.isXDP())
		}
	}
	if TCActOK == XDPAborted {
		t.Error("TC_ACT_OK and XDP_ABORTED must differ as Verdicts")
	}
	if Verdict(0).String() != "unset verdict" {
		t.Errorf("zero Verdict: %v", Verdict(0))
	}
}

func TestNonIPFrames(t *testing.T) {
	arp := ARPRequest(DefaultSrcMAC, client.Addr(), frontend.Addr())
	if p := Decode(arp); p.Eth.Type != EtherTypeARP || len(arp) != 42 || p.IPv4 != nil {
		t.Errorf("ARP: %s", p)
	}
	v6 := IPv6UDP(netip.MustParseAddrPort("[2001:db8::1]:1000"), netip.MustParseAddrPort("[2001:db8::2]:53"), []byte("q"))
	gp := gopacket.NewPacket(v6, layers.LayerTypeEthernet, gopacket.Default)
	if u, ok := gp.Layer(layers.LayerTypeUDP).(*layers.UDP); !ok || u.DstPort != 53 {
		t.Fatalf("IPv6 UDP: %v", gp)
	}
	u := gp.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if err := u.SetNetworkLayerForChecksum(gp.NetworkLayer()); err != nil {
		t.Fatal(err)
	}
	if err, r := u.VerifyChecksum(); err != nil || !r.Valid {
		t.Errorf("IPv6 UDP checksum: %v %+v", err, r)
	}
	raw := Frame(DefaultSrcMAC, DefaultDstMAC, 0x88cc, []byte{1, 2, 3})
	if p := Decode(raw); p.Eth.Type != 0x88cc || !bytes.Equal(p.Payload, []byte{1, 2, 3}) {
		t.Errorf("raw frame: %s", p)
	}
}

// TestDecodeIPv6 checks the IPv6 side of the decoder: the TCP, UDP and
// ICMPv6 checksums over the IPv6 pseudo-header, and an ICMPv6 error's
// quote, whose L4 checksum is verified when the quote is whole.
func TestDecodeIPv6(t *testing.T) {
	c6 := netip.MustParseAddrPort("[2001:db8::10]:40000")
	f6 := netip.MustParseAddrPort("[2001:db8::1]:80")
	router := netip.MustParseAddr("2001:db8:1::1")
	reply := TCP6(f6, c6, ACK).WithPayload([]byte("answer"))
	tooBig := ICMPv6(router, f6.Addr(), ICMPv6PacketTooBig, 0, reply.IPBytes()).WithMTU(1400)
	// at sets the 16-bit word at off of a copy of frame.
	at := func(frame []byte, off int, v uint16) []byte {
		b := slices.Clone(frame)
		binary.BigEndian.PutUint16(b[off:], v)
		return b
	}
	const icmpCsum, innerTCPCsum = 14 + 40 + 2, 14 + 40 + 8 + 40 + 16
	tests := []struct {
		name  string
		frame []byte
		want  map[string]ChecksumStatus
	}{
		{"TCP", reply.Bytes(), map[string]ChecksumStatus{"tcp.checksum": ChecksumOK}},
		{"UDP", UDP6(c6, f6).WithPayload([]byte("q")).Bytes(), map[string]ChecksumStatus{"udp.checksum": ChecksumOK}},
		{"UDP without checksum", UDP6(c6, f6).WithL4Checksum(0).Bytes(), map[string]ChecksumStatus{"udp.checksum": ChecksumNone}},
		{"UDP with a wrong checksum", UDP6(c6, f6).WithL4Checksum(0x1234).Bytes(), map[string]ChecksumStatus{"udp.checksum": ChecksumBad}},
		{"packet too big quoting a whole segment", tooBig.Bytes(),
			map[string]ChecksumStatus{"icmpv6.checksum": ChecksumOK, "icmpv6.inner.tcp.checksum": ChecksumOK}},
		{"the destination changed without the ICMPv6 checksum (pseudo-header)",
			tooBig.WithDst(netip.AddrPortFrom(c6.Addr(), 0)).WithL4Checksum(binary.BigEndian.Uint16(tooBig.Bytes()[icmpCsum:])).Bytes(),
			map[string]ChecksumStatus{"icmpv6.checksum": ChecksumBad, "icmpv6.inner.tcp.checksum": ChecksumOK}},
		{"a wrong quoted checksum",
			func() []byte {
				b := tooBig.Bytes()
				old := binary.BigEndian.Uint16(b[innerTCPCsum:])
				b = at(b, innerTCPCsum, old+1)
				// The ICMPv6 checksum follows the byte change.
				return at(b, icmpCsum, binary.BigEndian.Uint16(b[icmpCsum:])-1)
			}(),
			map[string]ChecksumStatus{"icmpv6.checksum": ChecksumOK, "icmpv6.inner.tcp.checksum": ChecksumBad}},
		{"a quote cut short", ICMPv6(router, f6.Addr(), ICMPv6PacketTooBig, 0, reply.IPBytes()[:50]).Bytes(),
			map[string]ChecksumStatus{"icmpv6.checksum": ChecksumOK}},
		{"neighbour solicitation", IPv6NeighborSolicit(DefaultSrcMAC, c6.Addr(), f6.Addr()), map[string]ChecksumStatus{"icmpv6.checksum": ChecksumOK}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checksumsOf(tt.frame); !maps.Equal(got, tt.want) {
				t.Errorf("checksums %v, want %v\n%s", got, tt.want, Decode(tt.frame))
			}
		})
	}
	p := Decode(tooBig.Bytes())
	if p.IPv6 == nil || p.IPv6.Dst != f6.Addr() || p.ICMP == nil || p.ICMP.Type != ICMPv6PacketTooBig ||
		p.ICMP.Inner == nil || len(p.Problems) > 0 {
		t.Errorf("packet too big decoded as %+v (problems %v)\n%s", p, p.Problems, p)
	}
	for _, want := range []string{"icmpv6.mtu: 1400", "icmpv6.inner.ipv6.src: 2001:db8::1", "icmpv6.inner.tcp.dport: 40000", "icmpv6.inner.payload"} {
		if !strings.Contains(p.String(), want) {
			t.Errorf("no %q in\n%s", want, p)
		}
	}
	if d := Diff(tooBig.WithMTU(1280).Bytes(), tooBig.Bytes()); !strings.Contains(d, "icmpv6.mtu: got 1280 want 1400") {
		t.Errorf("Diff of two MTUs:\n%s", d)
	}
}
