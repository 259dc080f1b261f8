package tcpkt_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/pktest"
)

// TestXDPFlows: the XDP program translates flows to backends on other nodes
// as tc_ingress does, and sends them back out of the device (XDP_TX).
func TestXDPFlows(t *testing.T) {
	f := newFixture(t, loadOptions{})
	x := f.loadXDP(t, f.ifindex)
	f.sync(t, fixtureState())

	synRemote := fromOutside(pktest.TCP(client, np(npWebRemote), pktest.SYN))
	dnsQuery := fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload([]byte("query")))
	dnsAnswer := fromNodeB(pktest.UDP(remoteDNS, snatSrc).WithPayload([]byte("answer")))
	newSNAT, newSNATOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_NEW_SNAT, 1)
	reply, replyOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_REPLY, 1)
	fwd, fwdOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_FWD, 1)
	noPort, noPortOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_NO_PORT, 1)

	f.runXDP(t, x, []xrow{
		{Case: pktest.Case{
			Name: "NodePort, remote backend: DNAT and SNAT to the node, back out to node-b", In: synRemote.Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(synRemote.WithSrc(snatSrc).WithDst(remoteWeb).WithTTL(63)).Bytes(),
			Setup: newSNAT, Check: newSNATOK,
		}},
		{Case: pktest.Case{
			Name:    "remote backend's reply: back to the client from the NodePort",
			In:      fromNodeB(pktest.TCP(remoteWeb, snatSrc, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.XDPTX, Out: toRouter(pktest.TCP(np(npWebRemote), client, pktest.SYN|pktest.ACK).WithTTL(63)).Bytes(),
			Setup: reply, Check: replyOK,
		}},
		{Case: pktest.Case{
			Name:    "tracked flow with payload: same backend and source port",
			In:      fromOutside(pktest.TCP(client, np(npWebRemote), pktest.ACK).WithPayload([]byte("GET / HTTP/1.1\r\n\r\n"))).Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(pktest.TCP(snatSrc, remoteWeb, pktest.ACK).WithPayload([]byte("GET / HTTP/1.1\r\n\r\n")).WithTTL(63)).Bytes(),
			Setup: fwd, Check: fwdOK,
		}},
		{Case: pktest.Case{
			Name:    "another client while the only source NAT port is taken: dropped and counted",
			In:      fromOutside(pktest.TCP(client2, np(npWebRemote), pktest.SYN)).Bytes(),
			Verdict: pktest.XDPDrop, Setup: noPort, Check: noPortOK,
		}},
		{Case: pktest.Case{
			Name: "UDP NodePort, remote backend: DNAT and SNAT", In: dnsQuery.Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(dnsQuery.WithSrc(snatSrc).WithDst(remoteDNS).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name: "UDP reply: back to the client", In: dnsAnswer.Bytes(),
			Verdict: pktest.XDPTX, Out: toRouter(pktest.UDP(np(npDNSRemote), client).WithPayload([]byte("answer")).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "UDP without checksum: translated and still without checksum",
			In:      dnsQuery.WithL4Checksum(0).Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(dnsQuery.WithSrc(snatSrc).WithDst(remoteDNS).WithTTL(63).WithL4Checksum(0)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "UDP reply without checksum: still without checksum",
			In:      dnsAnswer.WithL4Checksum(0).Bytes(),
			Verdict: pktest.XDPTX, Out: toRouter(pktest.UDP(np(npDNSRemote), client).WithPayload([]byte("answer")).WithTTL(63).WithL4Checksum(0)).Bytes(),
		}},
	})
	// Each of these needs the single source NAT port: a fresh fixture.
	g := newFixture(t, loadOptions{})
	gx := g.loadXDP(t, g.ifindex)
	g.sync(t, fixtureState())
	g.runXDP(t, gx, []xrow{
		{Case: pktest.Case{
			Name:    "ExternalIP, remote backend: DNAT and SNAT",
			In:      fromOutside(pktest.TCP(client, externalIP, pktest.SYN)).Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(pktest.TCP(snatSrc, extRemote, pktest.SYN).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "ExternalIP reply: source becomes the ExternalIP",
			In:      fromNodeB(pktest.TCP(extRemote, snatSrc, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.XDPTX, Out: toRouter(pktest.TCP(externalIP, client, pktest.SYN|pktest.ACK).WithTTL(63)).Bytes(),
		}},
	})
}

// TestXDPLoadBalancerIP: a LoadBalancer IP with a remote backend, its
// source ranges checked as by TC.
func TestXDPLoadBalancerIP(t *testing.T) {
	f := newFixture(t, loadOptions{})
	x := f.loadXDP(t, f.ifindex)
	ranged := netip.MustParseAddrPort("198.19.0.30:80")
	f.sync(t, state(service{
		name: "ranged", clusterIP: "10.96.0.30", port: 80, proto: model.TCP, nodePort: 30018,
		lbIPs: []string{ranged.Addr().String()}, ranges: []string{"198.18.0.10/32"},
		endpoints: []string{at(remoteWeb, otherNode)},
	}))
	blocked, blockedOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SOURCE_RANGE, 1)
	inside := fromOutside(pktest.TCP(client, ranged, pktest.SYN))
	f.runXDP(t, x, []xrow{
		{Case: pktest.Case{
			Name: "client inside the ranges: DNAT and SNAT", In: inside.Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(inside.WithSrc(snatSrc).WithDst(remoteWeb).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name: "client outside the ranges: dropped and counted", In: fromOutside(pktest.TCP(client2, ranged, pktest.SYN)).Bytes(),
			Verdict: pktest.XDPDrop, Setup: blocked, Check: blockedOK,
		}},
	})
}

// TestXDPPassesTheRest: everything the XDP program does not forward itself
// goes to TC untouched, and leaves no flow behind; drops are the TC
// program's drops.
func TestXDPPassesTheRest(t *testing.T) {
	f := newFixture(t, loadOptions{})
	x := f.loadXDP(t, f.ifindex)
	f.sync(t, fixtureState())

	synLocal := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN))
	synRemote := fromOutside(pktest.TCP(client, np(npWebRemote), pktest.SYN))
	bigUDP := fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload(make([]byte, 64)))
	frags := bigUDP.MustFragments(32)
	drop, dropOK := f.counted(bpfobj.TcLbMetricLB_M_DROP, 1)
	multi, multiOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_MULTIBUF, 1)
	rows := []xrow{
		{Case: pktest.Case{Name: "NodePort, local backend: for TC", In: synLocal.Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "LoadBalancer IP, local backend: for TC", In: fromOutside(pktest.TCP(client, lbIP, pktest.SYN)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "externalTrafficPolicy=Local: for TC", In: fromOutside(pktest.TCP(client, np(npETPLocal), pktest.SYN)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{
			Name: "externalTrafficPolicy=Local without a local endpoint: dropped", In: fromOutside(pktest.TCP(client, np(npElsewhere), pktest.SYN)).Bytes(),
			Verdict: pktest.XDPDrop, Setup: drop, Check: dropOK,
		}},
		{Case: pktest.Case{Name: "no endpoints: for TC's ICMP unreachable", In: fromOutside(pktest.TCP(client, np(npNoEPs), pktest.SYN)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "no endpoints, UDP: for TC's ICMP unreachable", In: fromOutside(pktest.UDP(client, np(npNoEPs))).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "TCP to a node port without a Service", In: fromOutside(pktest.TCP(client, np(22), pktest.SYN)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "TCP to a ClusterIP from outside", In: fromOutside(pktest.TCP(client, netip.MustParseAddrPort("10.96.0.11:80"), pktest.SYN)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "reply to a source NAT port nobody has", In: fromNodeB(pktest.TCP(remoteWeb, snatSrc, pktest.ACK)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "ICMP echo to the node", In: fromOutside(pktest.ICMPEcho(client.Addr(), nodeAddr, 1, 1)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "ARP request", In: pktest.ARPRequest(clientMAC, routerAddr, nodeAddr), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "IPv6 UDP", In: pktest.IPv6UDP(netip.MustParseAddrPort("[2001:db8::1]:40000"), netip.MustParseAddrPort("[2001:db8::2]:30012"), []byte("x")), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "first fragment to a remote NodePort", In: frags[0], Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "second fragment to a remote NodePort", In: frags[1], Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "IP options, remote backend: for TC", In: synRemote.WithIPOptions(pktest.IPOptNOP(), pktest.IPOptRecordRoute(2)).Bytes(), Verdict: pktest.XDPPass}},
		{Case: pktest.Case{Name: "header length below 5 words", In: synRemote.WithIHL(4).Bytes(), Verdict: pktest.XDPPass, BadChecksums: true}},
		{Case: pktest.Case{Name: "IP version 6 in an IPv4 frame", In: synRemote.WithVersion(6).Bytes(), Verdict: pktest.XDPPass, BadChecksums: true}},
		{Case: pktest.Case{Name: "total length beyond the frame", In: synRemote.WithTotalLength(200).Bytes(), Verdict: pktest.XDPPass, BadChecksums: true}},
		{Case: pktest.Case{
			Name: "multi-buffer frame, headers linear: for TC, counted", In: bigUDP.Bytes(), Verdict: pktest.XDPPass,
			XDP: &pktest.XDPContext{LinearLen: 14 + 20 + 8}, Setup: multi, Check: multiOK,
		}},
		{Case: pktest.Case{Name: "multi-buffer frame, IP header split", In: bigUDP.Bytes(), Verdict: pktest.XDPPass, XDP: &pktest.XDPContext{LinearLen: 20}}},
	}
	for _, c := range pktest.Cuts(synRemote.Bytes()) {
		rows = append(rows, xrow{Case: pktest.Case{Name: c.Name(), In: c.Frame, Verdict: pktest.XDPPass, BadChecksums: true}})
	}
	f.runXDP(t, x, rows)
	if n := f.flows(t); n != 0 {
		t.Errorf("%d flows tracked, want none", n)
	}
}

// TestXDPAndTCShareFlows: a flow XDP began continues through tc_ingress
// with the same translation (XDP detached, or a packet it passed), and one
// TC began continues through XDP.
func TestXDPAndTCShareFlows(t *testing.T) {
	f := newFixture(t, loadOptions{})
	x := f.loadXDP(t, f.ifindex)
	f.sync(t, fixtureState())

	ack := func(src netip.AddrPort, fe netip.AddrPort) pktest.Builder {
		return fromOutside(pktest.TCP(src, fe, pktest.ACK).WithPayload([]byte("x")))
	}
	fwd, fwdOK := f.counted(bpfobj.TcLbMetricLB_M_TC_FWD, 1)
	f.runXDP(t, x, []xrow{
		{Case: pktest.Case{
			Name: "XDP begins a flow", In: fromOutside(pktest.TCP(client, np(npWebRemote), pktest.SYN)).Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(pktest.TCP(snatSrc, remoteWeb, pktest.SYN).WithTTL(63)).Bytes(),
		}},
		{tc: true, Case: pktest.Case{
			Name: "TC translates its next packet alike", In: ack(client, np(npWebRemote)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(pktest.TCP(snatSrc, remoteWeb, pktest.ACK).WithPayload([]byte("x")).WithTTL(63)).Bytes(),
			Setup: fwd, Check: fwdOK,
		}},
		{tc: true, Case: pktest.Case{
			Name:    "TC translates its reply alike",
			In:      fromNodeB(pktest.TCP(remoteWeb, snatSrc, pktest.ACK)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toRouter(pktest.TCP(np(npWebRemote), client, pktest.ACK).WithTTL(63)).Bytes(),
		}},
	})
	g := newFixture(t, loadOptions{})
	gx := g.loadXDP(t, g.ifindex)
	g.sync(t, fixtureState())
	xfwd, xfwdOK := g.counted(bpfobj.TcLbMetricLB_M_XDP_FWD, 1)
	g.runXDP(t, gx, []xrow{
		{tc: true, Case: pktest.Case{
			Name: "TC begins a flow", In: fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload([]byte("q"))).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(pktest.UDP(snatSrc, remoteDNS).WithPayload([]byte("q")).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name: "XDP translates its next datagram alike", In: fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload([]byte("q2"))).Bytes(),
			Verdict: pktest.XDPTX, Out: toNodeB(pktest.UDP(snatSrc, remoteDNS).WithPayload([]byte("q2")).WithTTL(63)).Bytes(),
			Setup: xfwd, Check: xfwdOK,
		}},
		{Case: pktest.Case{
			Name:    "XDP translates its reply alike",
			In:      fromNodeB(pktest.UDP(remoteDNS, snatSrc).WithPayload([]byte("a"))).Bytes(),
			Verdict: pktest.XDPTX, Out: toRouter(pktest.UDP(np(npDNSRemote), client).WithPayload([]byte("a")).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "a flow TC began to a local backend stays with TC",
			In:      fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN)).Bytes(),
			Verdict: pktest.XDPPass,
		}},
		{tc: true, Case: pktest.Case{
			Name: "TC: the local flow", In: fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN)).Bytes(),
			Verdict: pktest.TCActOK, Out: fromOutside(pktest.TCP(client, localWeb, pktest.SYN)).Bytes(),
		}},
		{Case: pktest.Case{
			Name: "XDP: the local flow's next packet is TC's", In: ack(client, np(npWebLocal)).Bytes(), Verdict: pktest.XDPPass,
		}},
	})
}

// TestXDPNextHops: a next hop out of another device with the XDP program is
// a redirect, with that device's address for source NAT; one out of a
// device without it, or without a neighbour entry yet, is passed to TC,
// which carries on the flow XDP recorded.
func TestXDPNextHops(t *testing.T) {
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
			f := newFixture(t, loadOptions{})
			n1 := f.addSecondUplink(t)
			devs := []uint32{f.ifindex}
			if tc.withN1 {
				devs = append(devs, n1)
			}
			x := f.loadXDP(t, devs...)
			nodeCWeb := netip.MustParseAddrPort("10.244.3.10:8080")
			f.sync(t, state(service{name: "web-c", clusterIP: "10.96.0.50", port: 80, proto: model.TCP, nodePort: 30050, endpoints: []string{at(nodeCWeb, "node-c")}}))
			syn := fromOutside(pktest.TCP(client, np(30050), pktest.SYN))
			toC := pktest.TCP(nodeCSNAT, nodeCWeb, pktest.SYN).WithTTL(63).WithMACs(secondMAC, nodeCMAC)
			out := toC.Bytes()
			if tc.verdict == pktest.XDPPass {
				out = nil
			}
			toTC, toTCOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_TO_TC, tc.toTCWant)
			rows := []xrow{{Case: pktest.Case{Name: "SYN to node-c's pod", In: syn.Bytes(), Verdict: tc.verdict, Out: out, Setup: toTC, Check: toTCOK}}}
			if tc.verdict == pktest.XDPPass {
				rows = append(rows, xrow{tc: true, Case: pktest.Case{Name: "TC sends the recorded flow", In: syn.Bytes(), Verdict: pktest.TCActRedirect, Out: toC.Bytes()}})
			}
			f.runXDP(t, x, rows)
		})
	}
	t.Run("no neighbour entry", func(t *testing.T) {
		f := newFixture(t, loadOptions{})
		f.addSecondUplink(t)
		x := f.loadXDP(t, f.ifindex)
		nodeDWeb := netip.MustParseAddrPort("10.244.4.10:8080")
		f.sync(t, state(service{name: "web-d", clusterIP: "10.96.0.51", port: 80, proto: model.TCP, nodePort: 30051, endpoints: []string{at(nodeDWeb, "node-d")}}))
		syn := fromOutside(pktest.TCP(client, np(30051), pktest.SYN))
		toTC, toTCOK := f.counted(bpfobj.TcLbMetricLB_M_XDP_TO_TC, 1)
		f.runXDP(t, x, []xrow{
			{Case: pktest.Case{Name: "XDP records the flow and passes it", In: syn.Bytes(), Verdict: pktest.XDPPass, Setup: toTC, Check: toTCOK}},
			// bpf_redirect_neigh resolves the MAC addresses after the
			// program, so they are still the input's.
			{tc: true, Case: pktest.Case{
				Name: "TC translates it and has the kernel resolve the neighbour", In: syn.Bytes(),
				Verdict: pktest.TCActRedirect, Out: syn.WithSrc(snatSrc).WithDst(nodeDWeb).WithTTL(63).Bytes(),
			}},
		})
	})
}
