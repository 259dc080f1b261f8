package ipvs

import (
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// The IPv6 sets carry EBPFPROXY-6-, as upstream's KUBE-6- ones, so that the
// two families' dataplanes never share a set, and every name fits ipset's
// 31 characters.
func TestSetNamesDifferPerFamily(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range families {
		for _, s := range ipsetTypes {
			name := f.set(s.name)
			if len(name) > 31 {
				t.Errorf("%s set %s: %d characters, ipset allows 31", f.name, name, len(name))
			}
			if seen[name] {
				t.Errorf("set name %s used twice", name)
			}
			seen[name] = true
		}
	}
	if got := familyIPv6.set(setHairpin); got != "EBPFPROXY-6-HAIRPIN" {
		t.Errorf("IPv6 hairpin set is %q, want EBPFPROXY-6-HAIRPIN", got)
	}
	if got := familyIPv4.set(setHairpin); got != setHairpin {
		t.Errorf("IPv4 hairpin set is %q, want %q", got, setHairpin)
	}
}

// A virtual server and its real servers take their address's family; the
// persistence netmask keeps one client address in either (upstream's
// 0xffffffff and 128).
func TestKernelObjectsTakeTheAddressFamily(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		af      uint16
		netmask uint32
	}{
		{"10.96.0.14", unix.AF_INET, 0xffffffff},
		{"fd00:10:96::14", unix.AF_INET6, 128},
	} {
		key := vsKey{Addr: netip.MustParseAddr(tc.addr), Proto: model.TCP, Port: 80}
		s := ipvsService(key, "rr", 300*time.Second)
		if s.AddressFamily != tc.af || s.Netmask != tc.netmask {
			t.Errorf("%s: virtual server of family %d netmask %#x, want %d %#x", key, s.AddressFamily, s.Netmask, tc.af, tc.netmask)
		}
		if s.Flags&flagPersistent == 0 || s.Timeout != 300 {
			t.Errorf("%s: flags %#x timeout %d, want persistent for 300 s", key, s.Flags, s.Timeout)
		}
		if back, ok := keyOf(s); !ok || back != key {
			t.Errorf("%s: read back as %s (%t)", key, back, ok)
		}
		rs := netip.AddrPortFrom(key.Addr, 8080)
		if d := destination(rs, 1); d.AddressFamily != tc.af || destKey(d) != rs {
			t.Errorf("%s: real server of family %d at %s", rs, d.AddressFamily, destKey(d))
		}
	}
}

// IPv6 Service addresses are bound as /128 without duplicate address
// detection; IPv4 ones as /32.
func TestDummyAddressesAreHostsAndIPv6SkipsDAD(t *testing.T) {
	a4 := hostAddr(netip.MustParseAddr("10.96.0.10"))
	if ones, bits := a4.Mask.Size(); ones != 32 || bits != 32 || a4.Flags&unix.IFA_F_NODAD != 0 {
		t.Errorf("IPv4 address %s flags %#x, want a /32 with no flags", a4.IPNet, a4.Flags)
	}
	a6 := hostAddr(netip.MustParseAddr("fd00:10:96::10"))
	if ones, bits := a6.Mask.Size(); ones != 128 || bits != 128 || a6.Flags&unix.IFA_F_NODAD == 0 {
		t.Errorf("IPv6 address %s flags %#x, want a /128 with nodad", a6.IPNet, a6.Flags)
	}
	if !a6.IP.Equal(net.ParseIP("fd00:10:96::10")) {
		t.Errorf("IPv6 address is %s", a6.IP)
	}
}

// A host entry of a three-dimensional set carries no CIDR in either
// family; a range keeps its own.
func TestSetEntriesOfBothFamilies(t *testing.T) {
	for _, tc := range []struct {
		e        setEntry
		want     string
		wantCIDR uint8
	}{
		{setEntry{Set: setHairpin, IP: example.PodA1v6, Proto: model.TCP, Port: 8080, IP2: example.PodA1v6, CIDR2: 128},
			"fd00:10:244:1::10,tcp:8080,fd00:10:244:1::10", 0},
		{setEntry{Set: setLBSource, IP: netip.MustParseAddr("fd00:198:19::13"), Proto: model.TCP, Port: 80, IP2: netip.MustParseAddr("fd00:198:18::"), CIDR2: 120},
			"fd00:198:19::13,tcp:80,fd00:198:18::/120", 120},
		{setEntry{Set: setHairpin, IP: example.PodA1, Proto: model.UDP, Port: 5353, IP2: example.PodA1, CIDR2: 32},
			"10.244.1.10,udp:5353,10.244.1.10", 0},
	} {
		if got := tc.e.String(); got != tc.want {
			t.Errorf("entry renders as %q, want %q", got, tc.want)
		}
		if ne := netlinkEntry(tc.e); ne.CIDR2 != tc.wantCIDR {
			t.Errorf("%s: netlink CIDR2 %d, want %d", tc.want, ne.CIDR2, tc.wantCIDR)
		}
	}
}

// NodePorts are served on the node's addresses of the family, never on
// loopback (::1 as upstream; 127.0.0.0/8 needs route_localnet, never set).
func TestNodePortsSkipLoopbackAndTheOtherFamily(t *testing.T) {
	src := example.NewSource6(t, example.Node6(example.NodeA)).Add(example.Example6()...)
	state := src.Update().State
	cfg := Config{Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: example.ClusterCIDR6}}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	r := renderer{cfg: &cfg, nodePortIPs: []netip.Addr{example.NodeAIP6, netip.IPv6Loopback(), example.NodeAIP}}
	var nodePorts []string
	for _, svc := range state.Services {
		for _, vs := range r.service(svc).Servers {
			if vs.Kind == "NodePort" {
				nodePorts = append(nodePorts, vs.Key.Addr.String())
			}
		}
	}
	if len(nodePorts) == 0 {
		t.Fatal("no NodePort virtual server rendered")
	}
	for _, a := range nodePorts {
		if a != example.NodeAIP6.String() {
			t.Errorf("NodePort virtual server on %s, want only %s", a, example.NodeAIP6)
		}
	}
}

// Every virtual server, real server, address and set entry the IPv6
// dataplane renders is IPv6, so that its sync never touches IPv4 objects.
func TestIPv6RenderingHoldsIPv6Only(t *testing.T) {
	src := example.NewSource6(t, example.Node6(example.NodeA)).Add(example.Example6()...)
	cfgs := render(t, Config{Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: example.ClusterCIDR6, NodeIPs: []netip.Addr{example.NodeAIP6}}}, src.Update().State)
	var addrs []netip.Addr
	for _, c := range cfgs {
		addrs = append(addrs, c.Addrs...)
		for _, vs := range c.Servers {
			addrs = append(addrs, vs.Key.Addr)
			for _, rs := range vs.Reals {
				addrs = append(addrs, rs.Addr())
			}
		}
		for _, e := range c.Entries {
			addrs = append(addrs, e.IP)
			if e.IP2.IsValid() {
				addrs = append(addrs, e.IP2)
			}
		}
	}
	if len(addrs) == 0 {
		t.Fatal("nothing rendered")
	}
	if i := slices.IndexFunc(addrs, func(a netip.Addr) bool { return !a.Is6() }); i >= 0 {
		t.Errorf("the IPv6 rendering holds %s", addrs[i])
	}
}
