package tcpkt_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// The fixture's node: node-a with its uplink n0 on the node network and p0
// towards its own pods (10.244.1.0/24, as a pod bridge). Its routes send
// node-b's pods to node-b and everything else (the external clients) to the
// router, with permanent neighbour entries so that FIB lookups resolve MAC
// addresses without ARP.
const (
	thisNode  = "node-a"
	otherNode = "node-b"
	device    = "n0"
	podDevice = "p0"
	snatPort  = 61000
)

var (
	nodeAddr   = netip.MustParseAddr("192.168.77.11")
	nodeBAddr  = netip.MustParseAddr("192.168.77.12")
	routerAddr = netip.MustParseAddr("192.168.77.1")
	nodeBPods  = netip.MustParsePrefix("10.244.2.0/24")
	podGateway = netip.MustParsePrefix("10.244.1.1/24")

	deviceMAC = net.HardwareAddr{0x02, 0x77, 0x00, 0x00, 0x00, 0x11}
	podDevMAC = net.HardwareAddr{0x02, 0x44, 0x01, 0x00, 0x00, 0x01}
	// podMAC is every local pod's MAC, as the fixture's neighbours say.
	podMAC    = net.HardwareAddr{0x02, 0x44, 0x01, 0x00, 0x00, 0x10}
	nodeBMAC  = net.HardwareAddr{0x02, 0x77, 0x00, 0x00, 0x00, 0x12}
	routerMAC = net.HardwareAddr{0x02, 0x77, 0x00, 0x00, 0x00, 0x01}
	// clientMAC is the source of frames arriving from the router.
	clientMAC = routerMAC
)

// fixture is the TC programs loaded with small private maps, a namespace
// holding the node's device and routes, and the maps Writer that programs
// Services into the maps as the agent does.
type fixture struct {
	objs *bpfobj.TcObjects
	// load holds objs, for the next test once this one is done (see
	// loads_test.go).
	load    *progLoad
	ns      *sandbox.Netns
	ifindex uint32
	// podIfindex is p0's.
	podIfindex uint32
	w          *maps.Writer
	// snatMin and snatMax are the programs' source NAT port range.
	snatMin, snatMax uint16
	// maglevTable6 is the spec of one IPv6 Maglev table, for
	// newFixture6's writer.
	maglevTable6 *ebpf.MapSpec
}

type loadOptions struct {
	// snatMin and snatMax are the source NAT port range; zero means the
	// single port snatPort, which makes outputs deterministic.
	snatMin, snatMax uint16
	// podDevice makes p0 one of the programs' devices, with its address
	// for source NAT, as when the agent attaches to the pod bridge.
	podDevice bool
	// affinityEntries, when set, sizes the session affinity maps (LRU)
	// instead of the 1024 entries of the other maps, for tests that give
	// more clients an affinity than that and expect each to keep it.
	affinityEntries uint32
}

func newFixture(tb testing.TB, opts loadOptions) *fixture {
	tb.Helper()
	sandbox.RequireRoot(tb)
	sandbox.RequireFeature(tb, "TC programs", features.HaveProgramType(ebpf.SchedCLS))
	if opts.snatMin == 0 {
		opts.snatMin, opts.snatMax = snatPort, snatPort
	}
	key := loadKey{snatMin: opts.snatMin, snatMax: opts.snatMax, affinityEntries: opts.affinityEntries}
	l := takeLoad(key)
	if l == nil {
		var err error
		if l, err = loadTC(key); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() { l.giveBack(tb) })
	f := &fixture{objs: l.tc, load: l, snatMin: opts.snatMin, snatMax: opts.snatMax,
		maglevTable6: l.spec.Maps[bpfobj.TcMapLb6MaglevV1].InnerMap}
	var err error
	if f.ns, err = sandbox.NewNetns("tcpkt"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := f.ns.Close(); err != nil {
			tb.Error(err)
		}
	})
	idx, podIdx, err := setUpNodeNetwork(f.ns)
	if err != nil {
		tb.Fatal(err)
	}
	f.ifindex, f.podIfindex = uint32(idx), uint32(podIdx)
	if err := f.objs.Tc4SnatAddrsV1.Put(f.ifindex, bpfobj.TcTc4SnatAddr{Address: be32(nodeAddr)}); err != nil {
		tb.Fatal(err)
	}
	if opts.podDevice {
		if err := f.objs.Tc4SnatAddrsV1.Put(f.podIfindex, bpfobj.TcTc4SnatAddr{Address: be32(podGateway.Addr())}); err != nil {
			tb.Fatal(err)
		}
	}
	f.w, err = maps.NewWriter(maps.Maps{
		Services: maps.FromKernel[maps.ServiceKey, maps.ServiceValue](f.objs.Lb4ServicesV1),
		Backends: maps.FromKernel[uint32, maps.BackendValue](f.objs.Lb4BackendsV1),
		RevNat:   maps.FromKernel[uint32, maps.RevNatValue](f.objs.Lb4RevnatV1),
		Members:  maps.FromKernel[maps.MemberKey, uint8](f.objs.Lb4MembersV1),

		SourceRanges: maps.FromKernel[maps.SourceRangeKey, uint8](f.objs.Lb4SourceRangesV1),
		PortFilter:   maps.FromKernel[uint32, uint32](f.objs.Lb4ExtPortsV1),
		RemovedAt:    maps.FromKernel[uint32, uint32](f.objs.LbRemovedAtV1),
		Maglev:       maps.KernelMaglev(f.objs.Lb4MaglevV1, f.objs.Lb4MaglevFpV1, l.spec.Maps[bpfobj.TcMapLb4MaglevV1].InnerMap),
	}, maps.Limits{Backends: 1024, RevNat: 1024})
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// setUpNodeNetwork creates the node's devices in ns with their addresses,
// routes and neighbours, and turns forwarding on, as on a node. It returns
// the ifindexes of n0 and p0.
func setUpNodeNetwork(ns *sandbox.Netns) (int, int, error) {
	nl := ns.Netlink()
	pod := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: podDevice, HardwareAddr: podDevMAC}, PeerName: podDevice + "p"}
	if err := nl.LinkAdd(pod); err != nil {
		return 0, 0, fmt.Errorf("add %s: %w", podDevice, err)
	}
	podLink, err := nl.LinkByName(podDevice)
	if err != nil {
		return 0, 0, err
	}
	podPeer, err := nl.LinkByName(podDevice + "p")
	if err != nil {
		return 0, 0, err
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: podGateway.Addr().AsSlice(), Mask: net.CIDRMask(podGateway.Bits(), 32)}}
	if err := nl.AddrAdd(podLink, gw); err != nil {
		return 0, 0, fmt.Errorf("address %s: %w", podDevice, err)
	}
	for _, l := range []netlink.Link{podPeer, podLink} {
		if err := nl.LinkSetUp(l); err != nil {
			return 0, 0, fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
		}
	}
	for i := 10; i < 40; i++ {
		neigh := &netlink.Neigh{LinkIndex: podLink.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(10, 244, 1, byte(i)), HardwareAddr: podMAC}
		if err := nl.NeighSet(neigh); err != nil {
			return 0, 0, fmt.Errorf("neighbour of pod %d: %w", i, err)
		}
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: device, HardwareAddr: deviceMAC}, PeerName: device + "p"}
	if err := nl.LinkAdd(veth); err != nil {
		return 0, 0, fmt.Errorf("add %s: %w", device, err)
	}
	link, err := nl.LinkByName(device)
	if err != nil {
		return 0, 0, err
	}
	peer, err := nl.LinkByName(device + "p")
	if err != nil {
		return 0, 0, err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: nodeAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}}
	if err := nl.AddrAdd(link, addr); err != nil {
		return 0, 0, fmt.Errorf("address %s: %w", device, err)
	}
	for _, l := range []netlink.Link{peer, link} {
		if err := nl.LinkSetUp(l); err != nil {
			return 0, 0, fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
		}
	}
	for _, n := range []struct {
		ip  netip.Addr
		mac net.HardwareAddr
	}{{nodeBAddr, nodeBMAC}, {routerAddr, routerMAC}} {
		neigh := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: n.ip.AsSlice(), HardwareAddr: n.mac}
		if err := nl.NeighSet(neigh); err != nil {
			return 0, 0, fmt.Errorf("neighbour %s: %w", n.ip, err)
		}
	}
	routes := []*netlink.Route{
		{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: nodeBPods.Addr().AsSlice(), Mask: net.CIDRMask(nodeBPods.Bits(), 32)}, Gw: nodeBAddr.AsSlice()},
		{LinkIndex: link.Attrs().Index, Gw: routerAddr.AsSlice()},
	}
	for _, r := range routes {
		if err := nl.RouteAdd(r); err != nil {
			return 0, 0, fmt.Errorf("route %v: %w", r, err)
		}
	}
	err = ns.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("enable forwarding: %w", err)
	}
	return link.Attrs().Index, podLink.Attrs().Index, nil
}

// sync programs the Services of st as the agent does.
func (f *fixture) sync(tb testing.TB, st *model.State) {
	tb.Helper()
	// Every node address gets NodePorts, a loopback one for the node's
	// own sockets, as with the agent's defaults.
	st.Node.NodePorts = everyAddress.Resolve(&st.Node, st.Node.Addrs)
	if err := f.w.Sync(model.Update{State: st, Full: true}); err != nil {
		tb.Fatal(err)
	}
}

// resetCT forgets every tracked flow.
func (f *fixture) resetCT(tb testing.TB) {
	tb.Helper()
	var (
		k    bpfobj.TcCt4Key
		keys []bpfobj.TcCt4Key
	)
	var v bpfobj.TcCt4Entry
	it := f.objs.Tc4CtV1.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		tb.Fatal(err)
	}
	for _, k := range keys {
		if err := f.objs.Tc4CtV1.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			tb.Fatal(err)
		}
	}
}

// counter is one of the programs' per-CPU counters summed over CPUs.
func (f *fixture) counter(tb testing.TB, m bpfobj.TcLbMetric) uint64 {
	tb.Helper()
	var perCPU []uint64
	if err := f.objs.LbMetricsV1.Lookup(uint32(m), &perCPU); err != nil {
		tb.Fatal(err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

// flows is the number of connection tracking entries.
func (f *fixture) flows(tb testing.TB) int {
	tb.Helper()
	return countEntries[bpfobj.TcCt4Key, bpfobj.TcCt4Entry](tb, f.objs.Tc4CtV1)
}

// countEntries is the number of entries of m, whose keys are Ks and values
// Vs.
func countEntries[K, V any](tb testing.TB, m *ebpf.Map) int {
	tb.Helper()
	var (
		k K
		v V
		n int
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		tb.Fatal(err)
	}
	return n
}

func be32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// service is a compact ServicePort description for the fixture's state.
type service struct {
	name      string
	clusterIP string
	port      uint16
	proto     model.Protocol
	nodePort  uint16
	extIPs    []string
	lbIPs     []string
	ranges    []string
	etpLocal  bool
	affinity  bool
	maglev    bool
	// endpoints are "ip:port@node".
	endpoints []string
	// terminating are endpoints ("ip:port@node") that are terminating
	// but still serving, as during a rollout.
	terminating []string
}

func state(svcs ...service) *model.State {
	st := &model.State{
		Node:     model.Node{Name: thisNode, Addrs: []netip.Addr{nodeAddr}},
		Services: map[model.ServicePortName]*model.Service{},
	}
	for _, s := range svcs {
		sp := builders.ModelServicePort("default", s.name, s.proto, netip.MustParseAddr(s.clusterIP), s.port)
		sp.NodePort = s.nodePort
		for _, a := range s.extIPs {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(a))
		}
		for _, a := range s.lbIPs {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(a))
		}
		for _, r := range s.ranges {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
		}
		if s.etpLocal {
			sp.ExternalPolicy = model.PolicyLocal
		}
		if s.affinity {
			sp.AffinityTimeout = model.DefaultAffinityTimeout
		}
		if s.maglev {
			sp.LBAlgorithm = model.LBMaglev
		}
		var eps []model.Endpoint
		for _, e := range s.endpoints {
			ap, node, _ := strings.Cut(e, "@")
			eps = append(eps, builders.ModelEndpoint(netip.MustParseAddrPort(ap), node))
		}
		for _, e := range s.terminating {
			ap, node, _ := strings.Cut(e, "@")
			eps = append(eps, builders.ModelEndpoint(netip.MustParseAddrPort(ap), node, builders.ModelTerminating))
		}
		st.Services[sp.Name] = builders.ModelService(sp, eps, &st.Node)
	}
	return st
}

// everyAddress is --nodeport-addresses unset, with
// --iptables-localhost-nodeports (the agent's defaults).
var everyAddress, _ = model.ParseNodePortSpec(nil, false, true)

// updateCT writes back every entry of the connection tracking map m that
// fn changed and returns true for.
func updateCT[K any, V any](tb testing.TB, m *ebpf.Map, fn func(*K, *V) bool) {
	tb.Helper()
	var (
		k  K
		v  V
		ks []K
		vs []V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if fn(&k, &v) {
			ks, vs = append(ks, k), append(vs, v)
		}
	}
	if err := it.Err(); err != nil {
		tb.Fatal(err)
	}
	for i := range ks {
		if err := m.Update(&ks[i], &vs[i], ebpf.UpdateExist); err != nil {
			tb.Fatal(err)
		}
	}
}
