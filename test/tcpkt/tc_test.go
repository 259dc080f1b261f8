// Package tcpkt_test holds the packet fixture tables and benchmarks of the
// TC programs (bpf/tc.c): every path a packet can take, run through
// BPF_PROG_TEST_RUN on a device in a test namespace whose routes and
// neighbours the programs' FIB lookups use.
package tcpkt_test

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

var (
	client  = netip.MustParseAddrPort("198.18.0.10:40000")
	client2 = netip.MustParseAddrPort("198.18.0.11:40000")

	localWeb    = netip.MustParseAddrPort("10.244.1.10:8080")
	remoteWeb   = netip.MustParseAddrPort("10.244.2.10:8080")
	remoteDNS   = netip.MustParseAddrPort("10.244.2.11:5353")
	extRemote   = netip.MustParseAddrPort("10.244.2.12:8080")
	lbLocal     = netip.MustParseAddrPort("10.244.1.12:8080")
	etpLocalEP  = netip.MustParseAddrPort("10.244.1.13:8080")
	etpRemoteEP = netip.MustParseAddrPort("10.244.2.13:8080")
	elsewhereEP = netip.MustParseAddrPort("10.244.2.16:8080")

	externalIP = netip.MustParseAddrPort("198.19.0.10:80")
	lbIP       = netip.MustParseAddrPort("198.19.0.20:80")
)

// NodePorts of the fixture's Services.
const (
	npWebLocal  = 30010
	npWebRemote = 30011
	npDNSRemote = 30012
	npLB        = 30014
	npETPLocal  = 30015
	npElsewhere = 30016
	npNoEPs     = 30017
)

func at(ap netip.AddrPort, node string) string { return ap.String() + "@" + node }

func fixtureState() *model.State {
	return state(
		service{name: "web-local", clusterIP: "10.96.0.10", port: 80, proto: model.TCP, nodePort: npWebLocal, endpoints: []string{at(localWeb, thisNode)}},
		service{name: "web-remote", clusterIP: "10.96.0.11", port: 80, proto: model.TCP, nodePort: npWebRemote, endpoints: []string{at(remoteWeb, otherNode)}},
		service{name: "dns-remote", clusterIP: "10.96.0.12", port: 53, proto: model.UDP, nodePort: npDNSRemote, endpoints: []string{at(remoteDNS, otherNode)}},
		service{name: "ext-ip", clusterIP: "10.96.0.13", port: 80, proto: model.TCP, extIPs: []string{externalIP.Addr().String()}, endpoints: []string{at(extRemote, otherNode)}},
		service{name: "lb", clusterIP: "10.96.0.14", port: 80, proto: model.TCP, nodePort: npLB, lbIPs: []string{lbIP.Addr().String()}, endpoints: []string{at(lbLocal, thisNode)}},
		service{name: "etp-local", clusterIP: "10.96.0.15", port: 80, proto: model.TCP, nodePort: npETPLocal, etpLocal: true, endpoints: []string{at(etpLocalEP, thisNode), at(etpRemoteEP, otherNode)}},
		service{name: "etp-local-elsewhere", clusterIP: "10.96.0.16", port: 80, proto: model.TCP, nodePort: npElsewhere, etpLocal: true, endpoints: []string{at(elsewhereEP, otherNode)}},
		service{name: "no-endpoints", clusterIP: "10.96.0.17", port: 80, proto: model.TCP, nodePort: npNoEPs},
		service{name: "no-endpoints-udp", clusterIP: "10.96.0.17", port: 53, proto: model.UDP, nodePort: npNoEPs},
	)
}

func np(port uint16) netip.AddrPort { return netip.AddrPortFrom(nodeAddr, port) }

// localhostNP is a NodePort on 127.0.0.1.
func localhostNP(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
}

// withLocalhostNodePorts adds 127.0.0.1 to the node's NodePort addresses,
// as the agent does with --iptables-localhost-nodeports.
func withLocalhostNodePorts(st *model.State) *model.State {
	st.Node.Addrs = append(st.Node.Addrs, netip.MustParseAddr("127.0.0.1"))
	return st
}

var snatSrc = netip.AddrPortFrom(nodeAddr, snatPort)

// frame is what the tables written once for both families use of pktest's
// IPv4 and IPv6 builders (B is Builder or Builder6).
type frame[B any] interface {
	WithMACs(src, dst net.HardwareAddr) B
	WithSrc(netip.AddrPort) B
	WithDst(netip.AddrPort) B
	WithTTL(uint8) B
	WithPayload([]byte) B
	Bytes() []byte
}

// fromOutside is a frame arriving at the node's device from the router.
func fromOutside[B frame[B]](b B) B { return b.WithMACs(clientMAC, deviceMAC) }

// toRouter is a frame the node sends to the router, to reach a client.
func toRouter[B frame[B]](b B) B { return b.WithMACs(deviceMAC, routerMAC) }

// toNodeB is a frame the node sends to node-b, to reach its pods.
func toNodeB[B frame[B]](b B) B { return b.WithMACs(deviceMAC, nodeBMAC) }

// fromNodeB is a frame arriving from node-b.
func fromNodeB[B frame[B]](b B) B { return b.WithMACs(nodeBMAC, deviceMAC) }

// flowFamily is one family's side of TestFlows and TestFlowsIPv6: its
// builders, addresses and the tag its case names start with.
type flowFamily[B frame[B]] struct {
	// tag starts the case names ("" for IPv4, "IPv6").
	tag string
	tcp func(src, dst netip.AddrPort, flags pktest.TCPFlags) B
	udp func(src, dst netip.AddrPort) B
	// np is the node's NodePort port.
	np func(port uint16) netip.AddrPort
	// client and client2 are the external clients; snatSrc is the node's
	// source NAT address and port.
	client, client2, snatSrc netip.AddrPort
	// localWeb is the web backend on the node, remoteWeb and remoteDNS the
	// ones on node-b.
	localWeb, remoteWeb, remoteDNS netip.AddrPort
}

// name is the case name s of the family: s after its tag and sep.
func (fam flowFamily[B]) name(sep, s string) string {
	if fam.tag == "" {
		return s
	}
	return fam.tag + sep + s
}

// nodePortFlows are the cases of TestFlows and TestFlowsIPv6 over fam, on f
// synced with the family's fixture state: the TCP flows of NodePorts with a
// local and a remote backend, with the source NAT port exhausted by a
// second client, and then a UDP NodePort with a remote backend, its query
// and its reply. Each list runs in order.
func nodePortFlows[B frame[B]](f *fixture, fam flowFamily[B]) (tcp, udp []row) {
	synLocal := fromOutside(fam.tcp(fam.client, fam.np(npWebLocal), pktest.SYN))
	synRemote := fromOutside(fam.tcp(fam.client, fam.np(npWebRemote), pktest.SYN))
	dnsQuery := fromOutside(fam.udp(fam.client, fam.np(npDNSRemote)).WithPayload([]byte("query")))
	dnsAnswer := fromNodeB(fam.udp(fam.remoteDNS, fam.snatSrc).WithPayload([]byte("answer")))
	newLocal, newLocalOK := f.counted(bpfobj.TcLbMetricLB_M_TC_NEW_LOCAL, 1)
	newSNAT, newSNATOK := f.counted(bpfobj.TcLbMetricLB_M_TC_NEW_SNAT, 1)
	reply, replyOK := f.counted(bpfobj.TcLbMetricLB_M_TC_REPLY, 1)
	noPort, noPortOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_NO_PORT, 1)

	tcp = []row{
		{Case: pktest.Case{
			Name: fam.name(" ", "NodePort, local backend: destination rewritten, client address kept"), In: synLocal.Bytes(),
			Verdict: pktest.TCActOK, Out: synLocal.WithDst(fam.localWeb).Bytes(), Setup: newLocal, Check: newLocalOK,
		}},
		{egress: true, Case: pktest.Case{
			Name:    fam.name(" ", "local backend's reply at egress: source becomes the NodePort"),
			In:      toRouter(fam.tcp(fam.localWeb, fam.client, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActOK, Out: toRouter(fam.tcp(fam.np(npWebLocal), fam.client, pktest.SYN|pktest.ACK)).Bytes(),
			Setup: reply, Check: replyOK,
		}},
		{Case: pktest.Case{
			Name:    fam.name(" ", "NodePort, local backend: the flow's next segment goes to the same backend"),
			In:      fromOutside(fam.tcp(fam.client, fam.np(npWebLocal), pktest.ACK)).Bytes(),
			Verdict: pktest.TCActOK, Out: fromOutside(fam.tcp(fam.client, fam.localWeb, pktest.ACK)).Bytes(),
		}},
		{egress: true, Case: pktest.Case{
			Name:    fam.name(" ", "egress: a pod's packet that is not a reply passes untouched"),
			In:      toRouter(fam.tcp(fam.localWeb, fam.client2, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActUnspec,
		}},
		{Case: pktest.Case{
			Name: fam.name(" ", "NodePort, remote backend: DNAT and SNAT to the node, sent to node-b"), In: synRemote.Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(synRemote.WithSrc(fam.snatSrc).WithDst(fam.remoteWeb).WithTTL(63)).Bytes(),
			Setup: newSNAT, Check: newSNATOK,
		}},
		{Case: pktest.Case{
			Name:    fam.name(" ", "remote backend's reply at ingress: back to the client from the NodePort"),
			In:      fromNodeB(fam.tcp(fam.remoteWeb, fam.snatSrc, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toRouter(fam.tcp(fam.np(npWebRemote), fam.client, pktest.SYN|pktest.ACK).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    fam.name(" ", "NodePort, remote backend: the flow keeps its source port"),
			In:      fromOutside(fam.tcp(fam.client, fam.np(npWebRemote), pktest.ACK).WithPayload([]byte("GET /"))).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(fam.tcp(fam.snatSrc, fam.remoteWeb, pktest.ACK).WithPayload([]byte("GET /")).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    fam.name(": ", "another client while the only source NAT port is taken: dropped and counted"),
			In:      fromOutside(fam.tcp(fam.client2, fam.np(npWebRemote), pktest.SYN)).Bytes(),
			Verdict: pktest.TCActShot, Setup: noPort, Check: noPortOK,
		}},
	}
	udp = []row{
		{Case: pktest.Case{
			Name: fam.name(" ", "UDP NodePort, remote backend: DNAT and SNAT"), In: dnsQuery.Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(dnsQuery.WithSrc(fam.snatSrc).WithDst(fam.remoteDNS).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name: fam.name(" ", "UDP reply: back to the client"), In: dnsAnswer.Bytes(),
			Verdict: pktest.TCActRedirect, Out: toRouter(fam.udp(fam.np(npDNSRemote), fam.client).WithPayload([]byte("answer")).WithTTL(63)).Bytes(),
		}},
	}
	return tcp, udp
}

// unreachable is the ICMP port unreachable the node answers in with: it
// quotes the whole packet, as the kernel's REJECT does for packets that fit
// in 576 bytes.
func unreachable(in pktest.Builder, from netip.Addr, to netip.Addr) []byte {
	return pktest.ICMPUnreachable(from, to, pktest.ICMPPortUnreachable, in.IPBytes()).
		WithMACs(deviceMAC, clientMAC).WithID(0).WithTTL(64).Bytes()
}

// counted checks that one case moved counter m by exactly want.
func (f *fixture) counted(m bpfobj.TcLbMetric, want uint64) (func(testing.TB), func(testing.TB, pktest.Result)) {
	var before uint64
	return func(tb testing.TB) { before = f.counter(tb, m) },
		func(tb testing.TB, _ pktest.Result) {
			tb.Helper()
			if got := f.counter(tb, m) - before; got != want {
				tb.Errorf("counter %d moved by %d, want %d", m, got, want)
			}
		}
}

// row is a case for one of the two programs.
type row struct {
	pktest.Case
	egress bool
	// onPodDevice runs the case on p0 rather than n0.
	onPodDevice bool
	// pod runs tc_pod_ingress at ingress (p0 as a pod's device, with
	// --socket-lb-scope=node), on p0.
	pod bool
}

// run runs rows in order, each on the fixture's device inside its
// namespace: state the programs keep carries over from row to row.
func (f *fixture) run(t *testing.T, rows []row) {
	t.Helper()
	for _, r := range rows {
		c := r.Case
		c.Do = f.ns.Do
		c.SKB = &pktest.SKBContext{Ifindex: f.ifindex}
		if r.onPodDevice || r.pod {
			c.SKB.Ifindex = f.podIfindex
		}
		prog := f.objs.TcIngress
		if r.pod {
			prog = f.objs.TcPodIngress
		}
		if r.egress {
			prog = f.objs.TcEgress
		}
		t.Run(c.Name, func(t *testing.T) { pktest.RunCase(t, prog, c) })
	}
}

func TestFlows(t *testing.T) {
	f := newFixture(t, loadOptions{})
	f.sync(t, fixtureState())

	dnsQuery := fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload([]byte("query")))
	tcpFlows, udpFlows := nodePortFlows(f, flowFamily[pktest.Builder]{
		tcp: pktest.TCP, udp: pktest.UDP, np: np,
		client: client, client2: client2, snatSrc: snatSrc,
		localWeb: localWeb, remoteWeb: remoteWeb, remoteDNS: remoteDNS,
	})
	f.run(t, append(slices.Concat(tcpFlows, udpFlows), []row{
		{Case: pktest.Case{
			Name:    "UDP without checksum: translated and still without checksum",
			In:      dnsQuery.WithL4Checksum(0).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(dnsQuery.WithSrc(snatSrc).WithDst(remoteDNS).WithTTL(63).WithL4Checksum(0)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "ExternalIP, remote backend: DNAT and SNAT",
			In:      fromOutside(pktest.TCP(client, externalIP, pktest.SYN)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toNodeB(pktest.TCP(snatSrc, extRemote, pktest.SYN).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "ExternalIP reply: source becomes the ExternalIP",
			In:      fromNodeB(pktest.TCP(extRemote, snatSrc, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toRouter(pktest.TCP(externalIP, client, pktest.SYN|pktest.ACK).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "LoadBalancer IP, local backend: destination rewritten",
			In:      fromOutside(pktest.TCP(client, lbIP, pktest.SYN)).Bytes(),
			Verdict: pktest.TCActOK, Out: fromOutside(pktest.TCP(client, lbLocal, pktest.SYN)).Bytes(),
		}},
		{egress: true, Case: pktest.Case{
			Name:    "LoadBalancer IP reply: source becomes the LoadBalancer IP",
			In:      toRouter(pktest.TCP(lbLocal, client, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActOK, Out: toRouter(pktest.TCP(lbIP, client, pktest.SYN|pktest.ACK)).Bytes(),
		}},
		{Case: pktest.Case{
			Name:    "externalTrafficPolicy=Local: the local endpoint only, client address kept",
			In:      fromOutside(pktest.TCP(client, np(npETPLocal), pktest.SYN)).Bytes(),
			Verdict: pktest.TCActOK, Out: fromOutside(pktest.TCP(client, etpLocalEP, pktest.SYN)).Bytes(),
		}},
	}...))
}

func TestVerdicts(t *testing.T) {
	f := newFixture(t, loadOptions{})
	f.sync(t, fixtureState())

	syn := fromOutside(pktest.TCP(client, np(npNoEPs), pktest.SYN))
	synOpts := syn.WithIPOptions(pktest.IPOptRouterAlert())
	udp := fromOutside(pktest.UDP(client, np(npNoEPs)).WithPayload([]byte("query")))
	big := fromOutside(pktest.UDP(client, np(npNoEPs)).WithPayload(make([]byte, 1000)))
	drop, dropOK := f.counted(bpfobj.TcLbMetricLB_M_DROP, 1)
	reject, rejectOK := f.counted(bpfobj.TcLbMetricLB_M_REJECT, 1)

	f.run(t, []row{
		{Case: pktest.Case{
			Name:    "externalTrafficPolicy=Local without a local endpoint: dropped",
			In:      fromOutside(pktest.TCP(client, np(npElsewhere), pktest.SYN)).Bytes(),
			Verdict: pktest.TCActShot, Setup: drop, Check: dropOK,
		}},
		{Case: pktest.Case{
			Name: "no endpoints, TCP: ICMP port unreachable back out of the device", In: syn.Bytes(),
			Verdict: pktest.TCActRedirect, Out: unreachable(syn, nodeAddr, client.Addr()), Setup: reject, Check: rejectOK,
		}},
		{Case: pktest.Case{
			Name: "no endpoints, TCP with IP options: the quote holds the options", In: synOpts.Bytes(),
			Verdict: pktest.TCActRedirect, Out: unreachable(synOpts, nodeAddr, client.Addr()),
		}},
		{Case: pktest.Case{
			Name: "no endpoints, UDP: ICMP port unreachable", In: udp.Bytes(),
			Verdict: pktest.TCActRedirect, Out: unreachable(udp, nodeAddr, client.Addr()),
		}},
		{Case: pktest.Case{
			Name: "no endpoints, UDP without checksum: ICMP port unreachable", In: udp.WithL4Checksum(0).Bytes(),
			Verdict: pktest.TCActRedirect, Out: unreachable(udp.WithL4Checksum(0), nodeAddr, client.Addr()),
		}},
		{Case: pktest.Case{
			Name: "no endpoints, 1028-byte datagram: the quote ends at 576 bytes", In: big.Bytes(),
			Verdict: pktest.TCActRedirect, Out: pktest.ICMPUnreachable(nodeAddr, client.Addr(), pktest.ICMPPortUnreachable, big.IPBytes()[:576-28]).
					WithMACs(deviceMAC, clientMAC).WithID(0).WithTTL(64).Bytes(),
			// Trimming the tail leaves the skb CHECKSUM_NONE.
			SKBChecksum: pktest.SKBChecksumNone,
		}},
	})
	if n := f.flows(t); n != 0 {
		t.Errorf("%d flows tracked after refusals, want none", n)
	}
}

func TestPassesWhatIsNotOurs(t *testing.T) {
	f := newFixture(t, loadOptions{})
	f.sync(t, withLocalhostNodePorts(fixtureState()))

	synLocal := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN))
	bigUDP := fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload(make([]byte, 64)))
	frags := bigUDP.MustFragments(32)
	fragment, fragmentOK := f.counted(bpfobj.TcLbMetricLB_M_TC_FRAGMENT, 1)
	rows := []row{
		{Case: pktest.Case{Name: "TCP to a node port without a Service", In: fromOutside(pktest.TCP(client, np(22), pktest.SYN)).Bytes(), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "TCP to a NodePort on an address that is not the node's", In: fromOutside(pktest.TCP(client, netip.MustParseAddrPort("192.168.77.99:30010"), pktest.SYN)).Bytes(), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "UDP to a TCP NodePort", In: fromOutside(pktest.UDP(client, np(npWebLocal))).Bytes(), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "TCP from outside to a localhost NodePort: the node's sockets' only (CVE-2020-8558)", In: fromOutside(pktest.TCP(client, localhostNP(npWebRemote), pktest.SYN)).Bytes(), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "TCP to a ClusterIP from outside: not an external frontend", In: fromOutside(pktest.TCP(client, netip.MustParseAddrPort("10.96.0.10:80"), pktest.SYN)).Bytes(), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "ICMP echo to the node", In: fromOutside(pktest.ICMPEcho(client.Addr(), nodeAddr, 1, 1)).Bytes(), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "ARP request", In: pktest.ARPRequest(clientMAC, routerAddr, nodeAddr), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "IPv6 UDP", In: pktest.IPv6UDP(netip.MustParseAddrPort("[2001:db8::1]:40000"), netip.MustParseAddrPort("[2001:db8::2]:30012"), []byte("x")), Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "first fragment to a NodePort: passed and counted", In: frags[0], Verdict: pktest.TCActUnspec, Setup: fragment, Check: fragmentOK}},
		{Case: pktest.Case{Name: "second fragment to a NodePort", In: frags[1], Verdict: pktest.TCActUnspec}},
		{Case: pktest.Case{Name: "header length below 5 words", In: synLocal.WithIHL(4).Bytes(), Verdict: pktest.TCActUnspec, BadChecksums: true}},
		{Case: pktest.Case{Name: "IP version 6 in an IPv4 frame", In: synLocal.WithVersion(6).Bytes(), Verdict: pktest.TCActUnspec, BadChecksums: true}},
		{Case: pktest.Case{Name: "total length beyond the frame", In: synLocal.WithTotalLength(200).Bytes(), Verdict: pktest.TCActUnspec, BadChecksums: true}},
		{egress: true, Case: pktest.Case{Name: "egress: the node's own traffic", In: toRouter(pktest.TCP(np(40000), client, pktest.SYN)).Bytes(), Verdict: pktest.TCActUnspec}},
	}
	for _, c := range pktest.Cuts(synLocal.Bytes()) {
		rows = append(rows, row{Case: pktest.Case{Name: c.Name(), In: c.Frame, Verdict: pktest.TCActUnspec, BadChecksums: true}})
	}
	f.run(t, rows)
	if n := f.flows(t); n != 0 {
		t.Errorf("%d flows tracked, want none", n)
	}
}

func TestIPOptionsTranslated(t *testing.T) {
	f := newFixture(t, loadOptions{})
	f.sync(t, fixtureState())
	opts := []pktest.IPOption{pktest.IPOptNOP(), pktest.IPOptRecordRoute(2)}
	local := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN).WithIPOptions(opts...))
	remote := fromOutside(pktest.UDP(client, np(npDNSRemote)).WithIPOptions(opts...).WithPayload([]byte("q")))
	f.run(t, []row{
		{Case: pktest.Case{Name: "IP options, local backend", In: local.Bytes(), Verdict: pktest.TCActOK, Out: local.WithDst(localWeb).Bytes()}},
		{Case: pktest.Case{Name: "IP options, remote backend", In: remote.Bytes(), Verdict: pktest.TCActRedirect, Out: toNodeB(remote.WithSrc(snatSrc).WithDst(remoteDNS).WithTTL(63)).Bytes()}},
		{Case: pktest.Case{Name: "IP options, reply", In: fromNodeB(pktest.UDP(remoteDNS, snatSrc).WithIPOptions(opts...)).Bytes(), Verdict: pktest.TCActRedirect, Out: toRouter(pktest.UDP(np(npDNSRemote), client).WithIPOptions(opts...).WithTTL(63)).Bytes()}},
	})
}

// TestUDPFlowFollowsItsBackend: a UDP flow stays on its backend while the
// ServicePort may choose it, and moves to another once that backend is
// removed, as kube-proxy clears the conntrack entries of removed UDP
// endpoints.
func TestUDPFlowFollowsItsBackend(t *testing.T) {
	f := newFixture(t, loadOptions{})
	dns := func(ep netip.AddrPort) *model.State {
		return state(service{name: "dns", clusterIP: "10.96.0.12", port: 53, proto: model.UDP, nodePort: npDNSRemote, endpoints: []string{at(ep, thisNode)}})
	}
	first := netip.MustParseAddrPort("10.244.1.20:5353")
	second := netip.MustParseAddrPort("10.244.1.21:5353")
	query := fromOutside(pktest.UDP(client, np(npDNSRemote)).WithPayload([]byte("q")))
	f.sync(t, dns(first))
	f.run(t, []row{{Case: pktest.Case{Name: "first datagram", In: query.Bytes(), Verdict: pktest.TCActOK, Out: query.WithDst(first).Bytes()}}})
	f.sync(t, dns(second))
	f.run(t, []row{{Case: pktest.Case{Name: "after the backend was replaced", In: query.Bytes(), Verdict: pktest.TCActOK, Out: query.WithDst(second).Bytes()}}})
}

// TestTCPFlowKeepsItsBackend: an established TCP flow keeps its backend
// while that endpoint is terminating, as conntrack keeps it in kube-proxy;
// new connections go to the ready endpoint. (Once the endpoint is removed
// the flow is reset: TestResetWhenTheBackendIsRemoved.)
func TestTCPFlowKeepsItsBackend(t *testing.T) {
	f := newFixture(t, loadOptions{})
	first := netip.MustParseAddrPort("10.244.1.20:8080")
	second := netip.MustParseAddrPort("10.244.1.21:8080")
	f.sync(t, state(service{name: "web", clusterIP: "10.96.0.10", port: 80, proto: model.TCP, nodePort: npWebLocal, endpoints: []string{at(first, thisNode)}}))
	syn := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN))
	ack := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.ACK).WithPayload([]byte("GET /")))
	other := fromOutside(pktest.TCP(client2, np(npWebLocal), pktest.SYN))
	f.run(t, []row{{Case: pktest.Case{Name: "connection opened", In: syn.Bytes(), Verdict: pktest.TCActOK, Out: syn.WithDst(first).Bytes()}}})
	f.sync(t, state(service{name: "web", clusterIP: "10.96.0.10", port: 80, proto: model.TCP, nodePort: npWebLocal,
		endpoints: []string{at(second, thisNode)}, terminating: []string{at(first, thisNode)}}))
	reset, resetOK := f.counted(bpfobj.TcLbMetricLB_M_TC_RESET, 0)
	f.run(t, []row{
		{Case: pktest.Case{Name: "established connection stays on the terminating endpoint", In: ack.Bytes(), Verdict: pktest.TCActOK, Out: ack.WithDst(first).Bytes(), Setup: reset, Check: resetOK}},
		{Case: pktest.Case{Name: "new connection goes to the ready endpoint", In: other.Bytes(), Verdict: pktest.TCActOK, Out: other.WithDst(second).Bytes()}},
		{Case: pktest.Case{Name: "a new SYN on the old tuple selects again", In: syn.Bytes(), Verdict: pktest.TCActOK, Out: syn.WithDst(second).Bytes()}},
	})
}

// TestAffinityForExternalClients: with ClientIP affinity every connection
// of one client address goes to the backend it got first.
func TestAffinityForExternalClients(t *testing.T) {
	f := newFixture(t, loadOptions{})
	var eps []string
	for i := range 8 {
		eps = append(eps, at(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, byte(30 + i)}), 8080), thisNode))
	}
	f.sync(t, state(service{name: "sticky", clusterIP: "10.96.0.30", port: 80, proto: model.TCP, nodePort: npWebLocal, affinity: true, endpoints: eps}))
	f.sameBackend(t, 20, func(i int) []byte {
		return fromOutside(pktest.TCP(netip.AddrPortFrom(client.Addr(), 40000+uint16(i)), np(npWebLocal), pktest.SYN)).Bytes()
	})
}

// sameBackend sends the first segments of n connections, conn(i) the
// i-th (one client, source ports that differ), and checks that they all
// reach one backend on this node.
func (f *fixture) sameBackend(t *testing.T, n int, conn func(i int) []byte) {
	t.Helper()
	var backend netip.Addr
	for i := range n {
		b := f.localBackend(t, conn(i))
		if i == 0 {
			backend = b
		} else if b != backend {
			t.Fatalf("connection %d went to %s, the first to %s", i, b, backend)
		}
	}
}

// TestSourceRanges: loadBalancerSourceRanges admit only the clients inside
// them to the LoadBalancer IP; the Service's NodePort stays open to all, as
// in kube-proxy.
func TestSourceRanges(t *testing.T) {
	f := newFixture(t, loadOptions{})
	ranged := netip.MustParseAddrPort("198.19.0.30:80")
	f.sync(t, state(service{
		name: "ranged", clusterIP: "10.96.0.30", port: 80, proto: model.TCP, nodePort: 30018,
		lbIPs: []string{ranged.Addr().String()}, ranges: []string{"198.18.0.10/32", "203.0.113.0/24"},
		endpoints: []string{at(localWeb, thisNode)},
	}))
	inside := fromOutside(pktest.TCP(client, ranged, pktest.SYN))
	other := fromOutside(pktest.TCP(netip.MustParseAddrPort("203.0.113.77:40000"), ranged, pktest.SYN))
	outside := fromOutside(pktest.TCP(client2, ranged, pktest.SYN))
	viaNodePort := fromOutside(pktest.TCP(client2, np(30018), pktest.SYN))
	blocked, blockedOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SOURCE_RANGE, 1)
	f.run(t, []row{
		{Case: pktest.Case{Name: "client inside a /32 range", In: inside.Bytes(), Verdict: pktest.TCActOK, Out: inside.WithDst(localWeb).Bytes()}},
		{Case: pktest.Case{Name: "client inside a /24 range", In: other.Bytes(), Verdict: pktest.TCActOK, Out: other.WithDst(localWeb).Bytes()}},
		{Case: pktest.Case{Name: "client outside the ranges: dropped and counted", In: outside.Bytes(), Verdict: pktest.TCActShot, Setup: blocked, Check: blockedOK}},
		{Case: pktest.Case{Name: "the same client through the NodePort", In: viaNodePort.Bytes(), Verdict: pktest.TCActOK, Out: viaNodePort.WithDst(localWeb).Bytes()}},
	})
}

// TestMasqueradeToLocalBackends: with the pod device among the programs'
// devices, externalTrafficPolicy=Cluster traffic to an endpoint on the node
// is masqueraded to the pod gateway address, as kube-proxy does, and the
// reply is caught on the pod device; policy Local keeps the client.
func TestMasqueradeToLocalBackends(t *testing.T) {
	f := newFixture(t, loadOptions{podDevice: true})
	f.sync(t, fixtureState())
	gw := netip.AddrPortFrom(podGateway.Addr(), snatPort)
	syn := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN))
	toPod := func(b pktest.Builder) pktest.Builder { return b.WithMACs(podDevMAC, podMAC) }
	fromPod := func(b pktest.Builder) pktest.Builder { return b.WithMACs(podMAC, podDevMAC) }
	etpLocal := fromOutside(pktest.TCP(client, np(npETPLocal), pktest.SYN))
	f.run(t, []row{
		{Case: pktest.Case{
			Name: "policy Cluster, local backend: SNAT to the pod gateway, sent to the pod", In: syn.Bytes(),
			Verdict: pktest.TCActRedirect, Out: toPod(syn.WithSrc(gw).WithDst(localWeb).WithTTL(63)).Bytes(),
		}},
		{onPodDevice: true, Case: pktest.Case{
			Name:    "the pod's reply at the pod device: back to the client from the NodePort",
			In:      fromPod(pktest.TCP(localWeb, gw, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toRouter(pktest.TCP(np(npWebLocal), client, pktest.SYN|pktest.ACK).WithTTL(63)).Bytes(),
		}},
		{Case: pktest.Case{
			Name: "policy Local: the client address is kept", In: etpLocal.Bytes(),
			Verdict: pktest.TCActOK, Out: etpLocal.WithDst(etpLocalEP).Bytes(),
		}},
	})
}

// TestANewConnectionReusingAFlowsTupleIsNotTranslated: a client that reached
// a local backend through a NodePort and then connects to the backend
// directly from the same port (a pod on another node through the ClusterIP,
// translated by its own node's socket hooks) gets the backend's answers as
// they are, not rewritten to come from the NodePort.
func TestANewConnectionReusingAFlowsTupleIsNotTranslated(t *testing.T) {
	f := newFixture(t, loadOptions{})
	f.sync(t, fixtureState())
	viaNodePort := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN))
	direct := fromOutside(pktest.TCP(client, localWeb, pktest.SYN))
	synAck := toRouter(pktest.TCP(localWeb, client, pktest.SYN|pktest.ACK))
	before, after := f.counted(bpfobj.TcLbMetricLB_M_TC_STALE_REPLY, 1)
	f.run(t, []row{
		{Case: pktest.Case{Name: "through the NodePort", In: viaNodePort.Bytes(), Verdict: pktest.TCActOK, Out: viaNodePort.WithDst(localWeb).Bytes()}},
		{Case: pktest.Case{Name: "its answer comes from the NodePort", In: synAck.Bytes(), Verdict: pktest.TCActOK, Out: synAck.WithSrc(np(npWebLocal)).Bytes()}, egress: true},
		{Case: pktest.Case{Name: "a new connection straight to the backend from the same port", In: direct.Bytes(), Verdict: pktest.TCActUnspec, Setup: before, Check: after}},
		{Case: pktest.Case{Name: "its answer is left alone", In: synAck.Bytes(), Verdict: pktest.TCActUnspec}, egress: true},
	})
}
