package tcpkt_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// The fixture's IPv6 twin: the same devices with IPv6 addresses, node-b's
// pods behind node-b, everything else behind the router.
var (
	node6      = netip.MustParseAddr("fd00:77::11")
	nodeB6     = netip.MustParseAddr("fd00:77::12")
	router6    = netip.MustParseAddr("fd00:77::1")
	nodeBPods6 = netip.MustParsePrefix("fd00:244:2::/64")
	podGW6     = netip.MustParsePrefix("fd00:244:1::1/64")

	client6   = netip.MustParseAddrPort("[2001:db8:18::10]:40000")
	client6b  = netip.MustParseAddrPort("[2001:db8:18::11]:40000")
	outsider6 = netip.MustParseAddrPort("[2001:db8:99::10]:40000")

	localWeb6    = netip.MustParseAddrPort("[fd00:244:1::10]:8080")
	remoteWeb6   = netip.MustParseAddrPort("[fd00:244:2::10]:8080")
	remoteDNS6   = netip.MustParseAddrPort("[fd00:244:2::11]:5353")
	extRemote6   = netip.MustParseAddrPort("[fd00:244:2::12]:8080")
	lbRemote6    = netip.MustParseAddrPort("[fd00:244:2::14]:8080")
	etpLocalEP6  = netip.MustParseAddrPort("[fd00:244:1::13]:8080")
	etpRemoteEP6 = netip.MustParseAddrPort("[fd00:244:2::13]:8080")
	elsewhereEP6 = netip.MustParseAddrPort("[fd00:244:2::16]:8080")

	externalIP6 = netip.MustParseAddrPort("[fd00:19::10]:80")
	lbIP6       = netip.MustParseAddrPort("[fd00:19::20]:80")
	snatSrc6    = netip.AddrPortFrom(node6, snatPort)
)

func fixtureState6() *model.State {
	return fixtureState6With([]string{at(remoteWeb6, otherNode)})
}

// fixtureState6With is fixtureState6 with web-remote's endpoints webRemote.
func fixtureState6With(webRemote []string) *model.State {
	st := state(
		service{name: "web-local", clusterIP: "fd00:96::10", port: 80, proto: model.TCP, nodePort: npWebLocal, endpoints: []string{at(localWeb6, thisNode)}},
		service{name: "web-remote", clusterIP: "fd00:96::11", port: 80, proto: model.TCP, nodePort: npWebRemote, endpoints: webRemote},
		service{name: "dns-remote", clusterIP: "fd00:96::12", port: 53, proto: model.UDP, nodePort: npDNSRemote, endpoints: []string{at(remoteDNS6, otherNode)}},
		service{name: "ext-ip", clusterIP: "fd00:96::13", port: 80, proto: model.TCP, extIPs: []string{externalIP6.Addr().String()}, endpoints: []string{at(extRemote6, otherNode)}},
		service{name: "lb", clusterIP: "fd00:96::14", port: 80, proto: model.TCP, nodePort: npLB, lbIPs: []string{lbIP6.Addr().String()},
			ranges: []string{"2001:db8:18::/64"}, endpoints: []string{at(lbRemote6, otherNode)}},
		service{name: "etp-local", clusterIP: "fd00:96::15", port: 80, proto: model.TCP, nodePort: npETPLocal, etpLocal: true, endpoints: []string{at(etpLocalEP6, thisNode), at(etpRemoteEP6, otherNode)}},
		service{name: "etp-local-elsewhere", clusterIP: "fd00:96::16", port: 80, proto: model.TCP, nodePort: npElsewhere, etpLocal: true, endpoints: []string{at(elsewhereEP6, otherNode)}},
		service{name: "no-endpoints", clusterIP: "fd00:96::17", port: 80, proto: model.TCP, nodePort: npNoEPs},
		service{name: "no-endpoints-udp", clusterIP: "fd00:96::17", port: 53, proto: model.UDP, nodePort: npNoEPs},
	)
	st.Node.Addrs = []netip.Addr{node6}
	return st
}

// fixture6 is the fixture with IPv6 addresses, routes and neighbours in its
// namespace, the IPv6 source NAT address of n0, and a writer of the IPv6
// maps (with their Maglev tables).
type fixture6 struct {
	*fixture
	w6 *maps.Writer
}

func newFixture6(tb testing.TB, opts loadOptions) *fixture6 {
	tb.Helper()
	f := newFixture(tb, opts)
	if err := setUpNodeNetwork6(f); err != nil {
		tb.Fatal(err)
	}
	if err := f.objs.Tc6SnatAddrsV1.Put(f.ifindex, bpfobj.TcTc6SnatAddr{Address: be32x4(node6)}); err != nil {
		tb.Fatal(err)
	}
	w6, err := maps.NewWriter6(maps.Maps6{
		Services:     maps.FromKernel[maps.Service6Key, maps.ServiceValue](f.objs.Lb6ServicesV1),
		Backends:     maps.FromKernel[uint32, maps.Backend6Value](f.objs.Lb6BackendsV1),
		RevNat:       maps.FromKernel[uint32, maps.RevNat6Value](f.objs.Lb6RevnatV1),
		Members:      maps.FromKernel[maps.MemberKey, uint8](f.objs.Lb6MembersV1),
		SourceRanges: maps.FromKernel[maps.SourceRange6Key, uint8](f.objs.Lb6SourceRangesV1),
		PortFilter:   maps.FromKernel[uint32, uint32](f.objs.Lb6ExtPortsV1),
		RemovedAt:    maps.FromKernel[uint32, uint32](f.objs.LbRemovedAtV1),
		Maglev:       maps.KernelMaglev(f.objs.Lb6MaglevV1, f.objs.Lb6MaglevFpV1, f.maglevTable6),
	}, maps.Limits{Backends: 1024, RevNat: 1024})
	if err != nil {
		tb.Fatal(err)
	}
	return &fixture6{fixture: f, w6: w6}
}

func (f *fixture6) sync6(tb testing.TB, st *model.State) {
	tb.Helper()
	st.Node.NodePorts = everyAddress6.Resolve(&st.Node, st.Node.Addrs)
	if err := f.w6.Sync(model.Update{State: st, Full: true}); err != nil {
		tb.Fatal(err)
	}
}

// everyAddress6 is --nodeport-addresses unset, for the IPv6 family.
var everyAddress6, _ = model.ParseNodePortSpec(nil, true, true)

func be32x4(a netip.Addr) [4]uint32 {
	b := a.As16()
	var out [4]uint32
	for i := range out {
		out[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
	}
	return out
}

func ipNet6(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 128)}
}

// setUpNodeNetwork6 gives the fixture's devices their IPv6 side: addresses
// without duplicate address detection, permanent neighbours, routes, and
// IPv6 forwarding in the fixture's namespace.
func setUpNodeNetwork6(f *fixture) error {
	err := f.ns.Do(func() error {
		for _, k := range []string{"all", "default", device, podDevice} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/accept_dad", []byte("0\n"), 0o644); err != nil {
				return err
			}
		}
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1\n"), 0o644)
	})
	if err != nil {
		return fmt.Errorf("IPv6 settings: %w", err)
	}
	nl := f.ns.Netlink()
	link, err := nl.LinkByName(device)
	if err != nil {
		return err
	}
	podLink, err := nl.LinkByName(podDevice)
	if err != nil {
		return err
	}
	if err := nl.AddrAdd(link, &netlink.Addr{IPNet: ipNet6(netip.PrefixFrom(node6, 64)), Flags: 0x02 /* IFA_F_NODAD */}); err != nil {
		return fmt.Errorf("IPv6 address of %s: %w", device, err)
	}
	if err := nl.AddrAdd(podLink, &netlink.Addr{IPNet: ipNet6(podGW6), Flags: 0x02}); err != nil {
		return fmt.Errorf("IPv6 address of %s: %w", podDevice, err)
	}
	for _, n := range []struct {
		link netlink.Link
		ip   netip.Addr
		mac  net.HardwareAddr
	}{
		{link, nodeB6, nodeBMAC}, {link, router6, routerMAC},
		{podLink, localWeb6.Addr(), podMAC}, {podLink, etpLocalEP6.Addr(), podMAC},
	} {
		neigh := &netlink.Neigh{LinkIndex: n.link.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
			IP: n.ip.AsSlice(), HardwareAddr: n.mac}
		if err := nl.NeighSet(neigh); err != nil {
			return fmt.Errorf("neighbour %s: %w", n.ip, err)
		}
	}
	routes := []*netlink.Route{
		{LinkIndex: link.Attrs().Index, Dst: ipNet6(nodeBPods6), Gw: nodeB6.AsSlice()},
		{LinkIndex: link.Attrs().Index, Dst: ipNet6(netip.MustParsePrefix("::/0")), Gw: router6.AsSlice()},
	}
	for _, r := range routes {
		if err := nl.RouteAdd(r); err != nil {
			return fmt.Errorf("route %v: %w", r, err)
		}
	}
	return nil
}

func np6(port uint16) netip.AddrPort { return netip.AddrPortFrom(node6, port) }

// unreachable6 is the ICMPv6 port unreachable the node answers in with,
// quoting the whole packet (it fits in the minimum MTU).
func unreachable6(in pktest.Builder6, from, to netip.Addr) []byte {
	return pktest.ICMPv6Unreachable(deviceMAC, clientMAC, from, to, pktest.ICMPv6PortUnreachable, in.IPBytes())
}

// resetCT6 forgets every tracked IPv6 flow.
func (f *fixture6) resetCT6(tb testing.TB) {
	tb.Helper()
	var (
		k    bpfobj.TcCt6Key
		v    bpfobj.TcCt6Entry
		keys []bpfobj.TcCt6Key
	)
	it := f.objs.Tc6CtV1.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		tb.Fatal(err)
	}
	for _, k := range keys {
		if err := f.objs.Tc6CtV1.Delete(&k); err != nil {
			tb.Fatal(err)
		}
	}
}

func TestVerdictsIPv6(t *testing.T) {
	f := newFixture6(t, loadOptions{})
	f.sync6(t, fixtureState6())

	noEPs := fromOutside(pktest.TCP6(client6, np6(npNoEPs), pktest.SYN))
	noEPsUDP := fromOutside(pktest.UDP6(client6, np6(npNoEPs)).WithPayload([]byte("q")))
	big := fromOutside(pktest.UDP6(client6, np6(npNoEPs)).WithPayload(make([]byte, 1400)))
	lbIn := fromOutside(pktest.TCP6(client6, lbIP6, pktest.SYN))
	extIn := fromOutside(pktest.TCP6(client6b, externalIP6, pktest.SYN))
	etp := fromOutside(pktest.TCP6(client6, np6(npETPLocal), pktest.SYN))
	truncated := fromOutside(pktest.TCP6(client6, np6(npWebLocal), pktest.SYN)).Bytes()
	truncated = truncated[:len(truncated)-4]
	rej, rejOK := f.counted(bpfobj.TcLbMetricLB_M_REJECT, 1)
	drop, dropOK := f.counted(bpfobj.TcLbMetricLB_M_DROP, 1)
	rng, rngOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SOURCE_RANGE, 1)
	untouched, untouchedOK := f.flowsUnchanged6()

	f.run(t, []row{
		{Case: pktest.Case{
			Name: "IPv6 TCP to a NodePort without endpoints: ICMPv6 port unreachable from the NodePort", In: noEPs.Bytes(),
			Verdict: pktest.TCActRedirect, Out: unreachable6(noEPs, node6, client6.Addr()), Setup: rej, Check: rejOK,
		}},
		{Case: pktest.Case{
			Name: "IPv6 UDP to a NodePort without endpoints: ICMPv6 port unreachable", In: noEPsUDP.Bytes(),
			Verdict: pktest.TCActRedirect, Out: unreachable6(noEPsUDP, node6, client6.Addr()),
		}},
		{Case: pktest.Case{
			Name: "IPv6 datagram larger than the minimum MTU without endpoints: the unreachable quotes 1232 bytes", In: big.Bytes(),
			Verdict: pktest.TCActRedirect,
			Out:     pktest.ICMPv6Unreachable(deviceMAC, clientMAC, node6, client6.Addr(), pktest.ICMPv6PortUnreachable, big.IPBytes()[:1232]),
			// Trimming the tail leaves the skb CHECKSUM_NONE.
			SKBChecksum: pktest.SKBChecksumNone,
		}},
		{Case: pktest.Case{
			Name: "IPv6 policy Local without a local endpoint: dropped", In: fromOutside(pktest.TCP6(client6, np6(npElsewhere), pktest.SYN)).Bytes(),
			Verdict: pktest.TCActShot, Setup: drop, Check: dropOK,
		}},
		{Case: pktest.Case{
			Name: "IPv6 policy Local: the local endpoint, no source NAT", In: etp.Bytes(),
			Verdict: pktest.TCActOK, Out: etp.WithDst(etpLocalEP6).Bytes(),
		}},
		{Case: pktest.Case{
			Name: "IPv6 LoadBalancer IP, client outside the source ranges: dropped", In: fromOutside(pktest.TCP6(outsider6, lbIP6, pktest.SYN)).Bytes(),
			Verdict: pktest.TCActShot, Setup: rng, Check: rngOK,
		}},
		{Case: pktest.Case{
			Name: "IPv6 LoadBalancer IP, client inside the source ranges: DNAT and SNAT", In: lbIn.Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(lbIn.WithSrc(snatSrc6).WithDst(lbRemote6).WithHopLimit(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name: "IPv6 ExternalIP: DNAT and SNAT", In: extIn.Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(extIn.WithSrc(snatSrc6).WithDst(extRemote6).WithHopLimit(63)).Bytes(),
		}},
	})
	f.resetCT6(t)
	f.run(t, []row{
		{Case: pktest.Case{
			Name: "IPv6 truncated segment to a NodePort: passed untouched", In: truncated,
			Verdict: pktest.TCActUnspec, Setup: untouched, Check: untouchedOK,
		}},
		{Case: pktest.Case{
			Name:    "IPv6 UDP with a hop-by-hop header to a NodePort: passed untouched",
			In:      pktest.IPv6WithExtHeader(clientMAC, deviceMAC, client6, np6(npDNSRemote), []byte("query")),
			Verdict: pktest.TCActUnspec, Setup: untouched, Check: untouchedOK,
		}},
		{Case: pktest.Case{
			Name:    "IPv6 first fragment of a datagram to a NodePort: passed untouched",
			In:      pktest.IPv6Fragment(clientMAC, deviceMAC, client6, np6(npDNSRemote), []byte("query")),
			Verdict: pktest.TCActUnspec, BadChecksums: true, Setup: untouched, Check: untouchedOK,
		}},
		{Case: pktest.Case{
			Name:    "IPv6 neighbour solicitation for the node: passed untouched",
			In:      pktest.IPv6NeighborSolicit(clientMAC, client6.Addr(), node6),
			Verdict: pktest.TCActUnspec, Setup: untouched, Check: untouchedOK,
		}},
		{Case: pktest.Case{
			Name:    "IPv6 UDP without checksum to a NodePort: passed untouched (IPv6 forbids it)",
			In:      fromOutside(pktest.UDP6(client6, np6(npDNSRemote)).WithPayload([]byte("q")).WithL4Checksum(0)).Bytes(),
			Verdict: pktest.TCActUnspec, BadChecksums: true, Setup: untouched, Check: untouchedOK,
		}},
		{Case: pktest.Case{
			Name:    "IPv6 to a port that is no frontend: passed untouched",
			In:      fromOutside(pktest.TCP6(client6, np6(22), pktest.SYN)).Bytes(),
			Verdict: pktest.TCActUnspec, Setup: untouched, Check: untouchedOK,
		}},
		{Case: pktest.Case{
			Name:    "ARP: passed untouched",
			In:      pktest.ARPRequest(clientMAC, nodeAddr, nodeBAddr),
			Verdict: pktest.TCActUnspec,
		}},
		{egress: true, Case: pktest.Case{
			Name:    "IPv6 neighbour solicitation at egress: passed untouched",
			In:      pktest.IPv6NeighborSolicit(deviceMAC, node6, router6),
			Verdict: pktest.TCActUnspec,
		}},
	})
}

// flowsUnchanged6 checks that a case made no IPv6 flow entry.
func (f *fixture6) flowsUnchanged6() (func(testing.TB), func(testing.TB, pktest.Result)) {
	var before int
	return func(tb testing.TB) { before = f.flows6(tb) },
		func(tb testing.TB, _ pktest.Result) {
			tb.Helper()
			if n := f.flows6(tb); n != before {
				tb.Errorf("%d IPv6 flow entries, %d before", n, before)
			}
		}
}

func TestFlowsIPv6(t *testing.T) {
	f := newFixture6(t, loadOptions{})
	f.sync6(t, fixtureState6())

	dnsQuery := fromOutside(pktest.UDP6(client6, np6(npDNSRemote)).WithPayload([]byte("query")))
	tcpFlows, udpFlows := nodePortFlows(f.fixture, flowFamily[pktest.Builder6]{
		tag: "IPv6", tcp: pktest.TCP6, udp: pktest.UDP6, np: np6,
		client: client6, client2: client6b, snatSrc: snatSrc6,
		localWeb: localWeb6, remoteWeb: remoteWeb6, remoteDNS: remoteDNS6,
	})
	f.run(t, tcpFlows)
	f.resetCT6(t)
	f.run(t, append(udpFlows, []row{
		{Case: pktest.Case{
			Name:    "IPv6 UDP whose translated checksum sums to zero: sent as all ones",
			In:      dnsQuery.WithPayload(zeroSumPayload(dnsQuery, snatSrc6, remoteDNS6)).Bytes(),
			Verdict: pktest.TCActRedirect,
			Out:     toNodeB(dnsQuery.WithSrc(snatSrc6).WithDst(remoteDNS6).WithHopLimit(63).WithPayload(zeroSumPayload(dnsQuery, snatSrc6, remoteDNS6)).WithL4Checksum(0xffff)).Bytes(),
		}},
	}...))
}

func TestResetIPv6(t *testing.T) {
	f := newFixture6(t, loadOptions{})
	st := fixtureState6()
	f.sync6(t, st)
	syn := fromOutside(pktest.TCP6(client6, np6(npWebRemote), pktest.SYN))
	data := fromOutside(pktest.TCP6(client6, np6(npWebRemote), pktest.ACK|pktest.PSH).WithSeq(5000, 7000).WithPayload([]byte("GET /")))
	reset, resetOK := f.counted(bpfobj.TcLbMetricLB_M_TC_RESET, 1)
	f.run(t, []row{{Case: pktest.Case{
		Name: "IPv6 NodePort, remote backend: a flow begins", In: syn.Bytes(),
		Verdict: pktest.TCActRedirect, Out: toNodeB(syn.WithSrc(snatSrc6).WithDst(remoteWeb6).WithHopLimit(63)).Bytes(),
	}}})
	// The endpoint goes: the next segment is answered with a reset from
	// the NodePort, <SEQ=SEG.ACK><CTL=RST>, and the flow forgotten.
	f.sync6(t, fixtureState6WithoutRemoteWeb())
	f.run(t, []row{{Case: pktest.Case{
		Name: "IPv6 segment of a flow whose backend was removed: a reset from the NodePort", In: data.Bytes(),
		Verdict: pktest.TCActRedirect,
		Out:     pktest.TCP6(np6(npWebRemote), client6, pktest.RST).WithSeq(7000, 0).WithWindow(0).WithMACs(deviceMAC, clientMAC).Bytes(),
		Setup:   reset, Check: resetOK,
		// Trimming the payload leaves the skb CHECKSUM_NONE.
		SKBChecksum: pktest.SKBChecksumNone,
	}}})
	if n := f.flows6(t); n != 0 {
		t.Errorf("%d IPv6 flow entries after the reset, want none", n)
	}
	// A segment without payload: nothing is trimmed, and skb->csum of a
	// CHECKSUM_COMPLETE skb must stay right.
	second := netip.MustParseAddrPort("[fd00:244:2::20]:8080")
	syn2 := fromOutside(pktest.TCP6(client6b, np6(npWebRemote), pktest.SYN))
	f.run(t, []row{{Case: pktest.Case{
		Name: "IPv6 NodePort: a second flow begins", In: syn2.Bytes(),
		Verdict: pktest.TCActRedirect, Out: toNodeB(syn2.WithSrc(snatSrc6).WithDst(second).WithHopLimit(63)).Bytes(),
	}}})
	f.sync6(t, fixtureState6())
	ack := fromOutside(pktest.TCP6(client6b, np6(npWebRemote), pktest.ACK).WithSeq(5000, 9000))
	f.run(t, []row{{Case: pktest.Case{
		Name: "IPv6 bare ACK of a flow whose backend was removed: a reset, checksums kept", In: ack.Bytes(),
		Verdict: pktest.TCActRedirect,
		Out:     pktest.TCP6(np6(npWebRemote), client6b, pktest.RST).WithSeq(9000, 0).WithWindow(0).WithMACs(deviceMAC, clientMAC).Bytes(),
	}}})
}

// fixtureState6WithoutRemoteWeb is fixtureState6 after web-remote's
// endpoint went: another takes its place.
func fixtureState6WithoutRemoteWeb() *model.State {
	return fixtureState6With([]string{at(netip.MustParseAddrPort("[fd00:244:2::20]:8080"), otherNode)})
}

// flows6 counts the IPv6 flow entries.
func (f *fixture6) flows6(tb testing.TB) int {
	tb.Helper()
	return countEntries[bpfobj.TcCt6Key, bpfobj.TcCt6Entry](tb, f.objs.Tc6CtV1)
}

// zeroSumPayload is a payload after which the UDP datagram b, translated
// to src -> dst, has a computed checksum of 0 (sent as 0xffff): the payload
// "query" with two bytes appended that make the sum all ones.
func zeroSumPayload(b pktest.Builder6, src, dst netip.AddrPort) []byte {
	p := append([]byte("query"), 0, 0, 0)
	out := pktest.UDP6(src, dst).WithPayload(p).IPBytes()
	c := uint16(out[46])<<8 | uint16(out[47])
	// The checksum field holds ~sum; adding c to the data makes the sum
	// 0xffff, whose complement is 0. The word after "query\0" is even
	// aligned in the UDP data (offset 6).
	p[6], p[7] = byte(c>>8), byte(c)
	_ = b
	return p[:8]
}
