package tcpkt_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// The source NAT port pool (bpf/lib/ct.h): a TCP flow's port is free again
// as soon as the flow has closed (an RST, or both FINs and the final ACK),
// as conntrack lets kube-proxy reuse a NAT tuple in TIME_WAIT or CLOSE; a
// late packet of the closed flow never reaches the client that took the
// port over. The fixture has one source NAT port, so a second client's SYN
// shows whether the port is free.

// stepKind is what a packet of a close sequence should meet.
type stepKind int

const (
	// sent: translated and sent on (TC: redirect, XDP: TX).
	sent stepKind = iota
	// dropped: a new flow without a free port (TC: shot, XDP: drop).
	dropped
	// late: a backend's packet of an older connection, handed to the
	// node's stack untranslated (XDP passes it and TC does).
	late
	// strayDropped: a client's segment without SYN of no tracked flow,
	// which XDP passes to TC (the kernel's conntrack may know it, see
	// bpf/lib/nfct.h; here it does not), and TC drops as dropped.
	strayDropped
)

// step is one packet of a sequence: in arrives at n0, and when sent, out
// leaves it.
type step struct {
	name    string
	kind    stepKind
	in, out xpkt
	setup   func(testing.TB)
	check   func(testing.TB, pktest.Result)
}

// seq builds the packets of TCP flows between clients and the family's
// remoteWeb through the web-remote NodePort, with the fixture's only source
// NAT port.
type seq struct{ x *xfam }

// fromClient is c's segment to the NodePort, sent on to the backend from
// the source NAT port.
func (s seq) fromClient(name string, c netip.AddrPort, fl pktest.TCPFlags, kind stepKind) step {
	x := s.x
	return step{
		name: name, kind: kind,
		in:  x.tcp(c, x.np(npWebRemote), fl).fromOutside(),
		out: x.tcp(x.snatSrc(), x.remoteWeb, fl).forwarded().toNodeB(),
	}
}

// fromBackend is the backend's segment to the source NAT port, sent back to
// c from the NodePort.
func (s seq) fromBackend(name string, c netip.AddrPort, fl pktest.TCPFlags, kind stepKind) step {
	x := s.x
	return step{
		name: name, kind: kind,
		in:  x.tcp(x.remoteWeb, x.snatSrc(), fl).fromNodeB(),
		out: x.tcp(x.np(npWebRemote), c, fl).forwarded().toRouter(),
	}
}

// with adds a setup and check to s.
func (s step) with(setup func(testing.TB), check func(testing.TB, pktest.Result)) step {
	s.setup, s.check = setup, check
	return s
}

// rows turns steps into rows for tc_ingress, or for the XDP program when x
// is set (a late packet then runs through XDP and on through TC, as a
// passed frame does).
func (f *fixture) snatRows(x bool, steps []step) []xrow {
	var rows []xrow
	for _, s := range steps {
		c := pktest.Case{Name: s.name, In: s.in.Bytes(), Setup: s.setup, Check: s.check}
		switch s.kind {
		case sent:
			c.Out = s.out.Bytes()
			c.Verdict = pktest.TCActRedirect
			if x {
				c.Verdict = pktest.XDPTX
			}
		case dropped:
			c.Verdict = pktest.TCActShot
			if x {
				c.Verdict = pktest.XDPDrop
			}
		case late, strayDropped:
			c.Verdict = pktest.TCActUnspec
			if s.kind == strayDropped {
				c.Verdict = pktest.TCActShot
			}
			if x {
				rows = append(rows, xrow{Case: pktest.Case{Name: s.name + " (XDP passes it)", In: s.in.Bytes(), Verdict: pktest.XDPPass}})
				c.Name += " (TC)"
			}
		}
		rows = append(rows, xrow{Case: c, tc: !x || s.kind == late || s.kind == strayDropped})
	}
	return rows
}

// runSteps runs steps through tc_ingress, or through XDP when x is set.
func (f *fixture) runSteps(t *testing.T, x *bpfobj.XdpObjects, steps []step) {
	t.Helper()
	for _, r := range f.snatRows(x != nil, steps) {
		c := r.Case
		c.Do = f.ns.Do
		prog := f.objs.TcIngress
		if r.tc {
			c.SKB = &pktest.SKBContext{Ifindex: f.ifindex}
		} else {
			prog = x.XdpNodeport
			c.XDP = &pktest.XDPContext{IngressIfindex: f.ifindex}
		}
		t.Run(c.Name, func(t *testing.T) { pktest.RunCase(t, prog, c) })
	}
}

// closeSequences are the tables of TestSNATPortReuse for x's family: each
// starts with no tracked flow.
func (x *xfam) closeSequences() map[string][]step {
	f, s := x.f, seq{x}
	client, client2 := x.client, x.client2
	const (
		syn    = pktest.SYN
		synAck = pktest.SYN | pktest.ACK
		ack    = pktest.ACK
		finAck = pktest.FIN | pktest.ACK
		rstAck = pktest.RST | pktest.ACK
	)
	reused, reusedOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_REUSED, 1)
	noPort, noPortOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_NO_PORT, 1)
	late1, late1OK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_LATE, 1)
	late2, late2OK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_LATE, 1)
	notReused, notReusedOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_REUSED, 0)
	return map[string][]step{
		"client closes first": {
			s.fromClient("a client's SYN takes the only source NAT port", client, syn, sent),
			s.fromClient("a second client finds no free port", client2, syn, dropped).with(noPort, noPortOK),
			s.fromBackend("the backend's SYN-ACK", client, synAck, sent),
			s.fromClient("the client's request", client, ack, sent),
			s.fromClient("the client's FIN", client, finAck, sent),
			s.fromClient("half-closed (one FIN): the port is still the flow's", client2, syn, dropped),
			s.fromBackend("the backend's ACK of the FIN", client, ack, sent),
			s.fromBackend("the backend's FIN", client, finAck, sent),
			s.fromClient("LAST_ACK (both FINs, no final ACK): the port is still the flow's", client2, syn, dropped),
			s.fromBackend("an ACK from the side that closed second", client, ack, sent),
			s.fromClient("it is not the final ACK: the port is still the flow's", client2, syn, dropped),
			s.fromClient("the client's final ACK", client, ack, sent),
			s.fromClient("a second client's SYN takes the closed flow's port", client2, syn, sent).with(reused, reusedOK),
			s.fromBackend("the backend's retransmitted FIN of the old flow does not reach the new client", client2, finAck, late).with(late1, late1OK),
			s.fromBackend("nor does the ACK a backend socket in TIME_WAIT answers the new SYN with", client2, ack, late).with(late2, late2OK),
			s.fromClient("the old client's retransmitted final ACK is not sent as the new client's", client, ack, strayDropped),
			s.fromBackend("the backend's SYN-ACK reaches the new client", client2, synAck, sent),
			s.fromClient("the new client's request", client2, ack, sent),
			s.fromBackend("the backend's answer", client2, ack, sent),
		},
		"backend closes first": {
			s.fromClient("a client's SYN takes the port", client, syn, sent),
			s.fromBackend("SYN-ACK", client, synAck, sent),
			s.fromClient("the client's ACK", client, ack, sent),
			s.fromBackend("the backend's FIN", client, finAck, sent),
			s.fromClient("the client's ACK of the FIN", client, ack, sent),
			s.fromClient("half-closed by the backend: the port is still the flow's", client2, syn, dropped),
			s.fromClient("the client's FIN", client, finAck, sent),
			s.fromClient("a client ACK is not the final one (the backend closed first)", client, ack, sent),
			s.fromClient("LAST_ACK: the port is still the flow's", client2, syn, dropped),
			s.fromBackend("the backend's final ACK", client, ack, sent),
			s.fromClient("a second client's SYN takes the port", client2, syn, sent).with(reused, reusedOK),
		},
		"backend resets": {
			s.fromClient("a client's SYN takes the port", client, syn, sent),
			s.fromBackend("SYN-ACK", client, synAck, sent),
			s.fromBackend("the backend's RST reaches the client", client, rstAck, sent),
			s.fromClient("a second client's SYN takes the port", client2, syn, sent).with(reused, reusedOK),
			s.fromBackend("the backend refusing the new connection: its RST reaches the new client", client2, rstAck, sent),
		},
		"client resets": {
			s.fromClient("a client's SYN takes the port", client, syn, sent),
			s.fromBackend("SYN-ACK", client, synAck, sent),
			s.fromClient("the client's RST", client, rstAck, sent),
			s.fromClient("a second client's SYN takes the port", client2, syn, sent).with(reused, reusedOK),
		},
		"the same client reconnects": {
			s.fromClient("a client's SYN takes the port", client, syn, sent),
			s.fromBackend("SYN-ACK", client, synAck, sent),
			s.fromClient("the client's SYN retransmitted across the SYN-ACK", client, syn, sent),
			s.fromBackend("the backend's data afterwards is the flow's, not late", client, ack, sent),
			s.fromClient("the client's FIN", client, finAck, sent),
			s.fromBackend("the backend's FIN", client, finAck, sent),
			s.fromClient("the client's final ACK", client, ack, sent),
			s.fromClient("a new connection from the same client port keeps the flow and its port", client, syn, sent).with(notReused, notReusedOK),
			s.fromClient("the new connection holds the port", client2, syn, dropped),
			s.fromBackend("its SYN-ACK", client, synAck, sent),
		},
	}
}

// TestSNATPortReuse runs the close sequences through tc_ingress and through
// the XDP program, which share the connection tracking code (nodeport.h),
// over IPv4 and IPv6.
func TestSNATPortReuse(t *testing.T) {
	for _, fam := range families {
		for _, hook := range []string{"tc", "xdp"} {
			t.Run(fam+"/"+hook, func(t *testing.T) {
				xf := newXFam(t, fam, loadOptions{})
				f := xf.f
				var x *bpfobj.XdpObjects
				if hook == "xdp" {
					x = f.loadXDP(t, f.ifindex)
				}
				xf.sync(t, xf.fixtureState())
				for name, steps := range xf.closeSequences() {
					t.Run(name, func(t *testing.T) {
						xf.resetCT(t)
						f.runSteps(t, x, steps)
					})
				}
			})
		}
	}
}

// monoNow is the programs' clock (bpf_ktime_get_ns, CLOCK_MONOTONIC) in
// seconds.
func monoNow(tb testing.TB) uint32 {
	tb.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		tb.Fatal(err)
	}
	return uint32(ts.Sec)
}

func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// ctKey is the connection tracking key of a packet from src to dst.
func ctKey(src, dst netip.AddrPort, proto uint8, reply bool) bpfobj.TcCt4Key {
	k := bpfobj.TcCt4Key{Saddr: be32(src.Addr()), Daddr: be32(dst.Addr()), Sport: htons(src.Port()), Dport: htons(dst.Port()), Proto: proto}
	if reply {
		k.Dir = 1
	}
	return k
}

// entry reads the entry of k.
func (f *fixture) entry(tb testing.TB, k bpfobj.TcCt4Key) bpfobj.TcCt4Entry {
	tb.Helper()
	var v bpfobj.TcCt4Entry
	if err := f.objs.Tc4CtV1.Lookup(&k, &v); err != nil {
		tb.Fatalf("flow entry %+v: %v", k, err)
	}
	return v
}

// editEntry changes the entry of k as edit says, to stand for time that
// has passed.
func (f *fixture) editEntry(tb testing.TB, k bpfobj.TcCt4Key, edit func(e *bpfobj.TcCt4Entry, now uint32)) {
	tb.Helper()
	v := f.entry(tb, k)
	edit(&v, monoNow(tb))
	if err := f.objs.Tc4CtV1.Put(&k, &v); err != nil {
		tb.Fatal(err)
	}
}

// lifetime checks that the entry of k lives want seconds from now (one
// second either way: the clock may tick between the program and the read).
func (f *fixture) lifetime(k bpfobj.TcCt4Key, want uint32) func(testing.TB, pktest.Result) {
	return func(tb testing.TB, _ pktest.Result) {
		tb.Helper()
		got := int64(f.entry(tb, k).Expires) - int64(monoNow(tb))
		if got < int64(want)-1 || got > int64(want)+1 {
			tb.Errorf("entry %+v lives %d s more, want %d", k, got, want)
		}
	}
}

// TestSNATUDPLifetimes: a source-NATed UDP flow holds its port 30 s until it
// is a stream (a reply, and still active 2 s after it began), then 120 s, as
// conntrack's nf_conntrack_udp_timeout and _stream; a flow only the backend
// keeps talking on stays the client's.
func TestSNATUDPLifetimes(t *testing.T) {
	f := newFixture(t, loadOptions{})
	f.sync(t, fixtureState())

	const udp = 17
	query := func(c netip.AddrPort, payload string) pktest.Builder {
		return fromOutside(pktest.UDP(c, np(npDNSRemote)).WithPayload([]byte(payload)))
	}
	sentQuery := func(payload string) []byte {
		return toNodeB(pktest.UDP(snatSrc, remoteDNS).WithPayload([]byte(payload)).WithTTL(63)).Bytes()
	}
	answer := fromNodeB(pktest.UDP(remoteDNS, snatSrc).WithPayload([]byte("answer")))
	answered := toRouter(pktest.UDP(np(npDNSRemote), client).WithPayload([]byte("answer")).WithTTL(63)).Bytes()
	replyKey := ctKey(remoteDNS, snatSrc, udp, true)
	origKey := ctKey(client, np(npDNSRemote), udp, false)
	both := func(a, b func(testing.TB, pktest.Result)) func(testing.TB, pktest.Result) {
		return func(tb testing.TB, r pktest.Result) { a(tb, r); b(tb, r) }
	}
	newFlow, noNewFlow := f.counted(bpfobj.TcLbMetricLB_M_TC_NEW_SNAT, 0)
	noPort, noPortOK := f.counted(bpfobj.TcLbMetricLB_M_TC_SNAT_NO_PORT, 1)
	f.run(t, []row{
		{Case: pktest.Case{
			Name: "a query: its flow lives 30 s", In: query(client, "q1").Bytes(),
			Verdict: pktest.TCActRedirect, Out: sentQuery("q1"),
			Check: both(f.lifetime(replyKey, 30), f.lifetime(origKey, 30)),
		}},
		{Case: pktest.Case{
			Name: "its answer within 2 s: still 30 s", In: answer.Bytes(),
			Verdict: pktest.TCActRedirect, Out: answered, Check: f.lifetime(replyKey, 30),
		}},
		{Case: pktest.Case{
			Name: "a reply 3 s after the flow began: a stream, 120 s", In: answer.Bytes(),
			Verdict: pktest.TCActRedirect, Out: answered,
			Setup: func(tb testing.TB) {
				f.editEntry(tb, replyKey, func(e *bpfobj.TcCt4Entry, now uint32) { e.Born = uint16(now - 3) })
			},
			Check: f.lifetime(replyKey, 120),
		}},
		{Case: pktest.Case{
			Name: "the stream's client entry expired while the backend kept talking: the client's next datagram is still the flow's",
			In:   query(client, "q2").Bytes(), Verdict: pktest.TCActRedirect, Out: sentQuery("q2"),
			Setup: func(tb testing.TB) {
				newFlow(tb)
				f.editEntry(tb, origKey, func(e *bpfobj.TcCt4Entry, now uint32) { e.Expires = now - 1 })
			},
			Check: both(noNewFlow, f.lifetime(replyKey, 120)),
		}},
	})
	f.resetCT(t)
	f.run(t, []row{
		{Case: pktest.Case{
			Name: "a query nobody answers: 30 s", In: query(client, "q").Bytes(),
			Verdict: pktest.TCActRedirect, Out: sentQuery("q"), Check: f.lifetime(replyKey, 30),
		}},
		{Case: pktest.Case{
			Name: "another client's query while it holds the port: no free port", In: query(client2, "q").Bytes(),
			Verdict: pktest.TCActShot, Setup: noPort, Check: noPortOK,
		}},
		{Case: pktest.Case{
			Name: "30 s later the port is free again", In: query(client2, "q").Bytes(),
			Verdict: pktest.TCActRedirect, Out: sentQuery("q"),
			Setup: func(tb testing.TB) {
				f.editEntry(tb, replyKey, func(e *bpfobj.TcCt4Entry, now uint32) { e.Expires = now - 1 })
			},
		}},
	})
}

// TestAHandshakeLeavesTheEstablishedLifetime: the three packets of a TCP
// handshake, in one second, leave the flow's entries with the lifetime of
// an established connection (a day, as conntrack's
// nf_conntrack_tcp_timeout_established), not a SYN's 60 s, also when the
// flow's later packets of that second skip the checks (np_orig_fresh): a
// connection that idles as soon as it is open lives on. Source-NATed
// flows through tc_ingress and XDP, and flows to a local backend through
// tc_ingress (XDP hands those to TC; their reply entry, which the backend's
// packets refresh at egress, holds as long as the LRU keeps it), both
// families.
func TestAHandshakeLeavesTheEstablishedLifetime(t *testing.T) {
	const established = 86400
	for _, fam := range families {
		for _, hook := range []string{"tc", "xdp"} {
			t.Run(fam+"/"+hook+"/source NAT", func(t *testing.T) {
				runFixtureSteps(t, fam, hook, func(xf *xfam, s seq) []step {
					return []step{
						s.fromClient("SYN", xf.client, pktest.SYN, sent),
						s.fromBackend("SYN-ACK", xf.client, pktest.SYN|pktest.ACK, sent),
						s.fromClient("ACK", xf.client, pktest.ACK, sent).with(nil, xf.liveFor(2, established, false)),
						s.fromClient("data", xf.client, pktest.ACK|pktest.PSH, sent).with(nil, xf.liveFor(2, established, false)),
					}
				})
			})
		}
		t.Run(fam+"/tc/local backend", func(t *testing.T) {
			xf := newXFam(t, fam, loadOptions{})
			xf.sync(t, xf.fixtureState())
			in := func(fl pktest.TCPFlags) []byte {
				return xf.tcp(xf.client, xf.np(npWebLocal), fl).fromOutside().Bytes()
			}
			out := func(fl pktest.TCPFlags) []byte {
				return xf.tcp(xf.client, xf.localWeb, fl).fromOutside().Bytes()
			}
			for _, c := range []pktest.Case{
				{Name: "SYN", In: in(pktest.SYN), Verdict: pktest.TCActOK, Out: out(pktest.SYN)},
				{Name: "ACK", In: in(pktest.ACK), Verdict: pktest.TCActOK, Out: out(pktest.ACK), Check: xf.liveFor(1, established, true)},
				{Name: "data", In: in(pktest.ACK | pktest.PSH), Verdict: pktest.TCActOK, Out: out(pktest.ACK | pktest.PSH),
					Check: xf.liveFor(1, established, true)},
			} {
				c.Do, c.SKB = xf.f.ns.Do, &pktest.SKBContext{Ifindex: xf.f.ifindex}
				t.Run(c.Name, func(t *testing.T) { pktest.RunCase(t, xf.f.objs.TcIngress, c) })
			}
		})
	}
}

// TestARetransmittedSynAckKeepsTheEstablishedLifetime: the backend's SYN-ACK
// sent again after the client's ACK (the ACK was lost or crossed it) does
// not cut an open flow's entries back to a SYN's 60 s, as conntrack ignores
// a SYN-ACK on an established connection; the client's packets of that
// second, which skip the refresh, would otherwise leave the reply entry to
// expire a minute into an idle connection while its port looks free.
func TestARetransmittedSynAckKeepsTheEstablishedLifetime(t *testing.T) {
	const established = 86400
	for _, fam := range families {
		for _, hook := range []string{"tc", "xdp"} {
			t.Run(fam+"/"+hook, func(t *testing.T) {
				runFixtureSteps(t, fam, hook, func(xf *xfam, s seq) []step {
					return []step{
						s.fromClient("SYN", xf.client, pktest.SYN, sent),
						s.fromBackend("SYN-ACK", xf.client, pktest.SYN|pktest.ACK, sent),
						s.fromClient("ACK", xf.client, pktest.ACK, sent),
						s.fromBackend("SYN-ACK again", xf.client, pktest.SYN|pktest.ACK, sent).with(nil, xf.liveFor(2, established, false)),
						s.fromClient("data", xf.client, pktest.ACK|pktest.PSH, sent).with(nil, xf.liveFor(2, established, false)),
					}
				})
			})
		}
	}
}

// runFixtureSteps runs the steps that steps makes, on a fresh fixture of
// family fam with its Services synced, through tc_ingress (hook "tc") or
// the XDP program ("xdp").
func runFixtureSteps(t *testing.T, fam, hook string, steps func(xf *xfam, s seq) []step) {
	t.Helper()
	xf := newXFam(t, fam, loadOptions{})
	var x *bpfobj.XdpObjects
	if hook == "xdp" {
		x = xf.f.loadXDP(t, xf.f.ifindex)
	}
	xf.sync(t, xf.fixtureState())
	xf.f.runSteps(t, x, steps(xf, seq{xf}))
}

// liveFor checks that the family's connection tracking holds n entries
// (with clientSide, n of the clients' direction), each living want seconds
// from now (one second either way: the clock may tick between the program
// and the read).
func (x *xfam) liveFor(n int, want int64, clientSide bool) func(testing.TB, pktest.Result) {
	return func(tb testing.TB, _ pktest.Result) {
		tb.Helper()
		var expires []uint32
		if x.v6 {
			var k bpfobj.TcCt6Key
			var v bpfobj.TcCt6Entry
			for it := x.f.objs.Tc6CtV1.Iterate(); it.Next(&k, &v); {
				if !clientSide || k.Dir == 0 {
					expires = append(expires, v.Expires)
				}
			}
		} else {
			var k bpfobj.TcCt4Key
			var v bpfobj.TcCt4Entry
			for it := x.f.objs.Tc4CtV1.Iterate(); it.Next(&k, &v); {
				if !clientSide || k.Dir == 0 {
					expires = append(expires, v.Expires)
				}
			}
		}
		if len(expires) != n {
			tb.Fatalf("%d tracked entries, want %d", len(expires), n)
		}
		now := int64(monoNow(tb))
		for _, e := range expires {
			if got := int64(e) - now; got < want-1 || got > want+1 {
				tb.Errorf("an entry lives %d s more, want %d", got, want)
			}
		}
	}
}
