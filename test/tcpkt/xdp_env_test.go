package tcpkt_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// loadXDP loads the XDP program (bpf/xdp.c) on the fixture's maps, so that
// it and the TC programs share connection tracking as the agent's do, and
// makes devs the devices the program may redirect to (those it is attached
// to). The XDP program's own maps are private.
func (f *fixture) loadXDP(tb testing.TB, devs ...uint32) *bpfobj.XdpObjects {
	tb.Helper()
	sandbox.RequireFeature(tb, "XDP programs", features.HaveProgramType(ebpf.XDP))
	if f.load.xdp == nil {
		xo, err := loadXDPOn(f)
		if err != nil {
			tb.Fatal(err)
		}
		f.load.xdp = xo
	}
	objs := f.load.xdp
	// A device map entry names a device of the namespace it is written in.
	err := f.ns.Do(func() error {
		for _, d := range devs {
			if err := objs.Xdp4DevsV1.Put(d, d); err != nil {
				return fmt.Errorf("device map entry of ifindex %d: %w", d, err)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return objs
}

// loadXDPOn loads the XDP program on the maps of f's TC programs.
func loadXDPOn(f *fixture) (*bpfobj.XdpObjects, error) {
	spec, err := bpfobj.LoadXdp()
	if err != nil {
		return nil, err
	}
	tcSpec, err := bpfobj.LoadTc()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[bpfobj.XdpVarSnatPortMin].Set(f.snatMin); err != nil {
		return nil, err
	}
	if err := spec.Variables[bpfobj.XdpVarSnatPortMax].Set(f.snatMax); err != nil {
		return nil, err
	}
	// Every map both objects have is the TC fixture's.
	repl := map[string]*ebpf.Map{}
	tcMaps := reflect.ValueOf(f.objs.TcMaps)
	for i := range tcMaps.NumField() {
		name := tcMaps.Type().Field(i).Tag.Get("ebpf")
		if _, ok := tcSpec.Maps[name]; ok && spec.Maps[name] != nil {
			repl[name] = tcMaps.Field(i).Interface().(*ebpf.Map)
		}
	}
	for name, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
		if repl[name] != nil {
			// The replacement decides; the spec must agree with it.
			info, err := repl[name].Info()
			if err != nil {
				return nil, err
			}
			m.MaxEntries = info.MaxEntries
		}
	}
	objs := &bpfobj.XdpObjects{}
	if err := spec.LoadAndAssign(objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load the XDP program: %+v", ve)
		}
		return nil, fmt.Errorf("load the XDP program: %w", err)
	}
	return objs, nil
}

// A third node, node-c, reached through a second uplink n1 on another
// network, and one whose neighbour entry is missing (as before the first
// ARP exchange) through n0.
const secondDevice = "n1"

var (
	secondAddr = netip.MustParseAddr("192.168.78.11")
	nodeCAddr  = netip.MustParseAddr("192.168.78.13")
	nodeCPods  = netip.MustParsePrefix("10.244.3.0/24")
	nodeDAddr  = netip.MustParseAddr("192.168.77.14")
	nodeDPods  = netip.MustParsePrefix("10.244.4.0/24")
	secondMAC  = net.HardwareAddr{0x02, 0x78, 0x00, 0x00, 0x00, 0x11}
	nodeCMAC   = net.HardwareAddr{0x02, 0x78, 0x00, 0x00, 0x00, 0x13}
	nodeCSNAT  = netip.AddrPortFrom(secondAddr, snatPort)
)

// addSecondUplink creates n1 towards node-c (with node-c's neighbour entry
// and its source NAT address in the programs' map) and a route to node-d
// through n0 without neighbour entry. It returns n1's ifindex.
func (f *fixture) addSecondUplink(tb testing.TB) uint32 {
	tb.Helper()
	nl := f.ns.Netlink()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: secondDevice, HardwareAddr: secondMAC}, PeerName: secondDevice + "p"}
	if err := nl.LinkAdd(veth); err != nil {
		tb.Fatalf("add %s: %v", secondDevice, err)
	}
	link, err := nl.LinkByName(secondDevice)
	if err != nil {
		tb.Fatal(err)
	}
	peer, err := nl.LinkByName(secondDevice + "p")
	if err != nil {
		tb.Fatal(err)
	}
	if err := nl.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: secondAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		tb.Fatal(err)
	}
	for _, l := range []netlink.Link{peer, link} {
		if err := nl.LinkSetUp(l); err != nil {
			tb.Fatal(err)
		}
	}
	neigh := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: nodeCAddr.AsSlice(), HardwareAddr: nodeCMAC}
	if err := nl.NeighSet(neigh); err != nil {
		tb.Fatal(err)
	}
	n0, err := nl.LinkByName(device)
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: nodeCPods.Addr().AsSlice(), Mask: net.CIDRMask(nodeCPods.Bits(), 32)}, Gw: nodeCAddr.AsSlice()},
		{LinkIndex: n0.Attrs().Index, Dst: &net.IPNet{IP: nodeDPods.Addr().AsSlice(), Mask: net.CIDRMask(nodeDPods.Bits(), 32)}, Gw: nodeDAddr.AsSlice()},
	} {
		if err := nl.RouteAdd(r); err != nil {
			tb.Fatalf("route %v: %v", r, err)
		}
	}
	idx := uint32(link.Attrs().Index)
	if err := f.objs.Tc4SnatAddrsV1.Put(idx, bpfobj.TcTc4SnatAddr{Address: be32(secondAddr)}); err != nil {
		tb.Fatal(err)
	}
	return idx
}

// node-c and node-d's IPv6 side, as addSecondUplink6 makes it.
var (
	second6    = netip.MustParseAddr("fd00:78::11")
	nodeC6     = netip.MustParseAddr("fd00:78::13")
	nodeCPods6 = netip.MustParsePrefix("fd00:244:3::/64")
	nodeD6     = netip.MustParseAddr("fd00:77::14")
	nodeDPods6 = netip.MustParsePrefix("fd00:244:4::/64")
	nodeCSNAT6 = netip.AddrPortFrom(second6, snatPort)
)

// addSecondUplink is fixture.addSecondUplink for the family: for IPv6, n1
// and the routes get their IPv6 side too (n1's IPv6 address for source NAT,
// node-c's neighbour entry, node-d's pods through n0 without one).
func (x *xfam) addSecondUplink(tb testing.TB) uint32 {
	tb.Helper()
	idx := x.f.addSecondUplink(tb)
	if !x.v6 {
		return idx
	}
	nl := x.f.ns.Netlink()
	link, err := nl.LinkByName(secondDevice)
	if err != nil {
		tb.Fatal(err)
	}
	n0, err := nl.LinkByName(device)
	if err != nil {
		tb.Fatal(err)
	}
	if err := nl.AddrAdd(link, &netlink.Addr{IPNet: ipNet6(netip.PrefixFrom(second6, 64)), Flags: 0x02 /* IFA_F_NODAD */}); err != nil {
		tb.Fatal(err)
	}
	neigh := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: nodeC6.AsSlice(), HardwareAddr: nodeCMAC}
	if err := nl.NeighSet(neigh); err != nil {
		tb.Fatal(err)
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: link.Attrs().Index, Dst: ipNet6(nodeCPods6), Gw: nodeC6.AsSlice()},
		{LinkIndex: n0.Attrs().Index, Dst: ipNet6(nodeDPods6), Gw: nodeD6.AsSlice()},
	} {
		if err := nl.RouteAdd(r); err != nil {
			tb.Fatalf("route %v: %v", r, err)
		}
	}
	if err := x.f.objs.Tc6SnatAddrsV1.Put(idx, bpfobj.TcTc6SnatAddr{Address: be32x4(second6)}); err != nil {
		tb.Fatal(err)
	}
	return idx
}

// xrow is a case for the XDP program (or, with tc, for tc_ingress), on n0
// unless ifindex says otherwise.
type xrow struct {
	pktest.Case
	tc      bool
	ifindex uint32
}

// runXDP runs rows in order: state carries over from row to row, and
// between the XDP and TC programs.
func (f *fixture) runXDP(t *testing.T, x *bpfobj.XdpObjects, rows []xrow) {
	t.Helper()
	for _, r := range rows {
		c := r.Case
		c.Do = onOneCPU(f.ns.Do)
		idx := f.ifindex
		if r.ifindex != 0 {
			idx = r.ifindex
		}
		prog := x.XdpNodeport
		if r.tc {
			prog = f.objs.TcIngress
			c.SKB = &pktest.SKBContext{Ifindex: idx}
		} else {
			if c.XDP == nil {
				c.XDP = &pktest.XDPContext{}
			}
			c.XDP.IngressIfindex = idx
		}
		t.Run(c.Name, func(t *testing.T) { pktest.RunCase(t, prog, c) })
	}
}

// xfam is one address family of the XDP fixtures: a fixture with that
// family's addresses, routes and source NAT address, the addresses of the
// cases, and frames of that family, so that each XDP table runs over IPv4
// and IPv6 alike.
type xfam struct {
	name string
	v6   bool
	f    *fixture
	// node is n0's address: NodePorts and source NAT.
	node netip.Addr
	// client and client2 are clients outside; the fixture's source
	// ranges admit client only.
	client, client2 netip.AddrPort
	// Backends of fixtureState and fixtureState6.
	localWeb, remoteWeb, remoteDNS, extRemote netip.AddrPort
	externalIP                                netip.AddrPort
	// clusterIP is web-remote's ClusterIP.
	clusterIP netip.AddrPort
	// w writes the family's maps.
	w *maps.Writer
}

// families are the names the XDP tests run under.
var families = []string{"IPv4", "IPv6"}

// eachFamily runs test as a subtest for each of families.
func eachFamily(t *testing.T, test func(t *testing.T, fam string)) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) { test(t, fam) })
	}
}

// newXFam builds the fixture of family name (one of families) with opts.
func newXFam(tb testing.TB, name string, opts loadOptions) *xfam {
	tb.Helper()
	if name == "IPv6" {
		f6 := newFixture6(tb, opts)
		return &xfam{
			name: name, v6: true, f: f6.fixture, w: f6.w6, node: node6,
			client: client6, client2: client6b,
			localWeb: localWeb6, remoteWeb: remoteWeb6, remoteDNS: remoteDNS6, extRemote: extRemote6,
			externalIP: externalIP6, clusterIP: netip.MustParseAddrPort("[fd00:96::11]:80"),
		}
	}
	f := newFixture(tb, opts)
	return &xfam{
		name: name, f: f, w: f.w, node: nodeAddr,
		client: client, client2: client2,
		localWeb: localWeb, remoteWeb: remoteWeb, remoteDNS: remoteDNS, extRemote: extRemote,
		externalIP: externalIP, clusterIP: netip.MustParseAddrPort("10.96.0.11:80"),
	}
}

// fixtureState is the family's fixtureState (fixtureState6).
func (x *xfam) fixtureState() *model.State {
	if x.v6 {
		return fixtureState6()
	}
	return fixtureState()
}

// state is state(svcs...) on the family's node address; the Services'
// addresses are the family's.
func (x *xfam) state(svcs ...service) *model.State {
	st := state(svcs...)
	st.Node.Addrs = []netip.Addr{x.node}
	return st
}

// sync programs st into the family's maps.
func (x *xfam) sync(tb testing.TB, st *model.State) {
	tb.Helper()
	spec := everyAddress
	if x.v6 {
		spec = everyAddress6
	}
	st.Node.NodePorts = spec.Resolve(&st.Node, st.Node.Addrs)
	if err := x.w.Sync(model.Update{State: st, Full: true}); err != nil {
		tb.Fatal(err)
	}
}

// np is a NodePort on the node's address.
func (x *xfam) np(port uint16) netip.AddrPort { return netip.AddrPortFrom(x.node, port) }

// snatSrc is the node's address and the fixture's single source NAT port.
func (x *xfam) snatSrc() netip.AddrPort { return netip.AddrPortFrom(x.node, snatPort) }

// flows is the number of the family's connection tracking entries.
func (x *xfam) flows(tb testing.TB) int {
	tb.Helper()
	if x.v6 {
		return (&fixture6{fixture: x.f}).flows6(tb)
	}
	return x.f.flows(tb)
}

// resetCT forgets the family's tracked flows.
func (x *xfam) resetCT(tb testing.TB) {
	tb.Helper()
	if x.v6 {
		(&fixture6{fixture: x.f}).resetCT6(tb)
		return
	}
	x.f.resetCT(tb)
}

// xpkt is a TCP or UDP frame of either family, with the fields the XDP
// program translates settable alike.
type xpkt struct {
	v6 bool
	b4 pktest.Builder
	b6 pktest.Builder6
}

func (x *xfam) tcp(src, dst netip.AddrPort, flags pktest.TCPFlags) xpkt {
	if x.v6 {
		return xpkt{v6: true, b6: pktest.TCP6(src, dst, flags)}
	}
	return xpkt{b4: pktest.TCP(src, dst, flags)}
}

func (x *xfam) udp(src, dst netip.AddrPort) xpkt {
	if x.v6 {
		return xpkt{v6: true, b6: pktest.UDP6(src, dst)}
	}
	return xpkt{b4: pktest.UDP(src, dst)}
}

func (p xpkt) with(f4 func(pktest.Builder) pktest.Builder, f6 func(pktest.Builder6) pktest.Builder6) xpkt {
	if p.v6 {
		p.b6 = f6(p.b6)
	} else {
		p.b4 = f4(p.b4)
	}
	return p
}

func (p xpkt) WithSrc(a netip.AddrPort) xpkt {
	return p.with(func(b pktest.Builder) pktest.Builder { return b.WithSrc(a) }, func(b pktest.Builder6) pktest.Builder6 { return b.WithSrc(a) })
}

func (p xpkt) WithDst(a netip.AddrPort) xpkt {
	return p.with(func(b pktest.Builder) pktest.Builder { return b.WithDst(a) }, func(b pktest.Builder6) pktest.Builder6 { return b.WithDst(a) })
}

func (p xpkt) WithPayload(d []byte) xpkt {
	return p.with(func(b pktest.Builder) pktest.Builder { return b.WithPayload(d) }, func(b pktest.Builder6) pktest.Builder6 { return b.WithPayload(d) })
}

// WithSeq sets the TCP sequence and acknowledgement numbers.
func (p xpkt) WithSeq(seq, ack uint32) xpkt {
	return p.with(func(b pktest.Builder) pktest.Builder { return b.WithSeq(seq).WithAck(ack) }, func(b pktest.Builder6) pktest.Builder6 { return b.WithSeq(seq, ack) })
}

// WithHops sets the TTL or the hop limit.
func (p xpkt) WithHops(n uint8) xpkt {
	return p.with(func(b pktest.Builder) pktest.Builder { return b.WithTTL(n) }, func(b pktest.Builder6) pktest.Builder6 { return b.WithHopLimit(n) })
}

func (p xpkt) WithMACs(src, dst net.HardwareAddr) xpkt {
	return p.with(func(b pktest.Builder) pktest.Builder { return b.WithMACs(src, dst) }, func(b pktest.Builder6) pktest.Builder6 { return b.WithMACs(src, dst) })
}

func (p xpkt) WithL4Checksum(c uint16) xpkt {
	return p.with(func(b pktest.Builder) pktest.Builder { return b.WithL4Checksum(c) }, func(b pktest.Builder6) pktest.Builder6 { return b.WithL4Checksum(c) })
}

// Bytes is the frame.
func (p xpkt) Bytes() []byte {
	if p.v6 {
		return p.b6.Bytes()
	}
	return p.b4.Bytes()
}

// Frames between the node's device and its neighbours, as fromOutside and
// the others.
func (p xpkt) fromOutside() xpkt { return p.WithMACs(clientMAC, deviceMAC) }
func (p xpkt) toRouter() xpkt    { return p.WithMACs(deviceMAC, routerMAC) }
func (p xpkt) toNodeB() xpkt     { return p.WithMACs(deviceMAC, nodeBMAC) }
func (p xpkt) fromNodeB() xpkt   { return p.WithMACs(nodeBMAC, deviceMAC) }

// forwarded is p as the node forwards it: one hop fewer.
func (p xpkt) forwarded() xpkt { return p.WithHops(pktest.DefaultTTL - 1) }
