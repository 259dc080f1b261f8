package pktest_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest/sample"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// The sample's address plan: a client outside, a frontend the sample
// translates for UDP and TCP port 53, and the backend it translates to.
var (
	client      = netip.MustParseAddrPort("192.0.2.10:40000")
	frontend    = netip.MustParseAddrPort("10.96.0.10:53")
	backend     = netip.MustParseAddrPort("10.0.1.5:5353")
	frontendWeb = netip.MustParseAddrPort("10.96.0.10:80")
	elsewhere   = netip.MustParseAddrPort("10.96.0.11:53")
)

// sampleMark is the value of sample_mark in the C program.
const sampleMark = 0x5a

// hook is one of the sample's two entry points, with the verdicts it gives
// for each of the sample's three actions.
type hook struct {
	name                string
	prog                *ebpf.Program
	rewrite, pass, drop pktest.Verdict
	objs                *sample.SampleObjects
}

type sampleOptions struct {
	// bugSkipL4Csum loads the sample with the checksum bug switched on.
	bugSkipL4Csum bool
}

// loadSample loads the sample program; the test fails where privileged
// tests must run and the kernel lacks XDP or TC programs.
func loadSample(t *testing.T, opts sampleOptions) *sample.SampleObjects {
	t.Helper()
	return load(t, opts)
}

// loadSampleB is loadSample for benchmarks.
func loadSampleB(b *testing.B) *sample.SampleObjects {
	b.Helper()
	return load(b, sampleOptions{})
}

func load(t testing.TB, opts sampleOptions) *sample.SampleObjects {
	t.Helper()
	sandbox.RequireRoot(t)
	sandbox.RequireFeature(t, "XDP programs", features.HaveProgramType(ebpf.XDP))
	sandbox.RequireFeature(t, "TC programs", features.HaveProgramType(ebpf.SchedCLS))
	spec, err := sample.LoadSample()
	if err != nil {
		t.Fatal(err)
	}
	if opts.bugSkipL4Csum {
		if err := spec.Variables["sample_bug_skip_l4_csum"].Set(uint8(1)); err != nil {
			t.Fatal(err)
		}
	}
	objs := &sample.SampleObjects{}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load the sample program: %v\n%+v", err, ve)
		}
		t.Fatalf("load the sample program: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs
}

func hooks(objs *sample.SampleObjects) []hook {
	return []hook{
		{name: "xdp", prog: objs.PktestSampleXdp, rewrite: pktest.XDPTX, pass: pktest.XDPPass, drop: pktest.XDPDrop, objs: objs},
		{name: "tc", prog: objs.PktestSampleTc, rewrite: pktest.TCActOK, pass: pktest.TCActOK, drop: pktest.TCActShot, objs: objs},
	}
}

func natKey(a netip.AddrPort, proto uint8) sample.SampleNatKey {
	return sample.SampleNatKey{Addr: be32(a.Addr()), Port: be16(a.Port()), Proto: proto}
}

// be32 and be16 give the native integer whose memory holds the value in
// network order, as the C structs keep it.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func be16(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// resetSample writes the NAT entries of the address plan and zeroes the
// event counters, so that every case starts from the same state.
func resetSample(tb testing.TB, objs *sample.SampleObjects) {
	tb.Helper()
	val := sample.SampleNatVal{Addr: be32(backend.Addr()), Port: be16(backend.Port())}
	for _, proto := range []uint8{pktest.ProtoUDP, pktest.ProtoTCP} {
		if err := objs.SampleNat.Put(natKey(frontend, proto), val); err != nil {
			tb.Fatal(err)
		}
	}
	for ev := range uint32(sample.SampleEventSAMPLE_EV_MAX) {
		if err := objs.SampleEvents.Put(ev, uint64(0)); err != nil {
			tb.Fatal(err)
		}
	}
}

// events returns the sample's event counters.
func events(tb testing.TB, objs *sample.SampleObjects) map[sample.SampleEvent]uint64 {
	tb.Helper()
	m := map[sample.SampleEvent]uint64{}
	for ev := range sample.SampleEventSAMPLE_EV_MAX {
		var n uint64
		if err := objs.SampleEvents.Lookup(uint32(ev), &n); err != nil {
			tb.Fatal(err)
		}
		if n != 0 {
			m[ev] = n
		}
	}
	return m
}

// tookPath checks that the program counted exactly one event, ev: that it
// took the path the case is about, not merely one with the same verdict.
func tookPath(objs *sample.SampleObjects, ev sample.SampleEvent) func(testing.TB, pktest.Result) {
	return func(tb testing.TB, _ pktest.Result) {
		tb.Helper()
		got := events(tb, objs)
		if len(got) != 1 || got[ev] != 1 {
			tb.Errorf("events: got %v, want one %v", got, ev)
		}
	}
}

// scenario is a row shared by the XDP and TC tables.
type scenario struct {
	name string
	in   []byte
	// out is the expected frame after a rewrite; nil for other actions.
	out          []byte
	action       string // "rewrite", "pass" or "drop"
	event        sample.SampleEvent
	badChecksums bool
}

// adjustBad returns what an incremental checksum update (RFC 1624) makes of
// a wrong checksum bad when the right one goes from good to goodOut: the
// error is carried over, not repaired.
func adjustBad(bad, good, goodOut uint16) uint16 {
	s := uint32(^bad) + uint32(^goodOut) + uint32(good)
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func udpChecksum(frame []byte) uint16 {
	return pktest.Decode(frame).UDP.Checksum
}

// udpPayloadForZeroChecksum returns a two-byte payload for which the
// translated datagram's checksum computes to zero, which UDP must send as
// 0xffff because zero means "no checksum". With a zero payload the
// checksum is the complement of the sum of everything else; a payload equal
// to that checksum brings the sum to all ones.
func udpPayloadForZeroChecksum(t *testing.T) []byte {
	t.Helper()
	c := udpChecksum(pktest.UDP(client, backend).WithPayload([]byte{0, 0}).Bytes())
	p := binary.BigEndian.AppendUint16(nil, c)
	if got := udpChecksum(pktest.UDP(client, backend).WithPayload(p).Bytes()); got != 0xffff {
		t.Fatalf("payload %x gives UDP checksum %#04x, want 0xffff", p, got)
	}
	return p
}

func scenarios(t *testing.T) []scenario {
	udp := pktest.UDP(client, frontend).WithPayload([]byte("query"))
	syn := pktest.TCP(client, frontend, pktest.SYN).WithTCPOptions(
		pktest.TCPOptMSS(1460), pktest.TCPOptSACKPermitted(), pktest.TCPOptTimestamps(1, 0), pktest.TCPOptNOP(), pktest.TCPOptWindowScale(7))
	data := pktest.TCP(client, frontend, pktest.ACK|pktest.PSH).WithSeq(1000).WithAck(2000).WithPayload([]byte("GET / HTTP/1.0\r\n\r\n"))
	withOpts := udp.WithIPOptions(pktest.IPOptRouterAlert(), pktest.IPOptNOP(), pktest.IPOptRecordRoute(2))
	zero := pktest.UDP(client, frontend).WithPayload(udpPayloadForZeroChecksum(t))
	bad := udp.WithBadL4Checksum()
	badOut := udp.WithDst(backend).WithL4Checksum(adjustBad(udpChecksum(bad.Bytes()), udpChecksum(udp.Bytes()), udpChecksum(udp.WithDst(backend).Bytes())))
	big := pktest.UDP(client, frontend).WithPayload(make([]byte, 1000)).WithID(4711)
	frags := big.MustFragments(480)
	tinyFrags := data.WithID(4712).MustFragments(8)

	rows := []scenario{
		{name: "UDP to the frontend: destination rewritten", in: udp.Bytes(), out: udp.WithDst(backend).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},
		{name: "TCP SYN with options to the frontend: destination rewritten", in: syn.Bytes(), out: syn.WithDst(backend).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},
		{name: "TCP data to the frontend: destination rewritten", in: data.Bytes(), out: data.WithDst(backend).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},
		{name: "IP options: rewritten behind them", in: withOpts.Bytes(), out: withOpts.WithDst(backend).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},
		{name: "link padding: rewritten, padding kept", in: udp.WithPadding(17).Bytes(), out: udp.WithDst(backend).WithPadding(17).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},
		{name: "UDP without checksum: rewritten, still without", in: udp.WithL4Checksum(0).Bytes(), out: udp.WithDst(backend).WithL4Checksum(0).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},
		{name: "UDP checksum that becomes zero: sent as 0xffff", in: zero.Bytes(), out: zero.WithDst(backend).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},
		{name: "UDP with a wrong checksum: rewritten, still wrong", in: bad.Bytes(), out: badOut.Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN, badChecksums: true},
		{name: "TTL 1 and DF: rewritten, TTL and flags kept", in: udp.WithTTL(1).WithDF().Bytes(), out: udp.WithTTL(1).WithDF().WithDst(backend).Bytes(), action: "rewrite", event: sample.SampleEventSAMPLE_EV_REWRITTEN},

		{name: "TCP to another port of the frontend: passes", in: pktest.TCP(client, frontendWeb, pktest.SYN).Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_NO_MATCH},
		{name: "UDP to another address: passes", in: pktest.UDP(client, elsewhere).Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_NO_MATCH},
		{name: "ICMP echo to the frontend: passes", in: pktest.ICMPEcho(client.Addr(), frontend.Addr(), 1, 1).Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_NO_MATCH},
		{name: "port unreachable quoting a packet to the frontend: passes", in: pktest.ICMPUnreachable(elsewhere.Addr(), client.Addr(), pktest.ICMPPortUnreachable, udp.Quote()).Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_NO_MATCH},
		{name: "other IP protocol (GRE) to the frontend: passes", in: pktest.IPv4(client.Addr(), frontend.Addr(), 47).WithPayload([]byte{0, 0, 0x08, 0}).Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_NO_MATCH},
		{name: "UDP with a wrong IP checksum to another address: passes untouched", in: pktest.UDP(client, elsewhere).WithBadIPChecksum().Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_NO_MATCH, badChecksums: true},

		{name: "first fragment with the UDP header: passes", in: frags[0], action: "pass", event: sample.SampleEventSAMPLE_EV_FRAGMENT},
		{name: "middle fragment: passes", in: frags[1], action: "pass", event: sample.SampleEventSAMPLE_EV_FRAGMENT},
		{name: "last fragment: passes", in: frags[2], action: "pass", event: sample.SampleEventSAMPLE_EV_FRAGMENT},
		{name: "first fragment splitting the TCP header: passes", in: tinyFrags[0], action: "pass", event: sample.SampleEventSAMPLE_EV_FRAGMENT},
		{name: "non-first fragment whose payload looks like a UDP header to the frontend: passes", in: udp.WithFragOffset(64).Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_FRAGMENT},

		{name: "IHL below 5: dropped", in: udp.WithIHL(4).Bytes(), action: "drop", event: sample.SampleEventSAMPLE_EV_MALFORMED},
		{name: "version 6 in an IPv4 frame: dropped", in: udp.WithVersion(6).Bytes(), action: "drop", event: sample.SampleEventSAMPLE_EV_MALFORMED},
		{name: "total length below the header: dropped", in: udp.WithTotalLength(19).Bytes(), action: "drop", event: sample.SampleEventSAMPLE_EV_MALFORMED},
		{name: "total length beyond the frame: passes untouched", in: udp.WithTotalLength(200).Bytes(), action: "pass", event: sample.SampleEventSAMPLE_EV_TRUNCATED},
		{name: "IHL longer than the total length: dropped", in: udp.WithIHL(15).Bytes(), action: "drop", event: sample.SampleEventSAMPLE_EV_MALFORMED},

		{name: "ARP request: dropped", in: pktest.ARPRequest(pktest.DefaultSrcMAC, client.Addr(), frontend.Addr()), action: "drop", event: sample.SampleEventSAMPLE_EV_NOT_IPV4},
		{name: "IPv6 UDP: dropped", in: pktest.IPv6UDP(netip.MustParseAddrPort("[2001:db8::1]:40000"), netip.MustParseAddrPort("[2001:db8::2]:53"), []byte("q")), action: "drop", event: sample.SampleEventSAMPLE_EV_NOT_IPV4},
		{name: "VLAN-tagged IPv4 to the frontend: dropped", in: udp.WithVLAN(100).Bytes(), action: "drop", event: sample.SampleEventSAMPLE_EV_NOT_IPV4},
		{name: "LLDP frame: dropped", in: pktest.Frame(pktest.DefaultSrcMAC, pktest.DefaultDstMAC, 0x88cc, make([]byte, 32)), action: "drop", event: sample.SampleEventSAMPLE_EV_NOT_IPV4},
		{name: "IPv4 EtherType on an Ethernet header alone: passes", in: pktest.Truncate(udp.Bytes(), pktest.MinFrameLen), action: "pass", event: sample.SampleEventSAMPLE_EV_TRUNCATED},
	}
	// Every truncation of a translatable packet, at and between header
	// boundaries, must pass untouched: never a half translation.
	for _, in := range []struct {
		what  string
		frame []byte
	}{
		{"UDP with IP options", withOpts.Bytes()},
		{"TCP SYN with options", syn.Bytes()},
	} {
		for _, c := range pktest.Cuts(in.frame) {
			if c.Len == pktest.MinFrameLen {
				continue // the row above
			}
			rows = append(rows, scenario{name: in.what + " " + c.Name() + ": passes", in: c.Frame, action: "pass", event: sample.SampleEventSAMPLE_EV_TRUNCATED})
		}
	}
	return rows
}

// table turns the shared scenarios into the fixture table of one hook.
func table(t *testing.T, h hook) []pktest.Case {
	var cases []pktest.Case
	for _, s := range scenarios(t) {
		c := pktest.Case{
			Name:         s.name,
			In:           s.in,
			Setup:        func(tb testing.TB) { resetSample(tb, h.objs) },
			Check:        tookPath(h.objs, s.event),
			BadChecksums: s.badChecksums,
		}
		switch s.action {
		case "rewrite":
			c.Verdict, c.Out = h.rewrite, s.out
			if h.name == "tc" {
				path := c.Check
				c.Check = func(tb testing.TB, r pktest.Result) {
					path(tb, r)
					if r.SKB.Mark != sampleMark {
						tb.Errorf("skb->mark %#x, want %#x", r.SKB.Mark, sampleMark)
					}
					if !r.ChecksumComplete {
						tb.Error("TC case did not run with CHECKSUM_COMPLETE")
					}
				}
			}
		case "pass":
			c.Verdict = h.pass
		case "drop":
			c.Verdict = h.drop
		}
		cases = append(cases, c)
	}
	return cases
}

func TestSampleFixtures(t *testing.T) {
	objs := loadSample(t, sampleOptions{})
	for _, h := range hooks(objs) {
		t.Run(h.name, func(t *testing.T) {
			pktest.Run(t, h.prog, table(t, h))
		})
	}
}

// TestSampleTCContext covers what only TC has: the skb's context in and
// out, and the choice of checksum state.
func TestSampleTCContext(t *testing.T) {
	objs := loadSample(t, sampleOptions{})
	udp := pktest.UDP(client, frontend).WithPayload([]byte("query"))
	reset := func(tb testing.TB) { resetSample(tb, objs) }
	pktest.Run(t, objs.PktestSampleTc, []pktest.Case{
		{
			Name: "packet already marked: passes untouched", In: udp.Bytes(), Verdict: pktest.TCActOK,
			SKB:   &pktest.SKBContext{Mark: sampleMark, Priority: 7, CB: [5]uint32{1, 2, 3, 4, 5}},
			Setup: reset,
			Check: func(tb testing.TB, r pktest.Result) {
				tookPath(objs, sample.SampleEventSAMPLE_EV_MARKED)(tb, r)
				if r.SKB.Mark != sampleMark || r.SKB.Priority != 7 || r.SKB.CB != [5]uint32{1, 2, 3, 4, 5} {
					tb.Errorf("context after the run: %+v", r.SKB)
				}
				if r.SKB.Ifindex != 1 {
					tb.Errorf("skb of the loopback device expected, ifindex %d", r.SKB.Ifindex)
				}
			},
		},
		{
			Name: "CHECKSUM_NONE skb: rewritten the same", In: udp.Bytes(), Verdict: pktest.TCActOK, Out: udp.WithDst(backend).Bytes(),
			SKBChecksum: pktest.SKBChecksumNone,
			Setup:       reset,
			Check: func(tb testing.TB, r pktest.Result) {
				tookPath(objs, sample.SampleEventSAMPLE_EV_REWRITTEN)(tb, r)
				if r.ChecksumComplete {
					tb.Error("ran with CHECKSUM_COMPLETE")
				}
			},
		},
	})
}

// TestSampleXDPFragments covers multi-buffer frames: the sample has no frags
// support, so it sees only the linear part and must pass what it cannot
// see whole; the kernel hands back all of the frame.
func TestSampleXDPFragments(t *testing.T) {
	objs := loadSample(t, sampleOptions{})
	udp := pktest.UDP(client, frontend).WithPayload(make([]byte, 200))
	reset := func(tb testing.TB) { resetSample(tb, objs) }
	truncated := tookPath(objs, sample.SampleEventSAMPLE_EV_TRUNCATED)
	linear := func(n uint32) func(testing.TB, pktest.Result) {
		return func(tb testing.TB, r pktest.Result) {
			truncated(tb, r)
			if r.XDP.LinearLen != n {
				tb.Errorf("linear part after the run: %d bytes, want %d", r.XDP.LinearLen, n)
			}
		}
	}
	pktest.Run(t, objs.PktestSampleXdp, []pktest.Case{
		{Name: "headers linear, payload in a fragment: passes whole", In: udp.Bytes(), Verdict: pktest.XDPPass, XDP: &pktest.XDPContext{LinearLen: 14 + 20 + 8}, Setup: reset, Check: linear(42)},
		{Name: "IP header cut by the fragment boundary: passes whole", In: udp.Bytes(), Verdict: pktest.XDPPass, XDP: &pktest.XDPContext{LinearLen: 20}, Setup: reset, Check: linear(20)},
		{Name: "only the Ethernet header linear: passes whole", In: udp.Bytes(), Verdict: pktest.XDPPass, XDP: &pktest.XDPContext{LinearLen: 14}, Setup: reset, Check: linear(14)},
	})
}

// TestSampleLargeFrames covers the kernel's size limits, which differ by
// hook: a TC skb is linear up to a page minus headroom and shared info,
// an XDP frame is linear up to 3520 bytes and continues in fragments.
func TestSampleLargeFrames(t *testing.T) {
	objs := loadSample(t, sampleOptions{})
	reset := func(tb testing.TB) { resetSample(tb, objs) }
	frame := func(n int) pktest.Builder {
		return pktest.UDP(client, frontend).WithPayload(make([]byte, n-14-20-8))
	}
	pktest.Run(t, objs.PktestSampleXdp, []pktest.Case{
		{Name: "3520 bytes, all linear: rewritten", In: frame(3520).Bytes(), Verdict: pktest.XDPTX, Out: frame(3520).WithDst(backend).Bytes(), Setup: reset, Check: tookPath(objs, sample.SampleEventSAMPLE_EV_REWRITTEN)},
		{Name: "3521 bytes, one in a fragment: passes whole", In: frame(3521).Bytes(), Verdict: pktest.XDPPass, Setup: reset, Check: tookPath(objs, sample.SampleEventSAMPLE_EV_TRUNCATED)},
		{Name: "9000 bytes (jumbo): passes whole", In: frame(9000).Bytes(), Verdict: pktest.XDPPass, Setup: reset, Check: tookPath(objs, sample.SampleEventSAMPLE_EV_TRUNCATED)},
	})
	pktest.Run(t, objs.PktestSampleTc, []pktest.Case{
		{Name: "3712 bytes: rewritten", In: frame(3712).Bytes(), Verdict: pktest.TCActOK, Out: frame(3712).WithDst(backend).Bytes(), Setup: reset, Check: tookPath(objs, sample.SampleEventSAMPLE_EV_REWRITTEN)},
	})
	_, err := pktest.Exec(objs.PktestSampleTc, pktest.Case{In: frame(3713).Bytes()})
	if err == nil {
		t.Error("a 3713-byte frame ran at TC; the documented limit is 3712 bytes")
	}
}

// TestSampleIfindex runs a TC case on an skb of a device in a test network
// namespace, as programs that read skb->ifindex need.
func TestSampleIfindex(t *testing.T) {
	objs := loadSample(t, sampleOptions{})
	ns, err := sandbox.NewNetns("pktest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	})
	veth := &netlinkVeth{name: "pkt0", peer: "pkt1"}
	idx, err := veth.add(ns)
	if err != nil {
		t.Fatal(err)
	}
	in := pktest.UDP(client, elsewhere).Bytes()
	var res pktest.Result
	var errUnknown error
	err = ns.Do(func() error {
		var err error
		res, err = pktest.Exec(objs.PktestSampleTc, pktest.Case{In: in, SKB: &pktest.SKBContext{Ifindex: uint32(idx)}})
		_, errUnknown = pktest.Exec(objs.PktestSampleTc, pktest.Case{In: in, SKB: &pktest.SKBContext{Ifindex: 999999}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.SKB.Ifindex != uint32(idx) || res.Verdict != pktest.TCActOK {
		t.Errorf("run on %s (ifindex %d): verdict %v, skb ifindex %d", veth.name, idx, res.Verdict, res.SKB.Ifindex)
	}
	if errUnknown == nil {
		t.Error("an unknown ifindex ran")
	}
}

// netlinkVeth is a veth pair created inside a test namespace.
type netlinkVeth struct{ name, peer string }

func (v *netlinkVeth) add(ns *sandbox.Netns) (int, error) {
	nl := ns.Netlink()
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: v.name}, PeerName: v.peer}); err != nil {
		return 0, fmt.Errorf("add veth %s: %w", v.name, err)
	}
	link, err := nl.LinkByName(v.name)
	if err != nil {
		return 0, fmt.Errorf("find veth %s: %w", v.name, err)
	}
	return link.Attrs().Index, nil
}
