package ipvs

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nodeaddrs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// kernelView is what a node's namespace holds of ours, per family.
type kernelView struct {
	services map[uint16][]vsKey // by address family
	addrs    map[bool][]netip.Addr
	sets     []string
	dummy    bool
}

func (v kernelView) hasService(k vsKey) bool {
	af := uint16(unix.AF_INET)
	if k.Addr.Is6() {
		af = unix.AF_INET6
	}
	return slices.Contains(v.services[af], k)
}

func look(t *testing.T, node *sandbox.Node) kernelView {
	t.Helper()
	v := kernelView{services: map[uint16][]vsKey{}, addrs: map[bool][]netip.Addr{}}
	svcs, err := handle(t, node).GetServices()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		if k, ok := keyOf(s); ok {
			v.services[s.AddressFamily] = append(v.services[s.AddressFamily], k)
		}
	}
	nl := node.NS.Netlink()
	if l, err := nl.LinkByName(DummyName); err == nil {
		v.dummy = true
		addrs, err := nl.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP)
			ip = ip.Unmap()
			if a.Flags&unix.IFA_F_TENTATIVE != 0 {
				t.Errorf("%s on %s is tentative (flags %#x): duplicate address detection holds it", ip, DummyName, a.Flags)
			}
			v.addrs[ip.Is6()] = append(v.addrs[ip.Is6()], ip)
		}
	}
	sets, err := nl.IpsetListAll()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		if strings.HasPrefix(s.SetName, xtables.Prefix) {
			v.sets = append(v.sets, s.SetName)
		}
	}
	return v
}

// TestFamiliesShareTheNodeWithoutUndoingEachOther runs both families'
// dataplanes in one namespace, as a dual-stack node does: one dummy
// interface, one IPVS table. A restart and full sync of one family, the
// removal of every Service of the other and the removal of one family's
// leftovers each leave the other family's virtual servers, addresses and
// ipsets as they were; Cleanup then removes both.
func TestFamiliesShareTheNodeWithoutUndoingEachOther(t *testing.T) {
	requireIPVS(t)
	node := nodeA(t)
	ns := node.NS.Path()
	ctx := behaviour.Context(t)
	src4 := example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...)
	src6 := example.NewSource6(t, example.Node6(example.NodeA)).Add(example.Example6()...)
	// The node's addresses, read as the agent reads them, pick where
	// each family serves NodePorts.
	var local []netip.Addr
	if err := node.NS.Do(func() (err error) {
		local, err = nodeaddrs.Local()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	src4.SetLocalAddrs(local)
	src6.SetLocalAddrs(local)
	start := func(ipv6 bool) *Dataplane {
		t.Helper()
		cidr := example.ClusterCIDR
		if ipv6 {
			cidr = example.ClusterCIDR6
		}
		d, err := New(ctx, Config{Netfilter: xtables.Netfilter{Netns: ns, IPv6: ipv6, ClusterCIDR: cidr}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		return d
	}
	d4, d6 := start(false), start(true)
	if err := d4.Sync(src4.Update()); err != nil {
		t.Fatal(err)
	}
	if err := d6.Sync(src6.Update()); err != nil {
		t.Fatal(err)
	}
	web4 := vsKey{Addr: netip.MustParseAddr("10.96.0.10"), Proto: model.TCP, Port: 80}
	web6 := vsKey{Addr: netip.MustParseAddr("fd00:10:96::10"), Proto: model.TCP, Port: 80}
	nodePort4 := vsKey{Addr: example.NodeAIP, Proto: model.TCP, Port: 30010}
	nodePort6 := vsKey{Addr: example.NodeAIP6, Proto: model.TCP, Port: 30010}
	sticky6 := vsKey{Addr: netip.MustParseAddr("fd00:10:96::14"), Proto: model.TCP, Port: 80}
	both := look(t, node)
	for _, k := range []vsKey{web4, web6, sticky6} {
		if !both.hasService(k) {
			t.Errorf("virtual server %s missing; IPv4 %v, IPv6 %v", k, both.services[unix.AF_INET], both.services[unix.AF_INET6])
		}
	}
	if !both.hasService(nodePort4) || !both.hasService(nodePort6) {
		t.Errorf("NodePort %s or %s missing; IPv4 %v, IPv6 %v", nodePort4, nodePort6, both.services[unix.AF_INET], both.services[unix.AF_INET6])
	}
	for _, k := range both.services[unix.AF_INET6] {
		if k.Addr.IsLoopback() {
			t.Errorf("virtual server %s on loopback: ::1 never serves NodePorts", k)
		}
	}
	if !slices.Contains(both.sets, "EBPFPROXY-6-CLUSTER-IP") || !slices.Contains(both.sets, setClusterIP) {
		t.Errorf("ipsets %v, want both families' cluster IP sets", both.sets)
	}
	// The IPv6 real servers are IPv6 ones, the persistence netmask 128.
	h := handle(t, node)
	if got := reals(t, h, web6); len(got) != 3 || got[netip.AddrPortFrom(example.PodA1v6, example.TCPTarget)] != 1 {
		t.Errorf("real servers of %s: %v, want the three IPv6 pods", web6, got)
	}
	svc, err := h.GetService(ipvsService(sticky6, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	if svc.AddressFamily != unix.AF_INET6 || svc.Netmask != 128 || svc.Flags&flagPersistent == 0 || svc.Timeout != 300 {
		t.Errorf("%s: family %d netmask %d flags %#x timeout %d, want AF_INET6, 128, persistent for 300 s",
			sticky6, svc.AddressFamily, svc.Netmask, svc.Flags, svc.Timeout)
	}

	// IPv4 restarts without web: its full sync removes web's IPv4 objects
	// and nothing of IPv6.
	d4.Close()
	d4 = start(false)
	src4.DeleteService(example.Example()[0].Service)
	up := src4.Update()
	up.Full = true
	if err := d4.Sync(up); err != nil {
		t.Fatal(err)
	}
	after := look(t, node)
	if after.hasService(web4) {
		t.Errorf("%s still there after its Service went", web4)
	}
	if !slices.Equal(sortedKeys(after.services[unix.AF_INET6]), sortedKeys(both.services[unix.AF_INET6])) ||
		!slices.Equal(sortedAddrs(after.addrs[true]), sortedAddrs(both.addrs[true])) {
		t.Errorf("the IPv4 dataplane's restart changed IPv6: virtual servers %v -> %v, addresses %v -> %v",
			both.services[unix.AF_INET6], after.services[unix.AF_INET6], both.addrs[true], after.addrs[true])
	}
	if got := reals(t, h, web6); len(got) != 3 {
		t.Errorf("real servers of %s after the IPv4 restart: %v", web6, got)
	}

	// Every IPv6 Service goes: IPv4 keeps all it had.
	before4 := look(t, node)
	for _, p := range example.Example6() {
		src6.DeleteService(p.Service)
	}
	if err := d6.Sync(src6.Update()); err != nil {
		t.Fatal(err)
	}
	gone6 := look(t, node)
	if len(gone6.services[unix.AF_INET6]) != 0 || len(gone6.addrs[true]) != 0 {
		t.Errorf("IPv6 left after its Services went: %v, %v", gone6.services[unix.AF_INET6], gone6.addrs[true])
	}
	if !slices.Equal(sortedKeys(gone6.services[unix.AF_INET]), sortedKeys(before4.services[unix.AF_INET])) ||
		!slices.Equal(sortedAddrs(gone6.addrs[false]), sortedAddrs(before4.addrs[false])) {
		t.Errorf("removing the IPv6 Services changed IPv4: virtual servers %v -> %v, addresses %v -> %v",
			before4.services[unix.AF_INET], gone6.services[unix.AF_INET], before4.addrs[false], gone6.addrs[false])
	}

	// The IPv6 Services return, then the node stops serving IPv6: its
	// ip6tables chains go, then RemoveFamilyLeftovers takes the rest of
	// IPv6 and leaves IPv4 serving.
	src6.Add(example.Example6()...)
	if err := d6.Sync(src6.Update()); err != nil {
		t.Fatal(err)
	}
	d6.Close()
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := xtables.CleanupAll(cctx, ns, xtables.Prefix, xtables.Keeping([]string{d4.Tools().String()})); err != nil {
		t.Fatal(err)
	}
	if err := RemoveFamilyLeftovers(cctx, ns, true); err != nil {
		t.Fatal(err)
	}
	only4 := look(t, node)
	if len(only4.services[unix.AF_INET6]) != 0 || len(only4.addrs[true]) != 0 || slices.ContainsFunc(only4.sets, isIPv6Set) {
		t.Errorf("IPv6 left after RemoveFamilyLeftovers: %v, %v, %v", only4.services[unix.AF_INET6], only4.addrs[true], only4.sets)
	}
	if !slices.Equal(sortedKeys(only4.services[unix.AF_INET]), sortedKeys(before4.services[unix.AF_INET])) || !only4.dummy ||
		!slices.Contains(only4.sets, setClusterIP) {
		t.Errorf("RemoveFamilyLeftovers(IPv6) changed IPv4: virtual servers %v -> %v, dummy %t, sets %v",
			before4.services[unix.AF_INET], only4.services[unix.AF_INET], only4.dummy, only4.sets)
	}

	// A fresh IPv6 dataplane, then Cleanup: nothing of either family.
	d6 = start(true)
	if err := d6.Sync(src6.Update()); err != nil {
		t.Fatal(err)
	}
	d4.Close()
	d6.Close()
	if err := Cleanup(cctx, ns); err != nil {
		t.Fatal(err)
	}
	clean := look(t, node)
	if len(clean.services[unix.AF_INET])+len(clean.services[unix.AF_INET6]) != 0 || clean.dummy || len(clean.sets) != 0 {
		t.Errorf("after Cleanup: virtual servers %v, dummy %t, sets %v", clean.services, clean.dummy, clean.sets)
	}
}

func isIPv6Set(name string) bool { return strings.HasPrefix(name, familyIPv6.setPrefix) }

func sortedKeys(ks []vsKey) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.String())
	}
	slices.Sort(out)
	return out
}

func sortedAddrs(as []netip.Addr) []netip.Addr {
	out := slices.Clone(as)
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// TestHandoverDeletesAFamilysVirtualServersAtOnce checks what a mode
// taking over from IPVS removes at the first write of a family: that
// family's virtual servers, listed before, and nothing else (the other
// family's servers, a foreign one, the dummy interface and the ipsets
// stay for the removal after every family's first sync), once.
func TestHandoverDeletesAFamilysVirtualServersAtOnce(t *testing.T) {
	requireIPVS(t)
	node := nodeA(t)
	ns := node.NS.Path()
	ctx := behaviour.Context(t)
	h := handle(t, node)
	foreign := ipvsService(vsKey{Addr: node.IP, Proto: model.TCP, Port: 8443}, "rr", 0)
	if err := h.NewService(foreign); err != nil {
		t.Fatal(err)
	}
	for _, ipv6 := range []bool{false, true} {
		cidr, src := example.ClusterCIDR, example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...)
		if ipv6 {
			cidr, src = example.ClusterCIDR6, example.NewSource6(t, example.Node6(example.NodeA)).Add(example.Example6()...)
		}
		d, err := New(ctx, Config{Netfilter: xtables.Netfilter{Netns: ns, IPv6: ipv6, ClusterCIDR: cidr}})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(src.Update()); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
	before := look(t, node)
	if len(before.services[unix.AF_INET]) < 2 || len(before.services[unix.AF_INET6]) == 0 {
		t.Fatalf("virtual servers %v: want both families'", before.services)
	}
	remove, err := Handover(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	n, err := remove("IPv4")
	if err != nil {
		t.Fatal(err)
	}
	// The foreign server is on the node's address, not ours.
	if want := len(before.services[unix.AF_INET]) - 1; n != want {
		t.Errorf("the IPv4 handover removed %d virtual servers, want %d", n, want)
	}
	after := look(t, node)
	if got := after.services[unix.AF_INET]; len(got) != 1 || !h.IsServicePresent(foreign) {
		t.Errorf("IPv4 virtual servers after the IPv4 handover: %v, want only the foreign %s:8443", got, node.IP)
	}
	if !slices.Equal(sortedKeys(after.services[unix.AF_INET6]), sortedKeys(before.services[unix.AF_INET6])) {
		t.Errorf("the IPv4 handover changed IPv6: %v -> %v", before.services[unix.AF_INET6], after.services[unix.AF_INET6])
	}
	if !after.dummy || len(after.sets) != len(before.sets) {
		t.Errorf("the handover removed more than virtual servers: dummy %v, ipsets %v -> %v", after.dummy, before.sets, after.sets)
	}
	if n, err := remove("IPv4"); n != 0 || err != nil {
		t.Errorf("a second IPv4 handover removed %d (%v), want nothing", n, err)
	}
	if n, err := remove("IPv6"); n != len(before.services[unix.AF_INET6]) || err != nil {
		t.Errorf("the IPv6 handover removed %d (%v), want %d", n, err, len(before.services[unix.AF_INET6]))
	}
	if got := look(t, node).services[unix.AF_INET6]; len(got) != 0 {
		t.Errorf("IPv6 virtual servers left after the IPv6 handover: %v", got)
	}
}
