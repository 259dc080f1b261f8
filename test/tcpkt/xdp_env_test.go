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
	"github.com/ebpf-proxy/ebpf-proxy/internal/pktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// loadXDP loads the XDP program (bpf/xdp.c) on the fixture's maps, so that
// it and the TC programs share connection tracking as the agent's do, and
// makes devs the devices the program may redirect to (those it is attached
// to). The XDP program's own maps are private.
func (f *fixture) loadXDP(tb testing.TB, devs ...uint32) *bpfobj.XdpObjects {
	tb.Helper()
	sandbox.RequireFeature(tb, "XDP programs", features.HaveProgramType(ebpf.XDP))
	spec, err := bpfobj.LoadXdp()
	if err != nil {
		tb.Fatal(err)
	}
	tcSpec, err := bpfobj.LoadTc()
	if err != nil {
		tb.Fatal(err)
	}
	if err := spec.Variables[bpfobj.XdpVarSnatPortMin].Set(f.snatMin); err != nil {
		tb.Fatal(err)
	}
	if err := spec.Variables[bpfobj.XdpVarSnatPortMax].Set(f.snatMax); err != nil {
		tb.Fatal(err)
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
				tb.Fatal(err)
			}
			m.MaxEntries = info.MaxEntries
		}
	}
	objs := &bpfobj.XdpObjects{}
	if err := spec.LoadAndAssign(objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("load the XDP program: %+v", ve)
		}
		tb.Fatalf("load the XDP program: %v", err)
	}
	tb.Cleanup(func() { objs.Close() })
	// A device map entry names a device of the namespace it is written in.
	err = f.ns.Do(func() error {
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
		c.Do = f.ns.Do
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
