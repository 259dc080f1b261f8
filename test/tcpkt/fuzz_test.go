package tcpkt_test

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// The packet fuzzer: random and mutated frames through every TC and XDP
// program (tc_ingress, tc_egress, xdp_nodeport, xdp_nodeport_skb) by
// BPF_PROG_TEST_RUN, each judged against the reference model of
// fuzz_model_test.go in one world of Services and established flows, both
// families. Connection tracking is put back as it was after every frame,
// so that every frame meets the same world.
//
// EBPF_PROXY_PKTFUZZ_PACKETS sets how many frames each program gets
// (50,000 by default, 20,000 in the kernel matrix's emulated guests, where
// a frame and the restore of connection tracking after it cost about 16
// times what they cost on the host; `make fuzz` runs 1,000,000),
// EBPF_PROXY_PKTFUZZ_SEED
// the generator's seed (printed; 1 by default), so that a failure is
// replayed with the same two values. A failing frame is printed in hex with
// the difference to the model's expectation; keep it in
// pktFuzzRegressions once fixed.

// Ports and backends of the fuzz world, both families.
const (
	fzWebLocal  = 30010 // TCP, one local backend
	fzWebRemote = 30011 // TCP, one backend on node-b
	fzDNSRemote = 30012 // UDP, one backend on node-b
	fzLB        = 30014 // TCP, LoadBalancer IP with source ranges, a local and a remote backend
	fzETPLocal  = 30015 // TCP, policy Local, a local and a remote backend
	fzElsewhere = 30016 // TCP, policy Local, only a remote backend: dropped
	fzNoEPs     = 30017 // TCP and UDP, no endpoints: refused
	fzAffinity  = 30018 // UDP, ClientIP affinity, two remote backends
	fzMaglev    = 30019 // TCP, Maglev, a local and two remote backends
	fzGone      = 30020 // TCP, its backend replaced after a flow began
	fzDNSLocal  = 30021 // UDP, one local backend
	fzWebLocal2 = 30022 // TCP, the local backend of fzWebLocal: a client port's second flow to it clashes
	fzWebLocal3 = 30023 // TCP, the same: a third flow, which must not take the second's port
)

// fuzzFamilyAddrs are one family's addresses of the fuzz world.
type fuzzFamilyAddrs struct {
	v6         bool
	node       netip.Addr
	clusterNet string // a ClusterIP prefix, as "10.96.0."
	localPod   func(i int) netip.Addr
	remotePod  func(i int) netip.Addr
	extIP      netip.Addr
	lbIP       netip.Addr
	ranges     string
	clientIn   netip.Addr // inside the source ranges
	clientOut  netip.Addr // outside them
	localhost  netip.Addr // the loopback address (no frontend)
}

var fuzzAddrs = [2]fuzzFamilyAddrs{
	{
		node: nodeAddr, clusterNet: "10.96.0.",
		localPod:  func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}) },
		remotePod: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 2, byte(i)}) },
		extIP:     netip.MustParseAddr("198.19.0.10"), lbIP: netip.MustParseAddr("198.19.0.20"),
		ranges: "198.18.0.0/28", clientIn: netip.MustParseAddr("198.18.0.10"), clientOut: netip.MustParseAddr("198.18.0.200"),
		localhost: netip.MustParseAddr("127.0.0.1"),
	},
	{
		v6: true, node: node6, clusterNet: "fd00:96::",
		localPod:  func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:244:1::%x", i)) },
		remotePod: func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:244:2::%x", i)) },
		extIP:     netip.MustParseAddr("fd00:19::10"), lbIP: netip.MustParseAddr("fd00:19::20"),
		ranges: "2001:db8:18::/64", clientIn: netip.MustParseAddr("2001:db8:18::10"), clientOut: netip.MustParseAddr("2001:db8:99::10"),
		localhost: netip.MustParseAddr("::1"),
	},
}

// fuzzState is the fuzz world's Services of family a; goneBackend is the
// gone Service's endpoint (its pod number on node-b).
func fuzzState(a fuzzFamilyAddrs, goneBackend int) *model.State {
	ep := func(addr netip.Addr, port uint16, node string) string {
		return at(netip.AddrPortFrom(addr, port), node)
	}
	l, r := a.localPod, a.remotePod
	cip := func(i int) string { return a.clusterNet + strconv.Itoa(i) }
	st := state(
		service{name: "web-local", clusterIP: cip(10), port: 80, proto: model.TCP, nodePort: fzWebLocal, endpoints: []string{ep(l(0x10), 8080, thisNode)}},
		service{name: "web-remote", clusterIP: cip(11), port: 80, proto: model.TCP, nodePort: fzWebRemote, endpoints: []string{ep(r(0x10), 8080, otherNode)}},
		service{name: "dns-remote", clusterIP: cip(12), port: 53, proto: model.UDP, nodePort: fzDNSRemote, endpoints: []string{ep(r(0x11), 5353, otherNode)}},
		service{name: "ext-ip", clusterIP: cip(13), port: 80, proto: model.TCP, extIPs: []string{a.extIP.String()}, endpoints: []string{ep(r(0x12), 8080, otherNode)}},
		service{name: "lb", clusterIP: cip(14), port: 80, proto: model.TCP, nodePort: fzLB, lbIPs: []string{a.lbIP.String()}, ranges: []string{a.ranges},
			endpoints: []string{ep(l(0x12), 8080, thisNode), ep(r(0x14), 8080, otherNode)}},
		service{name: "etp-local", clusterIP: cip(15), port: 80, proto: model.TCP, nodePort: fzETPLocal, etpLocal: true,
			endpoints: []string{ep(l(0x13), 8080, thisNode), ep(r(0x13), 8080, otherNode)}},
		service{name: "etp-local-elsewhere", clusterIP: cip(16), port: 80, proto: model.TCP, nodePort: fzElsewhere, etpLocal: true,
			endpoints: []string{ep(r(0x16), 8080, otherNode)}},
		service{name: "no-endpoints", clusterIP: cip(17), port: 80, proto: model.TCP, nodePort: fzNoEPs},
		service{name: "no-endpoints-udp", clusterIP: cip(17), port: 53, proto: model.UDP, nodePort: fzNoEPs},
		service{name: "affinity", clusterIP: cip(18), port: 53, proto: model.UDP, nodePort: fzAffinity, affinity: true,
			endpoints: []string{ep(r(0x20), 53, otherNode), ep(r(0x21), 53, otherNode)}},
		service{name: "maglev", clusterIP: cip(19), port: 80, proto: model.TCP, nodePort: fzMaglev, maglev: true,
			endpoints: []string{ep(l(0x19), 8080, thisNode), ep(r(0x22), 8080, otherNode), ep(r(0x23), 8080, otherNode)}},
		service{name: "gone", clusterIP: cip(20), port: 80, proto: model.TCP, nodePort: fzGone, endpoints: []string{ep(r(goneBackend), 8080, otherNode)}},
		service{name: "dns-local", clusterIP: cip(21), port: 53, proto: model.UDP, nodePort: fzDNSLocal, endpoints: []string{ep(l(0x14), 5353, thisNode)}},
		service{name: "web-local-again", clusterIP: cip(22), port: 80, proto: model.TCP, nodePort: fzWebLocal2, endpoints: []string{ep(l(0x10), 8080, thisNode)}},
		service{name: "web-local-third", clusterIP: cip(23), port: 80, proto: model.TCP, nodePort: fzWebLocal3, endpoints: []string{ep(l(0x10), 8080, thisNode)}},
	)
	st.Node.Addrs = []netip.Addr{a.node}
	return st
}

// pktFuzz is the fuzzer's fixture: the programs on the fixture's maps,
// the model's world, and the connection tracking entries each frame starts
// from.
type pktFuzz struct {
	f     *fixture6
	progs [numProgs]*ebpf.Program
	w     *fuzzWorld
	fams  [2]fuzzFamily
	ct4   map[bpfobj.TcCt4Key]bpfobj.TcCt4Entry
	ct6   map[bpfobj.TcCt6Key]bpfobj.TcCt6Entry
	// buf4 and buf6 are restore's buffers for the two maps.
	buf4 ctBuf[bpfobj.TcCt4Key, bpfobj.TcCt4Entry]
	buf6 ctBuf[bpfobj.TcCt6Key, bpfobj.TcCt6Entry]
	// lastChanged says whether the last run changed connection tracking.
	lastChanged bool
}

func newPktFuzz(tb testing.TB) *pktFuzz {
	tb.Helper()
	const snatMax = 65535
	// Room for every client the affinity Service sees in a long run: an
	// entry evicted from the LRU would let its client select again, which
	// the model does not foresee.
	f := newFixture6(tb, loadOptions{snatMin: snatPort, snatMax: snatMax, affinityEntries: 1 << 17})
	x := f.loadXDP(tb, f.ifindex)
	z := &pktFuzz{f: f, progs: [numProgs]*ebpf.Program{f.objs.TcIngress, f.objs.TcEgress, x.XdpNodeport, x.XdpNodeportSkb}}
	const goneOld, goneNew = 0x30, 0x31
	f.sync(tb, fuzzState(fuzzAddrs[0], goneOld))
	f.sync6(tb, fuzzState6(goneOld))
	// As the agent lets them on this routing: new flows take the next
	// hop of earlier ones to the same backend, whatever their client
	// (bpf/lib/nexthop.h), which must change nothing the model foresees.
	f.shareNexthops(tb, false, loader.NexthopShareAll)
	f.shareNexthops(tb, true, loader.NexthopShareAll)

	// The established flows, made by their packets through the programs.
	var flows []trackedFlow
	for i, a := range fuzzAddrs {
		c := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(a.clientIn, port) }
		np := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(a.node, port) }
		flows = append(flows,
			z.establish(tb, a.v6, pktest.ProtoTCP, c(40001), np(fzWebRemote), netip.AddrPortFrom(a.remotePod(0x10), 8080)),
			z.establish(tb, a.v6, pktest.ProtoTCP, c(40002), np(fzWebLocal), netip.AddrPortFrom(a.localPod(0x10), 8080)),
			z.establish(tb, a.v6, pktest.ProtoUDP, c(40003), np(fzDNSRemote), netip.AddrPortFrom(a.remotePod(0x11), 5353)),
			z.establish(tb, a.v6, pktest.ProtoUDP, c(40004), np(fzDNSLocal), netip.AddrPortFrom(a.localPod(0x14), 5353)),
			z.establish(tb, a.v6, pktest.ProtoTCP, c(40005), np(fzGone), netip.AddrPortFrom(a.remotePod(goneOld), 8080)),
			// The second flow from fzWebLocal's client port to its
			// backend: the same reply tuple, so another source port.
			z.establish(tb, a.v6, pktest.ProtoTCP, c(40002), np(fzWebLocal2), netip.AddrPortFrom(a.localPod(0x10), 8080)),
		)
		z.fams[i] = fuzzFamily{v6: a.v6, node: a.node,
			clients: []netip.Addr{a.clientIn, a.clientOut},
			misses:  []netip.Addr{netip.MustParseAddr(a.clusterNet + "11"), a.localhost, a.remotePod(0x10), a.localPod(0x10), a.node}}
	}
	for i := range flows {
		flows[i].gone = flows[i].frontend.Port() == fzGone
		if f := flows[i]; f.frontend.Port() == fzWebLocal2 && (f.snat.Addr() != f.client.Addr() || f.snat == f.client) {
			tb.Fatalf("the second flow from %s to its backend got source %s; want the client's address on another port", f.client, f.snat)
		}
	}
	st4, st6 := fuzzState(fuzzAddrs[0], goneNew), fuzzState6(goneNew)
	f.sync(tb, st4)
	f.sync6(tb, st6)

	z.w = newFuzzWorld(st4, st6)
	z.w.flows = flows
	z.w.snatAddr4, z.w.snatAddr6 = nodeAddr, node6
	z.w.snatMin, z.w.snatMax = snatPort, snatMax
	z.w.remotePods4, z.w.remotePods6 = nodeBPods, nodeBPods6
	z.w.localPods4, z.w.localPods6 = podGateway.Masked(), podGW6.Masked()
	var err error
	if z.ct4, err = snapshot[bpfobj.TcCt4Key, bpfobj.TcCt4Entry](f.objs.Tc4CtV1); err != nil {
		tb.Fatal(err)
	}
	if z.ct6, err = snapshot[bpfobj.TcCt6Key, bpfobj.TcCt6Entry](f.objs.Tc6CtV1); err != nil {
		tb.Fatal(err)
	}
	if len(z.ct4) != 12 || len(z.ct6) != 12 {
		tb.Fatalf("the established flows left %d IPv4 and %d IPv6 tracking entries, want 12 each", len(z.ct4), len(z.ct6))
	}
	// The flows outlive the run: a source-NATed UDP flow that is not a
	// stream lives 30 s, less than a long run takes.
	const week = 7 * 24 * 3600
	for k, v := range z.ct4 {
		v.Expires += week
		z.ct4[k] = v
	}
	for k, v := range z.ct6 {
		v.Expires += week
		z.ct6[k] = v
	}
	if err := z.restoreCT(true, true); err != nil {
		tb.Fatal(err)
	}
	return z
}

func fuzzState6(goneBackend int) *model.State { return fuzzState(fuzzAddrs[1], goneBackend) }

// establish runs a flow's opening packets (for TCP a handshake, for UDP a
// query and its answer) through the TC programs and returns the flow.
func (z *pktFuzz) establish(tb testing.TB, v6 bool, proto uint8, client, frontend, backend netip.AddrPort) trackedFlow {
	tb.Helper()
	fl := trackedFlow{client: client, frontend: frontend, backend: backend, proto: proto}
	build := func(src, dst netip.AddrPort, flags pktest.TCPFlags) []byte {
		switch {
		case v6 && proto == pktest.ProtoTCP:
			return pktest.TCP6(src, dst, flags).WithMACs(clientMAC, deviceMAC).Bytes()
		case v6:
			return pktest.UDP6(src, dst).WithPayload([]byte("q")).WithMACs(clientMAC, deviceMAC).Bytes()
		case proto == pktest.ProtoTCP:
			return pktest.TCP(src, dst, flags).WithMACs(clientMAC, deviceMAC).Bytes()
		}
		return pktest.UDP(src, dst).WithPayload([]byte("q")).WithMACs(clientMAC, deviceMAC).Bytes()
	}
	run := func(p prog, frame []byte) []byte {
		res, err := pktest.Exec(z.progs[p], pktest.Case{In: frame, Do: z.f.ns.Do, SKB: &pktest.SKBContext{Ifindex: z.f.ifindex}})
		if err != nil {
			tb.Fatal(err)
		}
		if res.Verdict != pktest.TCActOK && res.Verdict != pktest.TCActRedirect {
			tb.Fatalf("establishing %v -> %v: %s gave %v", client, frontend, p, res.Verdict)
		}
		return res.Out
	}
	out := run(progTCIngress, build(client, frontend, pktest.SYN))
	back := client
	if v := parseFrame(out, false); v.srcAP() != client {
		fl.snat = v.srcAP()
		back = fl.snat
	}
	// A backend elsewhere answers at ingress; one on the node at egress,
	// also when only the client's port changed.
	if fl.snat.IsValid() && fl.snat.Addr() != client.Addr() {
		run(progTCIngress, build(backend, back, pktest.SYN|pktest.ACK))
	} else {
		run(progTCEgress, build(backend, back, pktest.SYN|pktest.ACK))
	}
	if proto == pktest.ProtoTCP {
		run(progTCIngress, build(client, frontend, pktest.ACK))
	}
	return fl
}

// snapshot reads every entry of m, in batches (one system call for the
// fuzz world's entries, which it reads after every run).
func snapshot[K, V comparable](m *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	keys, vals := make([]K, 64), make([]V, 64)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			out[keys[i]] = vals[i]
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// restore makes m hold exactly want again and says whether it had not.
// An unchanged map, the common case, costs one batch read into buffers
// that are kept between calls and no map of what was read.
func restore[K, V comparable](m *ebpf.Map, want map[K]V, buf *ctBuf[K, V]) (bool, error) {
	if len(buf.keys) == 0 {
		// Room for every wanted entry and a few a run may add, so that
		// one system call reads them all.
		buf.keys, buf.vals = make([]K, len(want)+64), make([]V, len(want)+64)
	}
	buf.gotKeys, buf.gotVals = buf.gotKeys[:0], buf.gotVals[:0]
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, buf.keys, buf.vals, nil)
		buf.gotKeys = append(buf.gotKeys, buf.keys[:n]...)
		buf.gotVals = append(buf.gotVals, buf.vals[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return false, err
		}
	}
	same := 0
	for i, k := range buf.gotKeys {
		if v, ok := want[k]; ok && v == buf.gotVals[i] {
			same++
		}
	}
	if same == len(want) && len(buf.gotKeys) == len(want) {
		return false, nil
	}
	for _, k := range buf.gotKeys {
		if _, ok := want[k]; !ok {
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return true, err
			}
		}
	}
	for k, v := range want {
		if err := m.Update(k, v, ebpf.UpdateAny); err != nil {
			return true, err
		}
	}
	return true, nil
}

// ctBuf holds restore's buffers for one map between calls.
type ctBuf[K, V comparable] struct {
	keys, gotKeys []K
	vals, gotVals []V
}

// runFrame runs frame through program p inside the fixture's namespace
// (the caller is in it), judges it by the model and puts connection
// tracking back. It returns the matching outcome's kind, or an error with
// the whole story.
func (z *pktFuzz) runFrame(p prog, frame []byte, linear int, fromPod bool) (outcome, error) {
	z.w.fromPod = fromPod
	v, alts := z.w.decide(p, frame)
	c := pktest.Case{In: frame}
	dev := z.f.ifindex
	if fromPod {
		dev = z.f.podIfindex
	}
	if p.xdp() {
		c.XDP = &pktest.XDPContext{IngressIfindex: dev}
		if p == progXDP && linear > 0 && linear < len(frame) {
			// A multi-buffer frame, of which the program sees only
			// the first linear bytes: TC's to translate.
			c.XDP.LinearLen = uint32(linear)
			alts = []outcome{{why: "multi-buffer frame"}}
		}
	} else {
		c.SKB = &pktest.SKBContext{Ifindex: dev}
		for _, o := range alts {
			if o.trims(v, frame) {
				c.SKBChecksum = pktest.SKBChecksumNone
			}
		}
	}
	res, err := pktest.Exec(z.progs[p], c)
	// Either program reads the frame as IPv6 exactly when its EtherType
	// says so, and then touches only the IPv6 flows.
	v6 := binary.BigEndian.Uint16(frame[12:]) == pktest.EtherTypeIPv6
	if rerr := z.restoreCT(!v6, v6); rerr != nil {
		return outcome{}, rerr
	}
	if errors.Is(err, pktest.ErrShortL3Refused) {
		// The kernel does not run it; the XDP program does.
		return outcome{why: "not run: the kernel refuses TC input shorter than its IP header"}, nil
	}
	if err != nil {
		return outcome{}, fmt.Errorf("%s on %x: %w", p, frame, err)
	}
	o, err := z.w.match(p, frame, v, alts, res, z.lastChanged)
	if err != nil {
		return outcome{}, fmt.Errorf("%v\n%s", err, describeRun(p, frame, res))
	}
	return o, nil
}

// restoreCT puts the IPv4 (v4) and IPv6 (v6) connection tracking maps
// back as they were after the flows were established, noting in
// lastChanged whether they had changed.
func (z *pktFuzz) restoreCT(v4, v6 bool) error {
	var c4, c6 bool
	var err error
	if v4 {
		if c4, err = restore(z.f.objs.Tc4CtV1, z.ct4, &z.buf4); err != nil {
			return fmt.Errorf("restore IPv4 connection tracking: %w", err)
		}
	}
	if v6 {
		if c6, err = restore(z.f.objs.Tc6CtV1, z.ct6, &z.buf6); err != nil {
			return fmt.Errorf("restore IPv6 connection tracking: %w", err)
		}
	}
	z.lastChanged = c4 || c6
	return nil
}

// fuzzEnv reads a count from the environment variable name.
func fuzzEnv(tb testing.TB, name string, def uint64) uint64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// TestPacketFuzz runs the regression frames, then
// EBPF_PROXY_PKTFUZZ_PACKETS random frames, through every TC and XDP
// program and checks each run against the reference model: zero
// mistranslations, zero wrong verdicts.
func TestPacketFuzz(t *testing.T) {
	frames := uint64(50000)
	if sandbox.InVMGuest() {
		// The model and the programs are the same on every kernel; what a
		// guest adds is its kernel's helpers and verifier on these
		// frames, which a smaller sample covers: 6,000 frames bring every
		// outcome the check below asks for (seeds 1 to 8 at 5,000), and
		// a run costs about 1 ms under emulation against 30 us here.
		frames = 6000
	}
	n := fuzzEnv(t, "EBPF_PROXY_PKTFUZZ_PACKETS", frames)
	seed := fuzzEnv(t, "EBPF_PROXY_PKTFUZZ_SEED", 1)
	z := newPktFuzz(t)
	t.Logf("seed %d, %d frames per program (EBPF_PROXY_PKTFUZZ_SEED, EBPF_PROXY_PKTFUZZ_PACKETS)", seed, n)

	// The outcomes that matched, per program: by kind, and by the model's
	// rule.
	var stats [numProgs]map[kind]int
	var rules [numProgs]map[string]int
	for p := range stats {
		stats[p], rules[p] = map[kind]int{}, map[string]int{}
	}
	const maxFailures = 5
	var failures []string
	start := time.Now()
	err := z.f.ns.Do(func() error {
		for _, r := range pktFuzzRegressions {
			frame, err := hex.DecodeString(r.frame)
			if err != nil {
				return fmt.Errorf("regression %q: %w", r.name, err)
			}
			for p := range numProgs {
				if _, err := z.runFrame(p, frame, r.linear, r.fromPod); err != nil {
					failures = append(failures, fmt.Sprintf("regression %q: %v", r.name, err))
				}
			}
		}
		g := newFuzzGen(seed, z.w, z.fams)
		for i := range n {
			frame := g.frame()
			if len(frame) < pktest.MinFrameLen {
				continue
			}
			linear := 0
			if g.chance(0.03) && len(frame) > pktest.MinFrameLen {
				linear = pktest.MinFrameLen + g.r.IntN(len(frame)-pktest.MinFrameLen)
			}
			// Now and then from a pod, as when the agent attaches to
			// the pod bridge too.
			fromPod := g.chance(0.05)
			for p := range numProgs {
				o, err := z.runFrame(p, frame, linear, fromPod)
				if err != nil {
					failures = append(failures, fmt.Sprintf("seed %d frame %d (linear part %d, from p0 %v): %v", seed, i, linear, fromPod, err))
					if len(failures) >= maxFailures {
						return nil
					}
					continue
				}
				stats[p][o.kind]++
				rules[p][o.why]++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range failures {
		t.Error(f)
	}
	elapsed := time.Since(start)
	for p := range numProgs {
		t.Logf("%s: %v", p, stats[p])
		if testing.Verbose() {
			for _, why := range slices.Sorted(maps.Keys(rules[p])) {
				t.Logf("  %7d  %s", rules[p][why], why)
			}
		}
	}
	t.Logf("%d frames through %d programs in %v (%v a run)", n, numProgs, elapsed.Round(time.Millisecond),
		(elapsed / time.Duration(max(1, n*uint64(numProgs)))).Round(time.Microsecond))
	// Every kind of outcome must have come up, or the world or the
	// generator has stopped covering it (5,000 frames are enough).
	if n >= 5000 && len(failures) == 0 {
		for p := range numProgs {
			kinds := []kind{pass, drop, xlate}
			if p == progTCEgress {
				kinds = []kind{pass, xlate} // egress drops nothing
			}
			for _, k := range kinds {
				if stats[p][k] == 0 {
					t.Errorf("%s: no frame was %s", p, k)
				}
			}
		}
		for _, k := range []kind{unreach, reset} {
			if stats[progTCIngress][k] == 0 {
				t.Errorf("tc_ingress: no frame got a %s", k)
			}
		}
		// Every backend a new flow may get is chosen now and then:
		// never, when a uniform choice would have passed it over with
		// a chance below one in a million, is an error. Affinity makes
		// free choices rare (one per client), so a short run may not
		// get there; it says so.
		for _, fe := range z.w.frontends {
			for _, b := range fe.backends {
				switch {
				case z.w.chosen[fe.svc][b.ap] > 0:
					continue
				case len(fe.backends) == 1:
					t.Errorf("%s: no new flow went to its backend %v", fe.svc, b.ap)
					continue
				}
				if miss := z.w.missLog[fe.svc][b.ap]; miss < math.Log(1e-6) {
					t.Errorf("%s: no new flow went to %v (chance %.1g for a uniform choice)", fe.svc, b.ap, math.Exp(miss))
				} else {
					t.Logf("%s: no new flow went to %v, too few free choices to tell (chance %.2g)", fe.svc, b.ap, math.Exp(miss))
				}
			}
		}
	}
}

// FuzzPacketModel is TestPacketFuzz's check with Go's fuzzer mutating raw
// frames: `go test -fuzz FuzzPacketModel ./test/tcpkt/` (as root). The
// seed corpus is the regression frames and frames of the generator.
func FuzzPacketModel(f *testing.F) {
	z := newPktFuzz(f)
	for _, r := range pktFuzzRegressions {
		frame, err := hex.DecodeString(r.frame)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame)
	}
	g := newFuzzGen(1, z.w, z.fams)
	for range 64 {
		f.Add(g.frame())
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < pktest.MinFrameLen || len(frame) > 1514 {
			return
		}
		err := z.f.ns.Do(func() error {
			for p := range numProgs {
				if _, err := z.runFrame(p, frame, 0, false); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	})
}

// The frames that once found a bug, in the programs or in the model,
// replayed first by TestPacketFuzz and seeding FuzzPacketModel.
var pktFuzzRegressions = []struct {
	name  string
	frame string // hex
	// linear, when set, is the XDP linear part's length.
	linear int
	// fromPod runs it on p0 rather than n0.
	fromPod bool
}{
	{
		// The model had the reset carry the segment's checksum error;
		// the programs compute it afresh, as a new packet should.
		name: "a segment with a bad TCP checksum on a flow whose backend is gone: a reset with a right one",
		frame: "02770000001102770000000108004556003ab1d900004006f4afc612000ac0a84d0b9c4575446eaaa8f8225520575011250e" +
			"85420000f1a9df2dcab61942284bd82435f6b88a2a098f2bcca7efc50586dd6536dd598b39",
	},
	{
		// The model forwarded it; the kernel's FIB lookup refuses a
		// multicast source, so TC drops it.
		name: "an ICMPv6 error from a multicast source about a reply to a client: dropped, not forwarded to the backend",
		frame: "02770000001102770000000186dd6000000000653a40ff29f0bbe31cd87620331960f8a983fcfd000077000000000000000000" +
			"000011040230e8000005006000000000350640fd00007700000000000000000000001120010db8001800000000000000000010" +
			"753b9c410802ebb68779f0b75012faf069ca00008341c1700b383ee44bf9394f1e9931f9970d357e0da00f0a0c74e6513a4b29" +
			"34fe",
	},
	{
		// The model source-NATed it; with a source the IPv6 FIB refuses,
		// only the address of the device it came in on is left, and p0
		// has none.
		name: "IPv6 from ::1 on the pod device to a NodePort with a remote backend: dropped, no source NAT address",
		frame: "02770000001102770000000186dd600000000022064000000000000000000000000000000001fd000077000000000000000000" +
			"0000119c4b753beed95ff67a533c5e500400091890000080afff6124cf2e8305ee2eab7aaa",
		fromPod: true,
	},
}
