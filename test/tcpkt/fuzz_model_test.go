package tcpkt_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// The reference model of the packet fuzzer (TestPacketFuzz): what each TC
// and XDP program must do with any frame, given the fuzz world's Services
// and its established flows. It is written from the programs' documented
// contract (bpf/tc.c, bpf/xdp.c, bpf/lib/nodeport.h and parse.h, in words)
// and kube-proxy's semantics, not from their code: it parses frames itself,
// decides from the model's endpoint selection (model.Service.External), and
// says what comes out as a tuple, not as the checksum arithmetic of the C.

// prog names one program under test.
type prog int

const (
	progTCIngress prog = iota
	progTCEgress
	progXDP
	progXDPSKB
	numProgs
)

func (p prog) String() string {
	return [...]string{"tc_ingress", "tc_egress", "xdp_nodeport", "xdp_nodeport_skb"}[p]
}

func (p prog) xdp() bool { return p == progXDP || p == progXDPSKB }

// view is what the model reads from a frame: the IP and TCP/UDP fields the
// programs act on, and whether the frame is one they may act on at all.
type view struct {
	v6 bool
	// l4 says the frame holds a whole TCP or UDP header in a packet that
	// is not truncated; icmp an ICMP (ICMPv6) message that is not a
	// fragment. Anything else the programs must pass untouched.
	l4, icmp bool
	// frag is an IPv4 fragment (first or not); ports are 0 in a non-first
	// one.
	frag         bool
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
	flags        pktest.TCPFlags
	ttl, tos     uint8
	// ihl is the IP header length (40 for IPv6), l3len the IP packet's
	// length by its header (tot_len, or 40 + payload length).
	ihl, l3len int
}

func (v view) l4off() int { return pktest.MinFrameLen + v.ihl }

func (v view) srcAP() netip.AddrPort { return netip.AddrPortFrom(v.src, v.sport) }
func (v view) dstAP() netip.AddrPort { return netip.AddrPortFrom(v.dst, v.dport) }

// parseFrame reads frame as a TC program (xdp false: the whole frame, any
// IPv4 header length, fragments, ICMP) or the XDP program (a 20-byte IPv4
// header, no fragment, TCP or UDP only) may act on it.
func parseFrame(frame []byte, xdp bool) view {
	var v view
	if len(frame) < pktest.MinFrameLen {
		return v
	}
	ip := frame[pktest.MinFrameLen:]
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case pktest.EtherTypeIPv4:
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return v
		}
		v.ihl = int(ip[0]&0x0f) * 4
		v.l3len = int(binary.BigEndian.Uint16(ip[2:4]))
		if v.ihl < 20 || v.l3len < v.ihl || len(ip) < v.l3len {
			return v
		}
		frag := binary.BigEndian.Uint16(ip[6:8])
		v.frag = frag&0x3fff != 0
		nonFirst := frag&0x1fff != 0
		v.tos, v.ttl, v.proto = ip[1], ip[8], ip[9]
		v.src, v.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		if xdp && (v.ihl != 20 || v.frag) {
			return v
		}
		switch v.proto {
		case pktest.ProtoICMP:
			v.icmp = !xdp && !v.frag
			return v
		case pktest.ProtoTCP, pktest.ProtoUDP:
		default:
			return v
		}
		if nonFirst {
			v.l4 = true
			return v
		}
		return v.ports(ip[v.ihl:v.l3len])
	case pktest.EtherTypeIPv6:
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return v
		}
		v.v6, v.ihl = true, 40
		v.l3len = 40 + int(binary.BigEndian.Uint16(ip[4:6]))
		v.proto, v.ttl = ip[6], ip[7]
		v.tos = ip[0]<<4 | ip[1]>>4
		v.src, v.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		if len(ip) < v.l3len {
			return v
		}
		if v.proto == pktest.ProtoICMPv6 {
			v.icmp = !xdp && v.l3len >= 48
			return v
		}
		if v.proto != pktest.ProtoTCP && v.proto != pktest.ProtoUDP {
			return v
		}
		v = v.ports(ip[40:v.l3len])
		// IPv6 forbids UDP without checksum: such a datagram is the
		// receiver's to drop.
		if v.l4 && v.proto == pktest.ProtoUDP && binary.BigEndian.Uint16(ip[46:48]) == 0 {
			v.l4 = false
		}
	}
	return v
}

// ports reads the TCP or UDP header at the start of seg, the L4 part of the
// packet by its IP header.
func (v view) ports(seg []byte) view {
	need := 8
	if v.proto == pktest.ProtoTCP {
		need = 20
	}
	if len(seg) < need {
		return v
	}
	v.sport, v.dport = binary.BigEndian.Uint16(seg[0:2]), binary.BigEndian.Uint16(seg[2:4])
	if v.proto == pktest.ProtoTCP {
		v.flags = pktest.TCPFlags(seg[13])
	}
	v.l4 = true
	return v
}

// synOnly is a TCP segment that opens a connection: SYN without ACK.
func (v view) synOnly() bool {
	return v.proto == pktest.ProtoTCP && v.flags&(pktest.SYN|pktest.ACK) == pktest.SYN
}

// kind is what a program must do with a frame.
type kind int

const (
	// pass: the program's pass verdict, the frame untouched.
	pass kind = iota
	// drop: the program's drop verdict.
	drop
	// xlate: the addresses and ports rewritten, the checksums following,
	// and, when fwd, the TTL (hop limit) decremented and the frame
	// addressed to the next hop.
	xlate
	// unreach: an ICMP (ICMPv6) port unreachable from the destination back
	// to the source, quoting the packet.
	unreach
	// reset: a TCP reset from the destination back to the source.
	reset
)

func (k kind) String() string {
	return [...]string{"pass untouched", "drop", "translate", "ICMP port unreachable", "TCP reset"}[k]
}

// outcome is the model's prediction for one frame and program.
type outcome struct {
	kind kind
	// verdict is the expected return value of xlate, unreach and reset.
	verdict pktest.Verdict
	// The translation: the source becomes src (or, with snat, the address
	// snat and any source NAT port not in busy) and the destination one of
	// dsts; with fwd the frame goes out of n0 to the next hop (its link
	// addresses: fuzzWorld.toward), one hop fewer.
	src  netip.AddrPort
	snat netip.Addr
	busy []uint16
	dsts []netip.AddrPort
	fwd  bool
	// sticky, when set, is where the choice among dsts is kept: the same
	// key must get the same backend (session affinity, Maglev).
	sticky string
	// ctChanges says the program may leave connection tracking entries
	// behind though it passes or drops the frame (a flow recorded before
	// the next hop turned out unreachable, a stale entry forgotten).
	ctChanges bool
	// why says which rule of the model decided, for failure reports.
	why string
	// svc is the Service a new flow goes to: its first packet must leave
	// the flow recorded when it is translated.
	svc string
	// inner is the packet an ICMP error quotes, and innerSrc and innerDst
	// what its source and destination become, when the error is
	// translated (src and dsts[0] are then the outer addresses, ports 0).
	inner              *quoted
	innerSrc, innerDst netip.AddrPort
}

// fuzzFrontend is one external frontend of the fuzz world.
type fuzzFrontend struct {
	svc    string
	action model.Action
	// backends are the endpoints external clients may get.
	backends []fuzzBackend
	etpLocal bool
	// ranges, when set, are the only clients admitted (a LoadBalancer IP
	// with loadBalancerSourceRanges).
	ranges   []netip.Prefix
	affinity bool
	maglev   bool
}

type fuzzBackend struct {
	ap    netip.AddrPort
	local bool
}

// feKey is a frontend's address, port and protocol.
type feKey struct {
	ap    netip.AddrPort
	proto uint8
}

// trackedFlow is an established flow of the fuzz world (set up before the
// fuzzing, restored after each frame).
type trackedFlow struct {
	client, frontend, backend netip.AddrPort
	proto                     uint8
	// snat is the source the backend sees (zero: the client's). Its
	// address is the client's when only the port changed: the flow's
	// reply tuple was another flow's (portOnly).
	snat netip.AddrPort
	// gone: the backend was removed from its Service since.
	gone bool
}

// portOnly says f's source NAT kept the client's address: a second flow
// from the client's port to the same backend. Its replies are translated
// at egress, as a local backend's are, or at ingress, as a source-NATed
// flow's are.
func (f trackedFlow) portOnly() bool { return f.snat.IsValid() && f.snat.Addr() == f.client.Addr() }

// replyTuple is the tuple of f's backend's replies, source and destination.
func (f trackedFlow) replyTuple() (netip.AddrPort, netip.AddrPort) {
	if f.snat.IsValid() {
		return f.backend, f.snat
	}
	return f.backend, f.client
}

// fuzzWorld is everything the model knows: the frontends of both families,
// the tracked flows, the node's addresses and link neighbours, and what
// sticky selections it has seen.
type fuzzWorld struct {
	frontends map[feKey]*fuzzFrontend
	flows     []trackedFlow
	// snatAddr is the source NAT address of each family (n0's).
	snatAddr4, snatAddr6 netip.Addr
	snatMin, snatMax     uint16
	// remotePods route to node-b, localPods to p0; everything else to
	// the router.
	remotePods4, remotePods6 netip.Prefix
	localPods4, localPods6   netip.Prefix
	// seen holds sticky choices (outcome.sticky -> backend).
	seen map[string]netip.AddrPort
	// chosen counts the backends new flows were translated to, by
	// Service.
	chosen map[string]map[netip.AddrPort]int
	// missLog sums, by Service and backend, the log of the chance that
	// a free choice (a new flow that may go to any of several backends)
	// passed the backend over, had the program chosen uniformly: a
	// backend never chosen is an error only once that chance is tiny.
	missLog map[string]map[netip.AddrPort]float64
	// fromPod says the frame at hand arrives on p0, the pod device, rather
	// than on n0: what the node forwards still leaves through n0, which
	// the XDP program redirects it to.
	fromPod bool
}

// newFuzzWorld derives the frontends from st4 and st6 as kube-proxy serves
// them to external clients: NodePorts on the node's external addresses,
// ExternalIPs and LoadBalancer IPs, each with the external verdict.
func newFuzzWorld(sts ...*model.State) *fuzzWorld {
	w := &fuzzWorld{frontends: map[feKey]*fuzzFrontend{}, seen: map[string]netip.AddrPort{},
		chosen: map[string]map[netip.AddrPort]int{}, missLog: map[string]map[netip.AddrPort]float64{}}
	for _, st := range sts {
		for _, name := range model.SortedNames(st.Services) {
			svc := st.Services[name]
			sp := svc.Port
			action, eps := svc.External()
			fe := &fuzzFrontend{svc: name.String(), action: action, etpLocal: sp.ExternalPolicy == model.PolicyLocal,
				affinity: sp.AffinityTimeout != 0, maglev: sp.LBAlgorithm == model.LBMaglev}
			for _, e := range eps {
				fe.backends = append(fe.backends, fuzzBackend{ap: e.AddrPort(), local: e.NodeName == st.Node.Name})
			}
			add := func(addr netip.Addr, port uint16, f *fuzzFrontend) {
				if port != 0 {
					w.frontends[feKey{netip.AddrPortFrom(addr, port), uint8(name.Protocol)}] = f
				}
			}
			for _, a := range st.Node.NodePorts.External() {
				add(a, sp.NodePort, fe)
			}
			for _, a := range sp.ExternalIPs {
				add(a, sp.Port, fe)
			}
			for _, a := range sp.LoadBalancerIPs {
				lb := *fe
				lb.ranges = sp.LoadBalancerSourceRanges
				add(a, sp.Port, &lb)
			}
		}
	}
	return w
}

func (w *fuzzWorld) snatAddr(v6 bool) netip.Addr {
	if v6 {
		return w.snatAddr6
	}
	return w.snatAddr4
}

// toward is the next hop's link addresses for a packet the node forwards to
// dst out of n0.
func (w *fuzzWorld) toward(dst netip.Addr) (smac, dmac net.HardwareAddr) {
	if w.remotePods4.Contains(dst) || w.remotePods6.Contains(dst) {
		return deviceMAC, nodeBMAC
	}
	if w.localPods(dst) {
		return podDevMAC, podMAC
	}
	return deviceMAC, routerMAC
}

// localPods says dst is a pod of this node's, behind p0.
func (w *fuzzWorld) localPods(dst netip.Addr) bool {
	return w.localPods4.Contains(dst) || w.localPods6.Contains(dst)
}

// decide is the model: what program p may do with frame, one outcome per
// choice the program has (the backend of a new flow).
func (w *fuzzWorld) decide(p prog, frame []byte) (view, []outcome) {
	v := parseFrame(frame, p.xdp())
	one := func(o outcome) []outcome { return []outcome{o} }
	if v.icmp {
		return v, one(w.icmpError(p, frame, v))
	}
	if !v.l4 {
		return v, one(outcome{why: "not a whole TCP or UDP packet"})
	}
	if v.frag {
		// Ports are in the first fragment only: translating it alone
		// would split the datagram.
		return v, one(outcome{why: "IPv4 fragment"})
	}
	if p == progTCEgress {
		o := w.egress(v)
		o.ctChanges = o.kind == xlate
		return v, one(o)
	}
	// A packet of a tracked flow refreshes its entries, whatever becomes
	// of it.
	if f, ok := w.orig(v); ok {
		if o, decided := w.tracked(p, v, f, frame); decided {
			o.ctChanges = true
			return v, one(o)
		}
	} else if f, ok := w.reply(v); ok {
		o := w.fwdOutcome(p, v, outcome{kind: xlate, src: f.frontend, dsts: []netip.AddrPort{f.client}, fwd: true,
			why: "a backend's reply to a source NAT port: back to the client from the frontend"})
		o.ctChanges = true
		return v, one(o)
	}
	return v, w.newFlow(p, v)
}

// orig finds the tracked flow whose client sends v.
func (w *fuzzWorld) orig(v view) (trackedFlow, bool) {
	for _, f := range w.flows {
		if f.proto == v.proto && f.client == v.srcAP() && f.frontend == v.dstAP() {
			return f, true
		}
	}
	return trackedFlow{}, false
}

// reply finds the source-NATed tracked flow whose backend sends v.
func (w *fuzzWorld) reply(v view) (trackedFlow, bool) {
	for _, f := range w.flows {
		if f.proto == v.proto && f.snat.IsValid() && f.backend == v.srcAP() && f.snat == v.dstAP() {
			return f, true
		}
	}
	return trackedFlow{}, false
}

// tracked decides a client's packet of tracked flow f; decided is false
// when the packet starts a new flow instead.
func (w *fuzzWorld) tracked(p prog, v view, f trackedFlow, frame []byte) (o outcome, decided bool) {
	if f.gone {
		// A new connection (or a UDP datagram) selects again; a TCP
		// segment of the old one is answered with a reset, by TC.
		if v.proto == pktest.ProtoUDP || v.synOnly() {
			return outcome{}, false
		}
		if p.xdp() {
			return outcome{why: "segment of a flow whose backend is gone: TC resets it"}, true
		}
		return resetOutcome(v, frame), true
	}
	if !f.snat.IsValid() {
		if p.xdp() {
			return outcome{why: "flow to a local backend: TC's"}, true
		}
		return outcome{kind: xlate, verdict: pktest.TCActOK, src: v.srcAP(), dsts: []netip.AddrPort{f.backend},
			why: "tracked flow to a local backend: destination rewritten"}, true
	}
	return w.fwdOutcome(p, v, outcome{kind: xlate, src: f.snat, dsts: []netip.AddrPort{f.backend}, fwd: true,
		why: "tracked source-NATed flow: to its backend from its source NAT port"}), true
}

// egress decides a packet leaving the node: a local backend's reply to a
// flow without source NAT gets the frontend as its source, and one to a
// flow whose source NAT changed only the port gets its client's port back.
func (w *fuzzWorld) egress(v view) outcome {
	for _, f := range w.flows {
		if (!f.snat.IsValid() || f.portOnly()) && f.proto == v.proto {
			if from, to := f.replyTuple(); from == v.srcAP() && to == v.dstAP() {
				return outcome{kind: xlate, verdict: pktest.TCActOK, src: f.frontend, dsts: []netip.AddrPort{f.client},
					why: "a local backend's reply: source becomes the frontend"}
			}
		}
	}
	return outcome{why: "egress: not a reply of a tracked flow"}
}

// newFlow decides the first packet of a flow by its frontend's verdict.
func (w *fuzzWorld) newFlow(p prog, v view) []outcome {
	fe := w.frontends[feKey{v.dstAP(), v.proto}]
	var o outcome
	// A SYN forgets a stale reply entry of the turned-around tuple: the
	// fuzz world's reply entries of local flows are such.
	for _, f := range w.flows {
		if v.synOnly() && !f.snat.IsValid() && f.proto == v.proto && f.backend == v.dstAP() && f.client == v.srcAP() {
			o.ctChanges = true
		}
	}
	switch {
	case fe == nil:
		o.why = "not an external frontend"
		return []outcome{o}
	case p.xdp() && v.proto == pktest.ProtoTCP && v.flags&pktest.SYN == 0:
		o.why = "TCP segment without SYN of no tracked flow: TC's (the kernel's conntrack may know it)"
		return []outcome{o}
	case fe.action == model.Reject:
		if p.xdp() {
			o.why = "no endpoints: TC refuses"
			return []outcome{o}
		}
		o.kind, o.verdict, o.why = unreach, pktest.TCActRedirect, "no endpoints: port unreachable"
		return []outcome{o}
	case fe.action == model.Drop:
		o.kind, o.why = drop, "policy Local without a local endpoint"
		return []outcome{o}
	case fe.ranges != nil && !slices.ContainsFunc(fe.ranges, func(r netip.Prefix) bool { return r.Contains(v.src) }):
		o.kind, o.why = drop, "client outside the LoadBalancer source ranges"
		return []outcome{o}
	case p.xdp() && fe.etpLocal:
		o.why = "policy Local: TC's"
		return []outcome{o}
	}
	o.kind = xlate
	o.src = v.srcAP()
	var local, remote []netip.AddrPort
	for _, b := range fe.backends {
		if b.local {
			local = append(local, b.ap)
		} else {
			remote = append(remote, b.ap)
		}
	}
	o.dsts = append(slices.Clone(local), remote...)
	switch {
	case fe.affinity:
		o.sticky = fmt.Sprintf("affinity %s %s", fe.svc, v.src)
	case fe.maglev:
		o.sticky = fmt.Sprintf("maglev %s %s %s %d", fe.svc, v.srcAP(), v.dstAP(), v.proto)
	}
	if b, ok := w.seen[o.sticky]; ok && o.sticky != "" {
		o.dsts = []netip.AddrPort{b}
	}
	// Which backend the program chooses is its own (random, or by a
	// hash); the model says what each choice implies.
	o.why = "new flow to " + fe.svc
	o.svc = fe.svc
	var alts []outcome
	for _, b := range o.dsts {
		alts = append(alts, w.forBackend(p, v, o, b))
	}
	return alts
}

// forBackend completes a new flow's outcome o once the backend is known:
// a local one keeps the client's address (and is TC's), a remote one gets
// source NAT and is forwarded.
func (w *fuzzWorld) forBackend(p prog, v view, o outcome, backend netip.AddrPort) outcome {
	o.dsts = []netip.AddrPort{backend}
	local := false
	for _, f := range w.frontends {
		for _, b := range f.backends {
			if b.ap == backend && b.local {
				local = true
			}
		}
	}
	if local {
		if p.xdp() {
			o.kind, o.why = pass, o.why+": local backend, TC's"
			return o
		}
		// The client keeps its address, unless a live flow from its port
		// to another frontend has the backend's reply tuple: then it
		// gets another port, and the packet is sent to the backend.
		for _, f := range w.flows {
			if from, to := f.replyTuple(); f.proto == v.proto && from == backend && to == v.srcAP() {
				o.snat, o.fwd = v.src, true
				for _, g := range w.flows {
					if g.portOnly() && g.snat.Addr() == v.src && g.backend == backend && g.proto == v.proto {
						o.busy = append(o.busy, g.snat.Port())
					}
				}
				o.why += ": local backend whose reply tuple " + f.frontend.String() + "'s flow holds, another source port"
				return w.fwdOutcome(p, v, o)
			}
		}
		o.verdict = pktest.TCActOK
		o.why += ": local backend, destination rewritten"
		return o
	}
	// The source NAT address is that of the device toward the backend,
	// else that of the device the packet came in on: p0 has none.
	if notForwarded(v.src) && w.fromPod {
		return outcome{kind: drop, why: o.why + ": remote backend, no source NAT address for a source the FIB refuses"}
	}
	o.snat = w.snatAddr(v.v6)
	for _, f := range w.flows {
		if f.snat.IsValid() && f.backend == backend && f.proto == v.proto {
			o.busy = append(o.busy, f.snat.Port())
		}
	}
	o.fwd = true
	o.why += ": remote backend, DNAT and SNAT"
	return w.fwdOutcome(p, v, o)
}

// fwdOutcome completes o, a translation the node forwards: out of n0 to
// the next hop, one hop fewer. A packet that has no hop left is TC's to
// drop; XDP hands it to TC (having recorded a new flow).
func (w *fuzzWorld) fwdOutcome(p prog, v view, o outcome) outcome {
	if v.ttl <= 1 {
		if p.xdp() {
			return outcome{why: o.why + ": no hop left, TC's", ctChanges: true}
		}
		return outcome{kind: drop, why: o.why + ": no hop left", ctChanges: true}
	}
	// An ICMPv6 error that keeps such a sender's address is TC's to drop.
	src := o.src.Addr()
	if o.snat.IsValid() {
		src = o.snat
	}
	if notForwarded(src) {
		return outcome{kind: drop, why: o.why + ": IPv6 source not forwarded"}
	}
	o.verdict = pktest.TCActRedirect
	if p.xdp() {
		o.verdict = pktest.XDPTX
		// To a pod here: back out of p0 when it came in there, else
		// out of a device without the program, which is TC's.
		switch pod := w.localPods(o.dsts[0].Addr()); {
		case pod && !w.fromPod:
			return outcome{why: o.why + ": its next hop is out of p0, without XDP: TC's", ctChanges: o.svc != ""}
		case w.fromPod && !pod:
			o.verdict = pktest.XDPRedirect
		}
	}
	return o
}

// resetOutcome is the reset a client's TCP segment v (of frame) gets,
// unless it is a reset itself (never answered, RFC 793) or its header
// length is malformed: those are dropped. The flow ends either way.
func resetOutcome(v view, frame []byte) outcome {
	thlen := int(frame[v.l4off()+12]>>4) * 4
	switch {
	case v.flags&pktest.RST != 0:
		return outcome{kind: drop, ctChanges: true, why: "a reset on a flow whose backend is gone: the flow ends"}
	case thlen < 20 || v.ihl+thlen > v.l3len:
		return outcome{kind: drop, ctChanges: true, why: "malformed segment of a flow whose backend is gone"}
	}
	return outcome{kind: reset, verdict: pktest.TCActRedirect, ctChanges: true, why: "segment of a flow whose backend is gone: reset"}
}

// quoted is the packet an ICMP (ICMPv6) error quotes, as far as the
// programs read it: its IP header and at least its ports.
type quoted struct {
	src, dst netip.AddrPort
	proto    uint8
	// ipOff and l4Off are its headers' offsets in the frame; checkOff its
	// L4 checksum's, 0 when the quote ends before that.
	ipOff, l4Off, checkOff int
}

// parseQuote reads the packet the ICMP error v (of frame) quotes: an IPv4
// error is a destination unreachable or time exceeded quoting a TCP or UDP
// packet or its first fragment; an ICMPv6 one any of the four errors
// quoting one without extension headers. Nil if it is none of those.
func parseQuote(frame []byte, v view) *quoted {
	end := pktest.MinFrameLen + v.l3len
	icmp := v.l4off()
	q := &quoted{ipOff: icmp + 8}
	if end < q.ipOff+1 {
		return nil
	}
	typ := frame[icmp]
	in := frame[q.ipOff:end]
	var ihl int
	if v.v6 {
		if typ < pktest.ICMPv6DestUnreachable || typ > pktest.ICMPv6ParamProblem || len(in) < 40 || in[0]>>4 != 6 {
			return nil
		}
		ihl, q.proto = 40, in[6]
		q.src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(in[8:24])), 0)
		q.dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(in[24:40])), 0)
	} else {
		if typ != pktest.ICMPDestUnreachable && typ != pktest.ICMPTimeExceeded || len(in) < 20 || in[0]>>4 != 4 {
			return nil
		}
		ihl, q.proto = int(in[0]&0x0f)*4, in[9]
		if ihl < 20 || binary.BigEndian.Uint16(in[6:])&0x1fff != 0 {
			return nil
		}
		q.src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(in[12:16])), 0)
		q.dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(in[16:20])), 0)
	}
	if q.proto != pktest.ProtoTCP && q.proto != pktest.ProtoUDP || len(in) < ihl+4 {
		return nil
	}
	q.l4Off = q.ipOff + ihl
	q.src = netip.AddrPortFrom(q.src.Addr(), binary.BigEndian.Uint16(frame[q.l4Off:]))
	q.dst = netip.AddrPortFrom(q.dst.Addr(), binary.BigEndian.Uint16(frame[q.l4Off+2:]))
	q.checkOff = q.l4Off + 6
	if q.proto == pktest.ProtoTCP {
		q.checkOff = q.l4Off + 16
	}
	if end < q.checkOff+2 {
		q.checkOff = 0
	}
	return q
}

// icmpError decides an ICMP (ICMPv6) message, which only the TC programs
// read: an error about a packet of a tracked flow goes to the host that
// sent that packet, quoting it as it was sent (what conntrack does for
// RELATED traffic, and what path MTU discovery needs):
//   - at ingress, an error about a reply the node sent to a client (the
//     frontend to the client) goes to the backend, about the backend's own
//     reply (from the backend, to its source NAT port when it has one);
//   - an error about a packet the node sent to a backend, from the
//     backend's side (at ingress for a source-NATed flow, at egress from a
//     local backend without), goes to the client, about its own packet to
//     the frontend, and from the frontend when the backend sent it.
//
// Everything else passes.
func (w *fuzzWorld) icmpError(p prog, frame []byte, v view) outcome {
	q := parseQuote(frame, v)
	if q == nil {
		return outcome{why: "ICMP other than an error quoting a TCP or UDP packet"}
	}
	if p == progTCIngress && v.dst == q.src.Addr() {
		for _, f := range w.flows {
			if f.proto == q.proto && f.frontend == q.src && f.client == q.dst {
				o := outcome{kind: xlate, verdict: pktest.TCActOK, inner: q, why: "ICMP error about a reply to a client: to the backend",
					src: netip.AddrPortFrom(v.src, 0), dsts: []netip.AddrPort{netip.AddrPortFrom(f.backend.Addr(), 0)},
					innerSrc: f.backend, innerDst: q.dst}
				if f.snat.IsValid() {
					o.innerDst, o.fwd = f.snat, true
					return w.fwdOutcome(p, v, o)
				}
				return o
			}
		}
	}
	if p == progTCEgress || p == progTCIngress {
		for _, f := range w.flows {
			sender := f.client
			if f.snat.IsValid() {
				sender = f.snat
			}
			if f.proto != q.proto || f.backend != q.dst || sender != q.src {
				continue
			}
			if (f.snat.IsValid() != (p == progTCIngress) && !f.portOnly()) || v.dst != q.src.Addr() {
				break
			}
			o := outcome{kind: xlate, verdict: pktest.TCActOK, inner: q, why: "ICMP error about a packet to a backend: to the client",
				src: netip.AddrPortFrom(v.src, 0), dsts: []netip.AddrPort{netip.AddrPortFrom(v.dst, 0)},
				innerSrc: q.src, innerDst: f.frontend}
			if v.src == f.backend.Addr() {
				o.src = netip.AddrPortFrom(f.frontend.Addr(), 0)
			}
			if f.snat.IsValid() {
				o.dsts[0], o.innerSrc = netip.AddrPortFrom(f.client.Addr(), 0), f.client
				if p == progTCEgress {
					return o // port only: it leaves by the device it was sent to
				}
				o.fwd = true
				return w.fwdOutcome(p, v, o)
			}
			return o
		}
	}
	return outcome{why: "ICMP error about no tracked flow"}
}

// notForwarded says IPv6 never forwards from src, a multicast, link-local
// or loopback address: the kernel's FIB lookup refuses such a source.
func notForwarded(src netip.Addr) bool {
	return src.Is6() && (src.IsMulticast() || src.IsLinkLocalUnicast() || src.IsLoopback())
}
