package tcpkt_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// TestXDPFlows: the XDP program translates flows to backends on other nodes
// as tc_ingress does, and sends them back out of the device (XDP_TX), for
// IPv4 and IPv6.
func TestXDPFlows(t *testing.T) {
	eachFamily(t, testXDPFlows)
}

func testXDPFlows(t *testing.T, fam string) {
	x := newXFam(t, fam, loadOptions{})
	f := x.f
	xo := f.loadXDP(t, f.ifindex)
	x.sync(t, x.fixtureState())

	snatSrc := x.snatSrc()
	synRemote := x.tcp(x.client, x.np(npWebRemote), pktest.SYN).fromOutside()
	dnsQuery := x.udp(x.client, x.np(npDNSRemote)).WithPayload([]byte("query")).fromOutside()
	dnsAnswer := x.udp(x.remoteDNS, snatSrc).WithPayload([]byte("answer")).fromNodeB()
	answered := x.udp(x.np(npDNSRemote), x.client).WithPayload([]byte("answer")).forwarded().toRouter()
	newSNAT, newSNATOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_NEW_SNAT, 1)
	reply, replyOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_REPLY, 1)
	fwd, fwdOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_FWD, 1)
	noPort, noPortOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_NO_PORT, 1)

	rows := []xrow{
		{Case: pktest.Case{
			Name: "NodePort, remote backend: DNAT and SNAT to the node, back out to node-b", In: synRemote.Bytes(),
			Verdict: pktest.XDPTX, Out: synRemote.WithSrc(snatSrc).WithDst(x.remoteWeb).forwarded().toNodeB().Bytes(),
			Setup: newSNAT, Check: newSNATOK,
		}},
		{Case: pktest.Case{
			Name:    "remote backend's reply: back to the client from the NodePort",
			In:      x.tcp(x.remoteWeb, snatSrc, pktest.SYN|pktest.ACK).fromNodeB().Bytes(),
			Verdict: pktest.XDPTX, Out: x.tcp(x.np(npWebRemote), x.client, pktest.SYN|pktest.ACK).forwarded().toRouter().Bytes(),
			Setup: reply, Check: replyOK,
		}},
		{Case: pktest.Case{
			Name:    "tracked flow with payload: same backend and source port",
			In:      x.tcp(x.client, x.np(npWebRemote), pktest.ACK).WithPayload([]byte("GET / HTTP/1.1\r\n\r\n")).fromOutside().Bytes(),
			Verdict: pktest.XDPTX, Out: x.tcp(snatSrc, x.remoteWeb, pktest.ACK).WithPayload([]byte("GET / HTTP/1.1\r\n\r\n")).forwarded().toNodeB().Bytes(),
			Setup: fwd, Check: fwdOK,
		}},
		{Case: pktest.Case{
			Name:    "another client while the only source NAT port is taken: dropped and counted",
			In:      x.tcp(x.client2, x.np(npWebRemote), pktest.SYN).fromOutside().Bytes(),
			Verdict: pktest.XDPDrop, Setup: noPort, Check: noPortOK,
		}},
		{Case: pktest.Case{
			Name: "UDP NodePort, remote backend: DNAT and SNAT", In: dnsQuery.Bytes(),
			Verdict: pktest.XDPTX, Out: dnsQuery.WithSrc(snatSrc).WithDst(x.remoteDNS).forwarded().toNodeB().Bytes(),
		}},
		{Case: pktest.Case{
			Name: "UDP reply: back to the client", In: dnsAnswer.Bytes(),
			Verdict: pktest.XDPTX, Out: answered.Bytes(),
		}},
	}
	if !x.v6 {
		rows = append(rows,
			xrow{Case: pktest.Case{
				Name:    "UDP without checksum: translated and still without checksum",
				In:      dnsQuery.WithL4Checksum(0).Bytes(),
				Verdict: pktest.XDPTX, Out: dnsQuery.WithSrc(snatSrc).WithDst(x.remoteDNS).forwarded().WithL4Checksum(0).toNodeB().Bytes(),
			}},
			xrow{Case: pktest.Case{
				Name:    "UDP reply without checksum: still without checksum",
				In:      dnsAnswer.WithL4Checksum(0).Bytes(),
				Verdict: pktest.XDPTX, Out: answered.WithL4Checksum(0).Bytes(),
			}},
		)
	} else {
		zero := zeroSumPayload(dnsQuery.b6, snatSrc, x.remoteDNS)
		toTC, toTCOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_TO_TC, 0)
		rows = append(rows,
			xrow{Case: pktest.Case{
				Name:    "UDP without checksum, which IPv6 forbids: passed untouched, for the receiver to drop",
				In:      dnsQuery.WithL4Checksum(0).Bytes(),
				Verdict: pktest.XDPPass, BadChecksums: true, Setup: toTC, Check: toTCOK,
			}},
			xrow{Case: pktest.Case{
				Name:    "UDP reply without checksum: passed untouched",
				In:      dnsAnswer.WithL4Checksum(0).Bytes(),
				Verdict: pktest.XDPPass, BadChecksums: true,
			}},
			xrow{Case: pktest.Case{
				Name:    "UDP whose translated checksum sums to zero: sent as all ones",
				In:      dnsQuery.WithPayload(zero).Bytes(),
				Verdict: pktest.XDPTX,
				Out:     dnsQuery.WithPayload(zero).WithSrc(snatSrc).WithDst(x.remoteDNS).forwarded().WithL4Checksum(0xffff).toNodeB().Bytes(),
			}},
		)
	}
	f.runXDP(t, xo, rows)

	// Each of these needs the single source NAT port: a fresh fixture.
	g := newXFam(t, fam, loadOptions{})
	gx := g.f.loadXDP(t, g.f.ifindex)
	g.sync(t, g.fixtureState())
	g.f.runXDP(t, gx, []xrow{
		{Case: pktest.Case{
			Name:    "ExternalIP, remote backend: DNAT and SNAT",
			In:      g.tcp(g.client, g.externalIP, pktest.SYN).fromOutside().Bytes(),
			Verdict: pktest.XDPTX, Out: g.tcp(snatSrc, g.extRemote, pktest.SYN).forwarded().toNodeB().Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "ExternalIP reply: source becomes the ExternalIP",
			In:      g.tcp(g.extRemote, snatSrc, pktest.SYN|pktest.ACK).fromNodeB().Bytes(),
			Verdict: pktest.XDPTX, Out: g.tcp(g.externalIP, g.client, pktest.SYN|pktest.ACK).forwarded().toRouter().Bytes(),
		}},
	})
}

// TestXDPLoadBalancerIP: a LoadBalancer IP with a remote backend, its
// source ranges checked as by TC.
func TestXDPLoadBalancerIP(t *testing.T) {
	eachFamily(t, func(t *testing.T, fam string) {
		x := newXFam(t, fam, loadOptions{})
		f := x.f
		xo := f.loadXDP(t, f.ifindex)
		ranged, clusterIP, inRange := netip.MustParseAddrPort("198.19.0.30:80"), "10.96.0.30", "198.18.0.10/32"
		if x.v6 {
			ranged, clusterIP, inRange = netip.MustParseAddrPort("[fd00:19::30]:80"), "fd00:96::30", "2001:db8:18::10/128"
		}
		x.sync(t, x.state(service{
			name: "ranged", clusterIP: clusterIP, port: 80, proto: model.TCP, nodePort: 30018,
			lbIPs: []string{ranged.Addr().String()}, ranges: []string{inRange},
			endpoints: []string{at(x.remoteWeb, otherNode)},
		}))
		blocked, blockedOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SOURCE_RANGE, 1)
		inside := x.tcp(x.client, ranged, pktest.SYN).fromOutside()
		f.runXDP(t, xo, []xrow{
			{Case: pktest.Case{
				Name: "client inside the ranges: DNAT and SNAT", In: inside.Bytes(),
				Verdict: pktest.XDPTX, Out: inside.WithSrc(x.snatSrc()).WithDst(x.remoteWeb).forwarded().toNodeB().Bytes(),
			}},
			{Case: pktest.Case{
				Name: "client outside the ranges: dropped and counted", In: x.tcp(x.client2, ranged, pktest.SYN).fromOutside().Bytes(),
				Verdict: pktest.XDPDrop, Setup: blocked, Check: blockedOK,
			}},
		})
	})
}

// TestXDPPassesTheRest: everything the XDP program does not forward itself
// goes to TC untouched, and leaves no flow behind; drops are the TC
// program's drops.
func TestXDPPassesTheRest(t *testing.T) {
	eachFamily(t, testXDPPassesTheRest)
}

func testXDPPassesTheRest(t *testing.T, fam string) {
	x := newXFam(t, fam, loadOptions{})
	f := x.f
	xo := f.loadXDP(t, f.ifindex)
	st := x.fixtureState()
	if !x.v6 {
		st = withLocalhostNodePorts(st)
	}
	x.sync(t, st)

	synRemote := x.tcp(x.client, x.np(npWebRemote), pktest.SYN).fromOutside()
	bigUDP := x.udp(x.client, x.np(npDNSRemote)).WithPayload(make([]byte, 64)).fromOutside()
	ipLen := uint32(20)
	if x.v6 {
		ipLen = 40
	}
	drop, dropOK := f.counted(bpfobj.TcLbMetricLB_M_DROP, 1)
	multi, multiOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_MULTIBUF, 1)
	pass := func(name string, in []byte) xrow {
		return xrow{Case: pktest.Case{Name: name, In: in, Verdict: pktest.XDPPass}}
	}
	rows := []xrow{
		pass("NodePort, local backend: for TC", x.tcp(x.client, x.np(npWebLocal), pktest.SYN).fromOutside().Bytes()),
		pass("externalTrafficPolicy=Local: for TC", x.tcp(x.client, x.np(npETPLocal), pktest.SYN).fromOutside().Bytes()),
		{Case: pktest.Case{
			Name: "externalTrafficPolicy=Local without a local endpoint: dropped", In: x.tcp(x.client, x.np(npElsewhere), pktest.SYN).fromOutside().Bytes(),
			Verdict: pktest.XDPDrop, Setup: drop, Check: dropOK,
		}},
		pass("no endpoints: for TC's ICMP unreachable", x.tcp(x.client, x.np(npNoEPs), pktest.SYN).fromOutside().Bytes()),
		pass("no endpoints, UDP: for TC's ICMP unreachable", x.udp(x.client, x.np(npNoEPs)).fromOutside().Bytes()),
		pass("TCP to a node port without a Service", x.tcp(x.client, x.np(22), pktest.SYN).fromOutside().Bytes()),
		pass("TCP to a ClusterIP from outside", x.tcp(x.client, x.clusterIP, pktest.SYN).fromOutside().Bytes()),
		pass("reply to a source NAT port nobody has", x.tcp(x.remoteWeb, x.snatSrc(), pktest.ACK).fromNodeB().Bytes()),
		pass("ARP request", pktest.ARPRequest(clientMAC, routerAddr, nodeAddr)),
		{Case: pktest.Case{
			Name: "multi-buffer frame, headers linear: for TC, counted", In: bigUDP.Bytes(), Verdict: pktest.XDPPass,
			XDP: &pktest.XDPContext{LinearLen: 14 + ipLen + 8}, Setup: multi, Check: multiOK,
		}},
		{Case: pktest.Case{Name: "multi-buffer frame, IP header split", In: bigUDP.Bytes(), Verdict: pktest.XDPPass, XDP: &pktest.XDPContext{LinearLen: 20}}},
	}
	if !x.v6 {
		frags := bigUDP.b4.MustFragments(32)
		syn := synRemote.b4
		rows = append(rows,
			pass("localhost NodePort from outside: not ours (CVE-2020-8558)", fromOutside(pktest.TCP(client, localhostNP(npWebRemote), pktest.SYN)).Bytes()),
			pass("LoadBalancer IP, local backend: for TC", fromOutside(pktest.TCP(client, lbIP, pktest.SYN)).Bytes()),
			pass("ICMP echo to the node", fromOutside(pktest.ICMPEcho(client.Addr(), nodeAddr, 1, 1)).Bytes()),
			pass("IPv6 UDP", pktest.IPv6UDP(netip.MustParseAddrPort("[2001:db8::1]:40000"), netip.MustParseAddrPort("[2001:db8::2]:30012"), []byte("x"))),
			pass("first fragment to a remote NodePort", frags[0]),
			pass("second fragment to a remote NodePort", frags[1]),
			pass("IP options, remote backend: for TC", syn.WithIPOptions(pktest.IPOptNOP(), pktest.IPOptRecordRoute(2)).Bytes()),
			xrow{Case: pktest.Case{Name: "header length below 5 words", In: syn.WithIHL(4).Bytes(), Verdict: pktest.XDPPass, BadChecksums: true}},
			xrow{Case: pktest.Case{Name: "IP version 6 in an IPv4 frame", In: syn.WithVersion(6).Bytes(), Verdict: pktest.XDPPass, BadChecksums: true}},
			xrow{Case: pktest.Case{Name: "total length beyond the frame", In: syn.WithTotalLength(200).Bytes(), Verdict: pktest.XDPPass, BadChecksums: true}},
		)
	} else {
		// The IPv6 header's fields, patched in a copy of the frame.
		patched := func(in []byte, off int, b ...byte) []byte {
			out := slices.Clone(in)
			copy(out[14+off:], b)
			return out
		}
		syn := synRemote.Bytes()
		rows = append(rows,
			pass("neighbour solicitation for the node", pktest.IPv6NeighborSolicit(clientMAC, client6.Addr(), node6)),
			pass("hop-by-hop options header, remote NodePort: for TC", pktest.IPv6WithExtHeader(clientMAC, deviceMAC, client6, np6(npDNSRemote), []byte("query"))),
			xrow{Case: pktest.Case{
				Name: "first fragment to a remote NodePort", In: pktest.IPv6Fragment(clientMAC, deviceMAC, client6, np6(npDNSRemote), []byte("query")),
				Verdict: pktest.XDPPass, BadChecksums: true,
			}},
			xrow{Case: pktest.Case{
				Name: "UDP without checksum to a remote NodePort", In: x.udp(x.client, x.np(npDNSRemote)).WithPayload([]byte("q")).WithL4Checksum(0).fromOutside().Bytes(),
				Verdict: pktest.XDPPass, BadChecksums: true,
			}},
			pass("IPv4 UDP", fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload([]byte("x"))).Bytes()),
			pass("IP version 4 in an IPv6 frame", patched(syn, 0, 0x40|syn[14]&0x0f)),
			pass("payload length beyond the frame", patched(syn, 4, 0, 200)),
			pass("payload length 0 (a jumbogram's)", patched(syn, 4, 0, 0)),
		)
	}
	for _, c := range pktest.Cuts(synRemote.Bytes()) {
		rows = append(rows, xrow{Case: pktest.Case{Name: c.Name(), In: c.Frame, Verdict: pktest.XDPPass, BadChecksums: true}})
	}
	f.runXDP(t, xo, rows)
	if n := x.flows(t); n != 0 {
		t.Errorf("%d flows tracked, want none", n)
	}
}

// TestXDPAndTCShareFlows: a flow XDP began continues through tc_ingress
// with the same translation (XDP detached, or a packet it passed), and one
// TC began continues through XDP.
func TestXDPAndTCShareFlows(t *testing.T) {
	eachFamily(t, testXDPAndTCShareFlows)
}

func testXDPAndTCShareFlows(t *testing.T, fam string) {
	x := newXFam(t, fam, loadOptions{})
	xo := x.f.loadXDP(t, x.f.ifindex)
	x.sync(t, x.fixtureState())
	snatSrc := x.snatSrc()

	ack := func(x *xfam, fe netip.AddrPort) xpkt {
		return x.tcp(x.client, fe, pktest.ACK).WithPayload([]byte("x")).fromOutside()
	}
	fwd, fwdOK := x.f.counted(bpfobj.TcLbMetricLB_M_TC_FWD, 1)
	x.f.runXDP(t, xo, []xrow{
		{Case: pktest.Case{
			Name: "XDP begins a flow", In: x.tcp(x.client, x.np(npWebRemote), pktest.SYN).fromOutside().Bytes(),
			Verdict: pktest.XDPTX, Out: x.tcp(snatSrc, x.remoteWeb, pktest.SYN).forwarded().toNodeB().Bytes(),
		}},
		{tc: true, Case: pktest.Case{
			Name: "TC translates its next packet alike", In: ack(x, x.np(npWebRemote)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: x.tcp(snatSrc, x.remoteWeb, pktest.ACK).WithPayload([]byte("x")).forwarded().toNodeB().Bytes(),
			Setup: fwd, Check: fwdOK,
		}},
		{tc: true, Case: pktest.Case{
			Name:    "TC translates its reply alike",
			In:      x.tcp(x.remoteWeb, snatSrc, pktest.SYN|pktest.ACK).fromNodeB().Bytes(),
			Verdict: pktest.TCActRedirect, Out: x.tcp(x.np(npWebRemote), x.client, pktest.SYN|pktest.ACK).forwarded().toRouter().Bytes(),
		}},
	})
	g := newXFam(t, fam, loadOptions{})
	gx := g.f.loadXDP(t, g.f.ifindex)
	g.sync(t, g.fixtureState())
	xfwd, xfwdOK := g.f.counted(bpfobj.TcLbMetricLB_M_XDP_FWD, 1)
	g.f.runXDP(t, gx, []xrow{
		{tc: true, Case: pktest.Case{
			Name: "TC begins a flow", In: g.udp(g.client, g.np(npDNSRemote)).WithPayload([]byte("q")).fromOutside().Bytes(),
			Verdict: pktest.TCActRedirect, Out: g.udp(snatSrc, g.remoteDNS).WithPayload([]byte("q")).forwarded().toNodeB().Bytes(),
		}},
		{Case: pktest.Case{
			Name: "XDP translates its next datagram alike", In: g.udp(g.client, g.np(npDNSRemote)).WithPayload([]byte("q2")).fromOutside().Bytes(),
			Verdict: pktest.XDPTX, Out: g.udp(snatSrc, g.remoteDNS).WithPayload([]byte("q2")).forwarded().toNodeB().Bytes(),
			Setup: xfwd, Check: xfwdOK,
		}},
		{Case: pktest.Case{
			Name:    "XDP translates its reply alike",
			In:      g.udp(g.remoteDNS, snatSrc).WithPayload([]byte("a")).fromNodeB().Bytes(),
			Verdict: pktest.XDPTX, Out: g.udp(g.np(npDNSRemote), g.client).WithPayload([]byte("a")).forwarded().toRouter().Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "a flow TC began to a local backend stays with TC",
			In:      g.tcp(g.client, g.np(npWebLocal), pktest.SYN).fromOutside().Bytes(),
			Verdict: pktest.XDPPass,
		}},
		{tc: true, Case: pktest.Case{
			Name: "TC: the local flow", In: g.tcp(g.client, g.np(npWebLocal), pktest.SYN).fromOutside().Bytes(),
			Verdict: pktest.TCActOK, Out: g.tcp(g.client, g.localWeb, pktest.SYN).fromOutside().Bytes(),
		}},
		{Case: pktest.Case{
			Name: "XDP: the local flow's next packet is TC's", In: ack(g, g.np(npWebLocal)).Bytes(), Verdict: pktest.XDPPass,
		}},
	})
}

// TestXDPNextHops: a next hop out of another device with the XDP program is
// a redirect, with that device's address for source NAT; one out of a
// device without it, or without a neighbour entry yet, is passed to TC,
// which carries on the flow XDP recorded.
func TestXDPNextHops(t *testing.T) {
	eachFamily(t, testXDPNextHops)
}

func testXDPNextHops(t *testing.T, fam string) {
	// node-c's and node-d's pods and the ClusterIPs of their Services.
	nodeCWeb, nodeDWeb := netip.MustParseAddrPort("10.244.3.10:8080"), netip.MustParseAddrPort("10.244.4.10:8080")
	clusterC, clusterD, snatC := "10.96.0.50", "10.96.0.51", nodeCSNAT
	if fam == "IPv6" {
		nodeCWeb, nodeDWeb = netip.MustParseAddrPort("[fd00:244:3::10]:8080"), netip.MustParseAddrPort("[fd00:244:4::10]:8080")
		clusterC, clusterD, snatC = "fd00:96::50", "fd00:96::51", nodeCSNAT6
	}
	for _, tc := range []struct {
		name     string
		withN1   bool
		verdict  pktest.Verdict
		toTCWant uint64
	}{
		{name: "n1 has the XDP program", withN1: true, verdict: pktest.XDPRedirect},
		{name: "n1 has no XDP program", withN1: false, verdict: pktest.XDPPass, toTCWant: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newXFam(t, fam, loadOptions{})
			f := x.f
			n1 := x.addSecondUplink(t)
			devs := []uint32{f.ifindex}
			if tc.withN1 {
				devs = append(devs, n1)
			}
			xo := f.loadXDP(t, devs...)
			x.sync(t, x.state(service{name: "web-c", clusterIP: clusterC, port: 80, proto: model.TCP, nodePort: 30050, endpoints: []string{at(nodeCWeb, "node-c")}}))
			syn := x.tcp(x.client, x.np(30050), pktest.SYN).fromOutside()
			toC := x.tcp(snatC, nodeCWeb, pktest.SYN).forwarded().WithMACs(secondMAC, nodeCMAC)
			out := toC.Bytes()
			if tc.verdict == pktest.XDPPass {
				out = nil
			}
			toTC, toTCOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_TO_TC, tc.toTCWant)
			rows := []xrow{{Case: pktest.Case{Name: "SYN to node-c's pod", In: syn.Bytes(), Verdict: tc.verdict, Out: out, Setup: toTC, Check: toTCOK}}}
			if tc.verdict == pktest.XDPPass {
				rows = append(rows, xrow{tc: true, Case: pktest.Case{Name: "TC sends the recorded flow", In: syn.Bytes(), Verdict: pktest.TCActRedirect, Out: toC.Bytes()}})
			}
			f.runXDP(t, xo, rows)
		})
	}
	t.Run("no neighbour entry", func(t *testing.T) {
		x := newXFam(t, fam, loadOptions{})
		f := x.f
		x.addSecondUplink(t)
		xo := f.loadXDP(t, f.ifindex)
		x.sync(t, x.state(service{name: "web-d", clusterIP: clusterD, port: 80, proto: model.TCP, nodePort: 30051, endpoints: []string{at(nodeDWeb, "node-d")}}))
		syn := x.tcp(x.client, x.np(30051), pktest.SYN).fromOutside()
		toTC, toTCOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_TO_TC, 1)
		f.runXDP(t, xo, []xrow{
			{Case: pktest.Case{Name: "XDP records the flow and passes it", In: syn.Bytes(), Verdict: pktest.XDPPass, Setup: toTC, Check: toTCOK}},
			// bpf_redirect_neigh resolves the MAC addresses after the
			// program, so they are still the input's.
			{tc: true, Case: pktest.Case{
				Name: "TC translates it and has the kernel resolve the neighbour", In: syn.Bytes(),
				Verdict: pktest.TCActRedirect, Out: syn.WithSrc(x.snatSrc()).WithDst(nodeDWeb).forwarded().Bytes(),
			}},
		})
	})
}
