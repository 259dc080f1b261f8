package tcpkt_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// rst is the reset the node answers a client's segment with: from the
// frontend the client talks to, out of the device back to the router, as
// the kernel's resets are (window 0, no options, TTL 64, DF, IP ID 0).
func rst(from, to netip.AddrPort, flags pktest.TCPFlags, seq, ack uint32) pktest.Builder {
	return toRouter(pktest.TCP(from, to, flags).WithSeq(seq).WithAck(ack).WithWindow(0).WithID(0).WithDF())
}

// TestResetWhenTheBackendIsRemoved: a client's segment of an established
// flow whose backend was removed from the Service is answered with a TCP
// reset from the frontend, built per RFC 793's reset generation, and the
// flow's entries are gone, so the client sees ECONNRESET at once rather
// than retransmitting to a pod that is no more.
func TestResetWhenTheBackendIsRemoved(t *testing.T) {
	f := newFixture(t, loadOptions{})
	local := netip.MustParseAddrPort("10.244.1.20:8080")
	localNext := netip.MustParseAddrPort("10.244.1.21:8080")
	remote := netip.MustParseAddrPort("10.244.2.20:8080")
	remoteNext := netip.MustParseAddrPort("10.244.2.21:8080")
	web := func(ep netip.AddrPort, node string) *model.State {
		return state(service{name: "web", clusterIP: "10.96.0.10", port: 80, proto: model.TCP, nodePort: npWebLocal, endpoints: []string{at(ep, node)}})
	}
	fe := np(npWebLocal)
	seg := func(flags pktest.TCPFlags) pktest.Builder {
		return fromOutside(pktest.TCP(client, fe, flags).WithSeq(1000).WithAck(5000))
	}
	payload := []byte("GET / HTTP/1.1\r\nHost: web\r\n\r\n")
	ipOpts := []pktest.IPOption{pktest.IPOptNOP(), pktest.IPOptRecordRoute(2)}
	tcpOpts := []pktest.TCPOption{pktest.TCPOptNOP(), pktest.TCPOptNOP(), pktest.TCPOptTimestamps(77, 88)}

	cases := []struct {
		name string
		// backend and next are the flow's backend and the one that
		// replaces it; node says where they run.
		backend, next netip.AddrPort
		node          string
		in            pktest.Builder
		verdict       pktest.Verdict
		out           pktest.Builder
		resets        uint64
		// trimmed: the segment is longer than the reset, and cutting it
		// leaves the skb CHECKSUM_NONE.
		trimmed bool
	}{
		{name: "pure ACK, local backend: RST with SEQ=SEG.ACK",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.ACK),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST, 5000, 0), resets: 1},
		{name: "ACK with data: the data is cut off",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.ACK | pktest.PSH).WithPayload(payload),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST, 5000, 0), resets: 1, trimmed: true},
		{name: "TCP options and data: both cut off",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.ACK).WithTCPOptions(tcpOpts...).WithPayload(payload),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST, 5000, 0), resets: 1, trimmed: true},
		{name: "IP options: the reset has none",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.ACK).WithIPOptions(ipOpts...).WithPayload(payload),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST, 5000, 0), resets: 1, trimmed: true},
		{name: "DSCP kept, ECN bits not",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.ACK).WithTOS(0xb8 | 0x02),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST, 5000, 0).WithTOS(0xb8), resets: 1},
		{name: "FIN without ACK: RST+ACK with SEQ=0, ACK=SEG.SEQ+SEG.LEN counting the FIN",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.FIN).WithPayload(payload),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST|pktest.ACK, 0, 1000+uint32(len(payload))+1), resets: 1, trimmed: true},
		{name: "data without ACK: ACK=SEG.SEQ+SEG.LEN",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.PSH).WithPayload(payload[:5]),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST|pktest.ACK, 0, 1005), resets: 1, trimmed: true},
		{name: "remote backend with source NAT: RST from the NodePort, the port freed",
			backend: remote, next: remoteNext, node: otherNode, in: seg(pktest.ACK).WithPayload(payload),
			verdict: pktest.TCActRedirect, out: rst(fe, client, pktest.RST, 5000, 0), resets: 1, trimmed: true},
		{name: "the client's own RST: not answered, the flow ends",
			backend: local, next: localNext, node: thisNode, in: seg(pktest.RST | pktest.ACK),
			verdict: pktest.TCActShot, resets: 0},
		{name: "the client's own RST to a remote backend: not answered, the flow ends",
			backend: remote, next: remoteNext, node: otherNode, in: seg(pktest.RST),
			verdict: pktest.TCActShot, resets: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.resetCT(t)
			f.sync(t, web(c.backend, c.node))
			f.open(t, fromOutside(pktest.TCP(client, fe, pktest.SYN)))
			f.sync(t, web(c.next, c.node))
			reset, resetOK := f.counted(bpfobj.TcLbMetricLB_M_TC_RESET, c.resets)
			pc := pktest.Case{
				Name: c.name, In: c.in.Bytes(), Verdict: c.verdict,
				Do: f.ns.Do, SKB: &pktest.SKBContext{Ifindex: f.ifindex},
				Setup: reset,
				Check: func(tb testing.TB, r pktest.Result) {
					resetOK(tb, r)
					if c.verdict == pktest.TCActRedirect {
						if err := gopacketChecksums(r.Out); err != nil {
							tb.Error(err)
						}
						if r.SKB.Ifindex != f.ifindex {
							tb.Errorf("sent out of ifindex %d, want the device it came in on (%d)", r.SKB.Ifindex, f.ifindex)
						}
					}
				},
			}
			if c.verdict == pktest.TCActRedirect {
				pc.Out = c.out.Bytes()
			}
			if c.trimmed {
				pc.SKBChecksum = pktest.SKBChecksumNone
			}
			pktest.RunCase(t, f.objs.TcIngress, pc)
			if n := f.flows(t); n != 0 {
				t.Errorf("%d flow entries left, want none", n)
			}
			// The next connection from the same port gets the live backend.
			f.open(t, fromOutside(pktest.TCP(client, fe, pktest.SYN)))
		})
	}
}

// TestResetWhenTheBackendIDNamesAnotherEndpoint: once a removed backend's
// id is given to a new endpoint, a flow of the old one is reset, not sent
// to the newcomer.
func TestResetWhenTheBackendIDNamesAnotherEndpoint(t *testing.T) {
	f := newFixture(t, loadOptions{})
	first := netip.MustParseAddrPort("10.244.1.20:8080")
	second := netip.MustParseAddrPort("10.244.1.21:8080")
	web := func(eps ...netip.AddrPort) *model.State {
		s := service{name: "web", clusterIP: "10.96.0.10", port: 80, proto: model.TCP, nodePort: npWebLocal}
		for _, ep := range eps {
			s.endpoints = append(s.endpoints, at(ep, thisNode))
		}
		return state(s)
	}
	f.sync(t, web(first))
	id, ok := f.w.BackendID(backendOf(first))
	if !ok {
		t.Fatal("first endpoint not programmed")
	}
	f.open(t, fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN)))
	f.sync(t, web())
	f.sync(t, web(second))
	if got, _ := f.w.BackendID(backendOf(second)); got != id {
		t.Fatalf("the new endpoint has id %d, the removed one had %d: the case does not hold", got, id)
	}
	ack := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.ACK).WithAck(5000))
	f.run(t, []row{{Case: pktest.Case{
		Name: "segment of the old flow", In: ack.Bytes(),
		Verdict: pktest.TCActRedirect, Out: rst(np(npWebLocal), client, pktest.RST, 5000, 0).Bytes(),
	}}})
}

// TestResetLeavesOtherTrafficAlone: what re-selects or passes today still
// does once a backend is removed: a new SYN, UDP, and a terminating
// endpoint's flows.
func TestResetLeavesOtherTrafficAlone(t *testing.T) {
	f := newFixture(t, loadOptions{})
	first := netip.MustParseAddrPort("10.244.1.20:8080")
	second := netip.MustParseAddrPort("10.244.1.21:8080")
	dnsFirst := netip.MustParseAddrPort("10.244.1.20:5353")
	dnsSecond := netip.MustParseAddrPort("10.244.1.21:5353")
	st := func(web, dns netip.AddrPort, terminating ...netip.AddrPort) *model.State {
		w := service{name: "web", clusterIP: "10.96.0.10", port: 80, proto: model.TCP, nodePort: npWebLocal, endpoints: []string{at(web, thisNode)}}
		for _, ep := range terminating {
			w.terminating = append(w.terminating, at(ep, thisNode))
		}
		return state(w, service{name: "dns", clusterIP: "10.96.0.12", port: 53, proto: model.UDP, nodePort: npDNSRemote, endpoints: []string{at(dns, thisNode)}})
	}
	syn := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN))
	ack := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.ACK).WithPayload([]byte("more")))
	query := fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload([]byte("q")))
	f.sync(t, st(first, dnsFirst))
	f.run(t, []row{
		{Case: pktest.Case{Name: "TCP flow opened", In: syn.Bytes(), Verdict: pktest.TCActOK, Out: syn.WithDst(first).Bytes()}},
		{Case: pktest.Case{Name: "UDP flow opened", In: query.Bytes(), Verdict: pktest.TCActOK, Out: query.WithDst(dnsFirst).Bytes()}},
	})
	noReset, noResetOK := f.counted(bpfobj.TcLbMetricLB_M_TC_RESET, 0)
	f.sync(t, st(second, dnsSecond, first))
	f.run(t, []row{
		{Case: pktest.Case{Name: "terminating, still listed: the flow is translated as before", In: ack.Bytes(), Verdict: pktest.TCActOK, Out: ack.WithDst(first).Bytes(), Setup: noReset, Check: noResetOK}},
		{Case: pktest.Case{Name: "UDP to a removed backend: the next datagram selects again", In: query.Bytes(), Verdict: pktest.TCActOK, Out: query.WithDst(dnsSecond).Bytes()}},
	})
	f.sync(t, st(second, dnsSecond))
	f.run(t, []row{
		{Case: pktest.Case{Name: "removed: a new SYN on the old tuple selects again, no reset", In: syn.Bytes(), Verdict: pktest.TCActOK, Out: syn.WithDst(second).Bytes(), Setup: noReset, Check: noResetOK}},
		{Case: pktest.Case{Name: "and its segments go to the new backend", In: ack.Bytes(), Verdict: pktest.TCActOK, Out: ack.WithDst(second).Bytes(), Setup: noReset, Check: noResetOK}},
	})
}

// TestXDPHandsRemovedBackendFlowsToTC: the XDP program forwards a source-
// NATed flow while its backend is terminating, but once the backend is
// removed it passes the flow's next segment untouched rather than sending
// it to the dead pod, leaving the flow's entries for TC, which answers
// with the reset; the next connection on the tuple is XDP's again, to the
// live backend and on the freed source NAT port. IPv4 and IPv6.
func TestXDPHandsRemovedBackendFlowsToTC(t *testing.T) {
	eachFamily(t, testXDPHandsRemovedBackendFlowsToTC)
}

func testXDPHandsRemovedBackendFlowsToTC(t *testing.T, fam string) {
	x := newXFam(t, fam, loadOptions{})
	f := x.f
	xo := f.loadXDP(t, f.ifindex)
	next, clusterIP := netip.MustParseAddrPort("10.244.2.21:8080"), "10.96.0.10"
	if x.v6 {
		next, clusterIP = netip.MustParseAddrPort("[fd00:244:2::21]:8080"), "fd00:96::10"
	}
	const nodePort = 30020
	web := func(eps []netip.AddrPort, terminating ...netip.AddrPort) *model.State {
		s := service{name: "web", clusterIP: clusterIP, port: 80, proto: model.TCP, nodePort: nodePort}
		for _, ep := range eps {
			s.endpoints = append(s.endpoints, at(ep, otherNode))
		}
		for _, ep := range terminating {
			s.terminating = append(s.terminating, at(ep, otherNode))
		}
		return x.state(s)
	}
	fe := x.np(nodePort)
	payload := []byte("GET / HTTP/1.1\r\n\r\n")
	syn := x.tcp(x.client, fe, pktest.SYN).WithSeq(999, 0).fromOutside()
	seg := x.tcp(x.client, fe, pktest.ACK|pktest.PSH).WithSeq(1000, 5000).WithPayload(payload).fromOutside()
	toBackend := func(b xpkt, be netip.AddrPort) []byte {
		return b.WithSrc(x.snatSrc()).WithDst(be).forwarded().toNodeB().Bytes()
	}
	// The reset from the NodePort, <SEQ=SEG.ACK><CTL=RST>.
	var reset []byte
	if x.v6 {
		reset = pktest.TCP6(fe, x.client, pktest.RST).WithSeq(5000, 0).WithWindow(0).WithMACs(deviceMAC, clientMAC).Bytes()
	} else {
		reset = rst(fe, x.client, pktest.RST, 5000, 0).Bytes()
	}
	// entries checks that the flow's two entries are there, or gone.
	entries := func(want int) func(testing.TB, pktest.Result) {
		return func(tb testing.TB, _ pktest.Result) {
			tb.Helper()
			if n := x.flows(tb); n != want {
				tb.Errorf("%d flow entries, want %d", n, want)
			}
		}
	}
	both := func(checks ...func(testing.TB, pktest.Result)) func(testing.TB, pktest.Result) {
		return func(tb testing.TB, r pktest.Result) {
			for _, c := range checks {
				c(tb, r)
			}
		}
	}

	x.sync(t, web([]netip.AddrPort{x.remoteWeb}))
	f.runXDP(t, xo, []xrow{{Case: pktest.Case{
		Name: "the flow opened by XDP, source NAT to the pod on node-b", In: syn.Bytes(),
		Verdict: pktest.XDPTX, Out: toBackend(syn, x.remoteWeb), Check: entries(2),
	}}})

	fwd, fwdOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_FWD, 1)
	x.sync(t, web([]netip.AddrPort{next}, x.remoteWeb))
	f.runXDP(t, xo, []xrow{{Case: pktest.Case{
		Name: "backend terminating: XDP still forwards to it", In: seg.Bytes(),
		Verdict: pktest.XDPTX, Out: toBackend(seg, x.remoteWeb), Setup: fwd, Check: fwdOK,
	}}})

	noFwd, noFwdOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_FWD, 0)
	toTC, toTCOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_TO_TC, 1)
	noReset, noResetOK := f.counted(bpfobj.TcLbMetricLB_M_TC_RESET, 0)
	resetN, resetOK := f.counted(bpfobj.TcLbMetricLB_M_TC_RESET, 1)
	x.sync(t, web([]netip.AddrPort{next}))
	f.runXDP(t, xo, []xrow{
		{Case: pktest.Case{
			Name: "backend removed: XDP passes the segment untouched, entries kept for TC", In: seg.Bytes(),
			Verdict: pktest.XDPPass,
			Setup:   func(tb testing.TB) { noFwd(tb); toTC(tb); noReset(tb) },
			Check:   both(noFwdOK, toTCOK, noResetOK, entries(2)),
		}},
		{tc: true, Case: pktest.Case{
			Name: "TC answers it with a reset from the NodePort and ends the flow", In: seg.Bytes(),
			Verdict: pktest.TCActRedirect, Out: reset,
			SKBChecksum: pktest.SKBChecksumNone,
			Setup:       resetN, Check: both(resetOK, entries(0)),
		}},
		{Case: pktest.Case{
			Name: "a new connection on the tuple: XDP, to the live pod, on the freed port", In: syn.Bytes(),
			Verdict: pktest.XDPTX, Out: toBackend(syn, next), Check: entries(2),
		}},
	})
}

// open sends the first segment of a flow through ingress and checks that
// it was translated (a flow now tracked).
func (f *fixture) open(tb testing.TB, syn pktest.Builder) {
	tb.Helper()
	res, err := pktest.Exec(f.objs.TcIngress, pktest.Case{In: syn.Bytes(), Do: f.ns.Do, SKB: &pktest.SKBContext{Ifindex: f.ifindex}})
	if err != nil {
		tb.Fatal(err)
	}
	if res.Verdict != pktest.TCActOK && res.Verdict != pktest.TCActRedirect {
		tb.Fatalf("opening the flow: verdict %v, output:\n%s", res.Verdict, pktest.Decode(res.Out))
	}
	if f.flows(tb) == 0 {
		tb.Fatal("opening the flow tracked nothing")
	}
}

func backendOf(ap netip.AddrPort) maps.Backend {
	return maps.Backend{Addr: ap.Addr(), Port: ap.Port(), Proto: model.TCP}
}

// gopacketChecksums checks the IPv4 and TCP checksums of frame with
// gopacket, independently of pktest's decoder: re-serialized with computed
// checksums, the frame must come out byte for byte the same.
func gopacketChecksums(frame []byte) error {
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if eth == nil || ip == nil || tcp == nil {
		return fmt.Errorf("gopacket finds no Ethernet/IPv4/TCP frame: %v", pkt)
	}
	if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
		return err
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true},
		ip, tcp, gopacket.Payload(tcp.Payload)); err != nil {
		return fmt.Errorf("gopacket: %w", err)
	}
	if !bytes.Equal(buf.Bytes(), frame[len(eth.Contents):]) {
		return fmt.Errorf("checksums differ from gopacket's: IPv4 %#04x, TCP %#04x in the frame; gopacket computes\n% x\nfor\n% x",
			ip.Checksum, tcp.Checksum, buf.Bytes(), frame[len(eth.Contents):])
	}
	return nil
}

// TestATrackedFlowSeesARemovedBackendAtOnce: a tracked source-NATed flow's
// packets are checked in full (np_orig_valid, np_backend_gone) once a
// second and skip the checks for the rest of it (np_orig_fresh), except in
// a second in which the Writer removed a backend (lb_removed_at_v1): the
// flow's next segment after its backend's removal is reset, also when the
// flow was checked earlier in the same second.
func TestATrackedFlowSeesARemovedBackendAtOnce(t *testing.T) {
	f := newFixture(t, loadOptions{})
	remote := netip.MustParseAddrPort("10.244.2.20:8080")
	next := netip.MustParseAddrPort("10.244.2.21:8080")
	web := func(eps ...netip.AddrPort) *model.State {
		var names []string
		for _, ep := range eps {
			names = append(names, at(ep, otherNode))
		}
		return state(service{name: "web", clusterIP: "10.96.0.10", port: 80, proto: model.TCP, nodePort: npWebLocal, endpoints: names})
	}
	fe := np(npWebLocal)
	seg := fromOutside(pktest.TCP(client, fe, pktest.ACK).WithSeq(1000).WithAck(5000))
	f.sync(t, web(remote))
	f.open(t, fromOutside(pktest.TCP(client, fe, pktest.SYN)))
	// Another endpoint joins: nothing is removed, the flow stays.
	f.sync(t, web(remote, next))

	fwd, fwdOK := f.counted(bpfobj.TcLbMetricLB_M_TC_FWD, 1)
	f.checkedNow(t)
	f.run(t, []row{{Case: pktest.Case{
		Name: "a segment of the flow, checked in this second: to its backend", In: seg.Bytes(),
		Verdict: pktest.TCActRedirect,
		Out:     toNodeB(pktest.TCP(snatSrc, remote, pktest.ACK).WithSeq(1000).WithAck(5000).WithTTL(63)).Bytes(),
		Setup:   fwd, Check: fwdOK,
	}}})
	// Checked in this second, and then, within it, the backend removed.
	f.checkedNow(t)
	f.sync(t, web(next))
	reset, resetOK := f.counted(bpfobj.TcLbMetricLB_M_TC_RESET, 1)
	f.run(t, []row{{Case: pktest.Case{
		Name: "its backend removed in the same second: the next segment is reset", In: seg.Bytes(),
		Verdict: pktest.TCActRedirect, Out: rst(fe, client, pktest.RST, 5000, 0).Bytes(),
		Setup: reset, Check: resetOK,
	}}})
}

// checkedNow makes every tracked flow's next hop, and with it the full
// check of its entry (np_orig_fresh), as of the current second, with at
// least half of the second left for the test's next packets.
func (f *fixture) checkedNow(tb testing.TB) {
	tb.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		tb.Fatal(err)
	}
	if ts.Nsec > 500_000_000 {
		time.Sleep(time.Duration(1_000_000_000-ts.Nsec) + time.Millisecond)
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
			tb.Fatal(err)
		}
	}
	updateCT(tb, f.objs.Tc4CtV1, func(_ *bpfobj.TcCt4Key, v *bpfobj.TcCt4Entry) bool {
		v.FibAt = uint16(ts.Sec)
		return true
	})
}
