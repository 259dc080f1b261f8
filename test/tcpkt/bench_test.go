package tcpkt_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/pktest"
)

// BenchmarkPaths reports the kernel's ns per packet for each path of the TC
// programs (pktest.BenchWith: repeated runs where the packet comes out
// unchanged, single runs on fresh copies where it is rewritten). "new flow"
// paths forget the flow before every run, outside the timed part; the
// others run against a flow set up once.
func BenchmarkPaths(b *testing.B) {
	f := newFixture(b, loadOptions{snatMin: 61000, snatMax: 65535})
	f.sync(b, fixtureState())
	reset := func() error {
		f.resetCT(b)
		return nil
	}
	synLocal := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN)).Bytes()
	synRemote := fromOutside(pktest.TCP(client, np(npWebRemote), pktest.SYN)).Bytes()
	ackLocal := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.ACK)).Bytes()
	ackRemote := fromOutside(pktest.TCP(client, np(npWebRemote), pktest.ACK)).Bytes()
	benchPaths(b, f, f.resetCT, []benchPath{
		{name: "ingress/not a frontend", frame: fromOutside(pktest.TCP(client, np(22), pktest.ACK)).Bytes()},
		{name: "ingress/not IPv4", frame: pktest.ARPRequest(clientMAC, routerAddr, nodeAddr)},
		{name: "egress/not a reply", frame: toRouter(pktest.TCP(np(22), client, pktest.ACK)).Bytes()},
		{name: "ingress/new flow, local backend", frame: synLocal, beforeRun: reset},
		{name: "ingress/new flow, remote backend (SNAT)", frame: synRemote, beforeRun: reset},
		{name: "ingress/tracked flow, local backend", frame: ackLocal, prime: [][]byte{synLocal}},
		{name: "ingress/tracked flow, remote backend (SNAT)", frame: ackRemote, prime: [][]byte{synRemote}},
		{name: "egress/reply from a local backend", egress: true, frame: toRouter(pktest.TCP(localWeb, client, pktest.ACK)).Bytes(), prime: [][]byte{synLocal}},
		{name: "ingress/no endpoints: ICMP unreachable", frame: fromOutside(pktest.TCP(client, np(npNoEPs), pktest.SYN)).Bytes()},
		{name: "ingress/policy Local, none here: drop", frame: fromOutside(pktest.TCP(client, np(npElsewhere), pktest.SYN)).Bytes()},
	})
	// The reply of a source-NATed flow needs the port the flow got.
	b.Run("ingress/reply from a remote backend (SNAT)", func(b *testing.B) {
		f.resetCT(b)
		res, err := pktest.Exec(f.objs.TcIngress, pktest.Case{In: synRemote, Do: f.ns.Do})
		if err != nil {
			b.Fatal(err)
		}
		out := pktest.Decode(res.Out)
		if out.TCP == nil {
			b.Fatalf("no translated SYN: %s", out)
		}
		reply := fromNodeB(pktest.TCP(remoteWeb, netip.AddrPortFrom(nodeAddr, out.TCP.Src), pktest.ACK)).Bytes()
		pktest.BenchWith(b, f.objs.TcIngress, reply, pktest.BenchOptions{Do: f.ns.Do})
	})
}

// BenchmarkXDPPaths is BenchmarkPaths for the XDP program, next to which it
// reports. The kernel's benchmark runs give the frame the loopback device
// as its ingress device, so translated frames are redirected to n0 rather
// than sent back out (XDP_TX): the same work but for the verdict.
func BenchmarkXDPPaths(b *testing.B) {
	f := newFixture(b, loadOptions{snatMin: 61000, snatMax: 65535})
	x := f.loadXDP(b, f.ifindex)
	f.sync(b, fixtureState())
	reset := func() error {
		f.resetCT(b)
		return nil
	}
	synLocal := fromOutside(pktest.TCP(client, np(npWebLocal), pktest.SYN)).Bytes()
	synRemote := fromOutside(pktest.TCP(client, np(npWebRemote), pktest.SYN)).Bytes()
	ackRemote := fromOutside(pktest.TCP(client, np(npWebRemote), pktest.ACK)).Bytes()
	paths := []struct {
		name      string
		frame     []byte
		prime     [][]byte
		beforeRun func() error
	}{
		{name: "xdp/not a frontend", frame: fromOutside(pktest.TCP(client, np(22), pktest.ACK)).Bytes()},
		{name: "xdp/not IPv4", frame: pktest.ARPRequest(clientMAC, routerAddr, nodeAddr)},
		{name: "xdp/new flow, local backend: pass", frame: synLocal, beforeRun: reset},
		{name: "xdp/new flow, remote backend (SNAT)", frame: synRemote, beforeRun: reset},
		{name: "xdp/tracked flow, remote backend (SNAT)", frame: ackRemote, prime: [][]byte{synRemote}},
		{name: "xdp/policy Local, none here: drop", frame: fromOutside(pktest.TCP(client, np(npElsewhere), pktest.SYN)).Bytes()},
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			f.resetCT(b)
			for _, fr := range p.prime {
				if _, err := pktest.Exec(x.XdpNodeport, pktest.Case{In: fr, Do: f.ns.Do}); err != nil {
					b.Fatal(err)
				}
			}
			pktest.BenchWith(b, x.XdpNodeport, p.frame, pktest.BenchOptions{Do: f.ns.Do, BeforeRun: p.beforeRun})
		})
	}
	b.Run("xdp/reply from a remote backend (SNAT)", func(b *testing.B) {
		f.resetCT(b)
		res, err := pktest.Exec(x.XdpNodeport, pktest.Case{In: synRemote, Do: f.ns.Do})
		if err != nil {
			b.Fatal(err)
		}
		out := pktest.Decode(res.Out)
		if res.Verdict != pktest.XDPRedirect || out.TCP == nil {
			b.Fatalf("no translated SYN: %v %s", res.Verdict, out)
		}
		reply := fromNodeB(pktest.TCP(remoteWeb, netip.AddrPortFrom(nodeAddr, out.TCP.Src), pktest.ACK)).Bytes()
		pktest.BenchWith(b, x.XdpNodeport, reply, pktest.BenchOptions{Do: f.ns.Do})
	})
}

// BenchmarkPathsIPv6 is BenchmarkPaths over IPv6, in the same run: the
// same paths through the IPv6 side of the TC programs (target: within
// 1.25x of the IPv4 path's ns per packet).
func BenchmarkPathsIPv6(b *testing.B) {
	f := newFixture6(b)
	f.sync6(b, fixtureState6())
	reset := func() error {
		f.resetCT6(b)
		return nil
	}
	synLocal := fromOutside6(pktest.TCP6(client6, np6(npWebLocal), pktest.SYN)).Bytes()
	synRemote := fromOutside6(pktest.TCP6(client6, np6(npWebRemote), pktest.SYN)).Bytes()
	ackLocal := fromOutside6(pktest.TCP6(client6, np6(npWebLocal), pktest.ACK)).Bytes()
	ackRemote := fromOutside6(pktest.TCP6(client6, np6(npWebRemote), pktest.ACK)).Bytes()
	benchPaths(b, f.fixture, f.resetCT6, []benchPath{
		{name: "ingress/not a frontend", frame: fromOutside6(pktest.TCP6(client6, np6(22), pktest.ACK)).Bytes()},
		{name: "egress/not a reply", frame: toRouter6(pktest.TCP6(np6(22), client6, pktest.ACK)).Bytes()},
		{name: "ingress/new flow, local backend", frame: synLocal, beforeRun: reset},
		{name: "ingress/new flow, remote backend (SNAT)", frame: synRemote, beforeRun: reset},
		{name: "ingress/tracked flow, local backend", frame: ackLocal, prime: [][]byte{synLocal}},
		{name: "ingress/tracked flow, remote backend (SNAT)", frame: ackRemote, prime: [][]byte{synRemote}},
		{name: "egress/reply from a local backend", egress: true, frame: toRouter6(pktest.TCP6(localWeb6, client6, pktest.ACK)).Bytes(), prime: [][]byte{synLocal}},
		{name: "ingress/no endpoints: ICMPv6 unreachable", frame: fromOutside6(pktest.TCP6(client6, np6(npNoEPs), pktest.SYN)).Bytes()},
		{name: "ingress/policy Local, none here: drop", frame: fromOutside6(pktest.TCP6(client6, np6(npElsewhere), pktest.SYN)).Bytes()},
	})
}

// benchPath is one path of the TC programs to time.
type benchPath struct {
	name   string
	egress bool
	frame  []byte
	// prime are frames sent first so that a flow exists.
	prime     [][]byte
	beforeRun func() error
}

// benchPaths times each path through f's programs, with the flows
// forgotten (reset) before each.
func benchPaths(b *testing.B, f *fixture, reset func(testing.TB), paths []benchPath) {
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			reset(b)
			prog := f.objs.TcIngress
			if p.egress {
				prog = f.objs.TcEgress
			}
			for _, fr := range p.prime {
				if _, err := pktest.Exec(f.objs.TcIngress, pktest.Case{In: fr, Do: f.ns.Do}); err != nil {
					b.Fatal(err)
				}
			}
			pktest.BenchWith(b, prog, p.frame, pktest.BenchOptions{Do: f.ns.Do, BeforeRun: p.beforeRun})
		})
	}
}
