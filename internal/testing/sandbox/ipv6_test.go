package sandbox_test

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func TestIPv6OfFollowsTheAddressPlan(t *testing.T) {
	tests := []struct {
		v4, want string // want "" for the zero Addr
	}{
		{"10.244.1.10", "fd00:10:244:1::10"},
		{"10.244.2.100", "fd00:10:244:2::100"},
		{"10.244.1.1", "fd00:10:244:1::1"},
		{"10.244.200.255", "fd00:10:244:c8::255"},
		{"192.168.77.1", "fd00:192:168:77::1"},
		{"192.168.77.11", "fd00:192:168:77::11"},
		{"198.18.0.10", "fd00:198:18::10"},
		{"198.19.0.10", "fd00:198:19::10"},
		{"10.96.0.10", "fd00:10:96::10"},
		{"10.96.9.255", "fd00:10:96::9255"},
		{"10.96.1.2", "fd00:10:96::1002"},
		{"::ffff:10.244.1.10", "fd00:10:244:1::10"},
		{"8.8.8.8", ""},
		{"127.0.0.1", ""},
		{"10.245.0.1", ""},
		{"10.96.10.1", ""}, // a ClusterIP without a twin
		{"fd00:10:244:1::10", ""},
	}
	for _, tt := range tests {
		got := sandbox.IPv6Of(netip.MustParseAddr(tt.v4))
		if tt.want == "" {
			if got.IsValid() {
				t.Errorf("IPv6Of(%s) = %s, want the zero Addr (outside the plan)", tt.v4, got)
			}
			continue
		}
		if got != netip.MustParseAddr(tt.want) {
			t.Errorf("IPv6Of(%s) = %s, want %s", tt.v4, got, tt.want)
		}
	}
	// Every IPv4 network's addresses land in its twin, each on its own
	// address (ClusterIPs up to 10.96.9.255).
	for _, tw := range []struct{ v4, v6 netip.Prefix }{
		{sandbox.PodCIDR, sandbox.PodCIDR6},
		{sandbox.ServiceCIDR, sandbox.ServiceCIDR6},
		{sandbox.NodeCIDR, sandbox.NodeCIDR6},
		{sandbox.ExternalCIDR, sandbox.ExternalCIDR6},
		{sandbox.LoadBalancerCIDR, sandbox.LoadBalancerCIDR6},
	} {
		seen := map[netip.Addr]netip.Addr{}
		for a := tw.v4.Masked().Addr(); tw.v4.Contains(a); a = a.Next() {
			got := sandbox.IPv6Of(a)
			if tw.v4 == sandbox.ServiceCIDR && a.As4()[2] >= 10 {
				// ClusterIPs 10.96.10.0 and up have no twin.
				if got.IsValid() {
					t.Fatalf("IPv6Of(%s) = %s, want the zero Addr", a, got)
				}
				continue
			}
			if !tw.v6.Contains(got) {
				t.Fatalf("IPv6Of(%s) = %s, not in %s", a, got, tw.v6)
			}
			if prev, ok := seen[got]; ok {
				t.Fatalf("IPv6Of(%s) = IPv6Of(%s) = %s", a, prev, got)
			}
			seen[got] = a
		}
	}
}

// dualStack is two nodes with a pod each, a client beside pod-a, an external
// client and a LoadBalancer IP of each family held by node2, with servers
// on the pods and on both nodes.
type dualStack struct {
	sb           *sandbox.Sandbox
	node1, node2 *sandbox.Node
	podA, podC   *sandbox.Pod
	client, ext  *sandbox.Client
	lb4, lb6     netip.Addr
}

func newDualStack(t *testing.T) *dualStack {
	t.Helper()
	d := &dualStack{sb: sandbox.ForTest(t)}
	d.node1 = must(d.sb.AddNode("node1"))(t)
	d.node2 = must(d.sb.AddNode("node2"))(t)
	d.podA = must(d.sb.AddServingPod(d.node1, "pod-a", netip.Addr{}, 80, 53))(t)
	d.podC = must(d.sb.AddServingPod(d.node2, "pod-c", netip.Addr{}, 80, 53))(t)
	d.client = must(d.sb.AddClient(d.node1, "client", clientIP))(t)
	d.ext = must(d.sb.AddExternalClient("ext", netip.Addr{}))(t)
	for _, h := range []*sandbox.Host{d.podA.Host, d.podC.Host, d.node1.Host, d.node2.Host} {
		if h != d.podA.Host && h != d.podC.Host {
			must(h.StartTCPServer(80))(t)
			must(h.StartUDPServer(53))(t)
		}
		must(h.StartHTTPServer(8081))(t)
	}
	d.lb4 = netip.MustParseAddr("198.19.0.10")
	d.lb6 = sandbox.IPv6Of(d.lb4)
	nl := d.node2.NS.Netlink()
	lo := must(nl.LinkByName("lo"))(t)
	for _, ip := range []netip.Addr{d.lb4, d.lb6} {
		if err := nl.AddrAdd(lo, must(netlinkAddr(ip))(t)); err != nil {
			t.Fatal(err)
		}
		if err := d.sb.RouteToNode(netip.PrefixFrom(ip, ip.BitLen()), d.node2); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestEveryHostHasItsIPv6Address(t *testing.T) {
	sandbox.RequireRoot(t)
	d := newDualStack(t)
	mustAddr := netip.MustParseAddr
	mustPrefix := netip.MustParsePrefix
	if d.node1.PodCIDR6 != mustPrefix("fd00:10:244:1::/64") || d.node2.PodCIDR6 != mustPrefix("fd00:10:244:2::/64") ||
		d.node1.Gateway6 != mustAddr("fd00:10:244:1::1") || d.node2.Gateway6 != mustAddr("fd00:10:244:2::1") {
		t.Errorf("pod subnets %s, %s with gateways %s, %s; want node i's fd00:10:244:i::/64 with gateway ::1",
			d.node1.PodCIDR6, d.node2.PodCIDR6, d.node1.Gateway6, d.node2.Gateway6)
	}
	want := map[*sandbox.Host]string{
		d.sb.Router:   "fd00:192:168:77::1",
		d.node1.Host:  "fd00:192:168:77::11",
		d.node2.Host:  "fd00:192:168:77::12",
		d.podA.Host:   "fd00:10:244:1::10",
		d.podC.Host:   "fd00:10:244:2::10",
		d.client.Host: "fd00:10:244:1::100",
		d.ext.Host:    "fd00:198:18::10",
	}
	for h, w := range want {
		if h.IP6 != mustAddr(w) || h.IP6 != sandbox.IPv6Of(h.IP) {
			t.Errorf("%s has IPv6 address %s, want %s, IPv6Of(%s)", h.Name, h.IP6, w, h.IP)
		}
	}
	// Each address is on the host's interface, usable at once: neither
	// tentative (duplicate address detection) nor failed.
	for _, h := range []*sandbox.Host{d.node1.Host, d.podA.Host, d.client.Host, d.ext.Host} {
		checkIPv6Addr(t, h.NS, sandbox.IfaceName, h.IP6)
	}
	checkIPv6Addr(t, d.node1.NS, sandbox.BridgeName, d.node1.Gateway6)
	checkIPv6Addr(t, d.node2.NS, sandbox.BridgeName, d.node2.Gateway6)
}

// checkIPv6Addr asserts that the interface iface in ns holds ip with a /64
// and that the address is ready for use.
func checkIPv6Addr(t *testing.T, ns *sandbox.Netns, iface string, ip netip.Addr) {
	t.Helper()
	nl := ns.Netlink()
	link := must(nl.LinkByName(iface))(t)
	addrs := must(nl.AddrList(link, netlink.FAMILY_V6))(t)
	i := slices.IndexFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(ip.AsSlice()) })
	if i < 0 {
		t.Errorf("%s in %s has no address %s: %v", iface, ns.Name(), ip, addrs)
		return
	}
	a := addrs[i]
	if ones, _ := a.Mask.Size(); ones != 64 {
		t.Errorf("%s in %s holds %s/%d, want /64", iface, ns.Name(), ip, ones)
	}
	if a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
		t.Errorf("%s in %s holds %s with flags %#x, want it usable at once", iface, ns.Name(), ip, a.Flags)
	}
}

func TestIPv6RoutesLeadThroughTheNodes(t *testing.T) {
	sandbox.RequireRoot(t)
	d := newDualStack(t)
	type route struct{ dst, via string } // dst "" for the default route
	tests := []struct {
		host *sandbox.Host
		want []route
	}{
		{d.sb.Router, []route{
			{"fd00:10:244:1::/64", "fd00:192:168:77::11"},
			{"fd00:10:244:2::/64", "fd00:192:168:77::12"},
			{d.lb6.String() + "/128", "fd00:192:168:77::12"},
		}},
		{d.node1.Host, []route{{"", "fd00:192:168:77::1"}, {"fd00:10:244:2::/64", "fd00:192:168:77::12"}}},
		{d.node2.Host, []route{{"", "fd00:192:168:77::1"}, {"fd00:10:244:1::/64", "fd00:192:168:77::11"}}},
		{d.podA.Host, []route{{"", "fd00:10:244:1::1"}}},
		{d.ext.Host, []route{{"", "fd00:198:18::1"}}},
	}
	for _, tt := range tests {
		routes := must(tt.host.NS.Netlink().RouteList(nil, netlink.FAMILY_V6))(t)
		for _, w := range tt.want {
			found := slices.ContainsFunc(routes, func(r netlink.Route) bool {
				dst := ""
				if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
					dst = r.Dst.String()
				}
				return dst == w.dst && r.Gw.Equal(net.ParseIP(w.via))
			})
			if !found {
				t.Errorf("%s has no IPv6 route to %q via %s: %v", tt.host.Name, w.dst, w.via, routes)
			}
		}
	}
}

func TestIPv6TrafficCrossesTheSandbox(t *testing.T) {
	sandbox.RequireRoot(t)
	d := newDualStack(t)
	node1 := d.sb.ClientAt(d.node1.Host)
	podA := d.sb.ClientAt(d.podA.Host)
	tests := []struct {
		name       string
		probe      probe
		from       *sandbox.Client
		dst        netip.AddrPort
		server     string
		clientSeen netip.Addr
	}{
		{"tcp from a pod to a pod on another node", tcpProbe, podA, ap(d.podC.IP6, 80), "pod-c", d.podA.IP6},
		{"udp sendto from a pod to a pod on another node", udpProbe, podA, ap(d.podC.IP6, 53), "pod-c", d.podA.IP6},
		{"connected udp from a pod to a pod on another node", udpConnectedProbe, podA, ap(d.podC.IP6, 53), "pod-c", d.podA.IP6},
		{"http from a client to a pod on another node", httpProbe, d.client, ap(d.podC.IP6, 8081), "pod-c", d.client.IP6},
		{"tcp from a client to a pod on its own node", tcpProbe, d.client, ap(d.podA.IP6, 80), "pod-a", d.client.IP6},
		{"tcp from an external client to a node", tcpProbe, d.ext, ap(d.node2.IP6, 80), "node2", d.ext.IP6},
		{"connected udp from an external client to a node", udpConnectedProbe, d.ext, ap(d.node1.IP6, 53), "node1", d.ext.IP6},
		{"tcp from an external client to a pod through the router", tcpProbe, d.ext, ap(d.podA.IP6, 80), "pod-a", d.ext.IP6},
		{"tcp from an external client to a LoadBalancer IP routed to node2", tcpProbe, d.ext, ap(d.lb6, 80), "node2", d.ext.IP6},
		{"tcp from a pod to its own node", tcpProbe, podA, ap(d.node1.IP6, 80), "node1", d.podA.IP6},
		// The node answers from the address asked, not from its bridge
		// address that the route back to the pod would pick.
		{"connected udp from a pod to its own node", udpConnectedProbe, podA, ap(d.node1.IP6, 53), "node1", d.podA.IP6},
		{"udp sendto from a pod to its own node", udpProbe, podA, ap(d.node1.IP6, 53), "node1", d.podA.IP6},
		{"http from a pod to its own node", httpProbe, podA, ap(d.node1.IP6, 8081), "node1", d.podA.IP6},
		{"tcp from a node to its own pod, from its bridge address", tcpProbe, node1, ap(d.podA.IP6, 80), "pod-a", d.node1.Gateway6},
		{"tcp from a node to another node's pod, from its node address", tcpProbe, node1, ap(d.podC.IP6, 80), "pod-c", d.node1.IP6},
		// The same servers still answer IPv4 and name the client by its
		// IPv4 address.
		{"tcp over IPv4 from a pod to a pod on another node", tcpProbe, podA, ap(d.podC.IP, 80), "pod-c", d.podA.IP},
		{"connected udp over IPv4 from a pod to its own node", udpConnectedProbe, podA, ap(d.node1.IP, 53), "node1", d.podA.IP},
		{"http over IPv4 from an external client to a pod", httpProbe, d.ext, ap(d.podC.IP, 8081), "pod-c", d.ext.IP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proc, answers := tt.probe(t, tt.from, tt.dst)
			checkProcess(t, d.sb, tt.from, proc)
			for _, a := range answers {
				if a.err != "" {
					t.Errorf("attempt failed: %s", a.err)
					continue
				}
				if a.server != tt.server {
					t.Errorf("answered by %q, want %q", a.server, tt.server)
				}
				if a.clientSeen.Addr() != tt.clientSeen || a.clientSeen.Port() != a.local.Port() {
					t.Errorf("server saw client %s, client socket is %s (want address %s)", a.clientSeen, a.local, tt.clientSeen)
				}
				if a.peer != tt.dst {
					t.Errorf("peer is %s, want %s", a.peer, tt.dst)
				}
			}
		})
	}
}

func TestIPv6ClusterIPHasNoRoute(t *testing.T) {
	sandbox.RequireRoot(t)
	d := newDualStack(t)
	clusterIP := sandbox.IPv6Of(netip.MustParseAddr("10.96.0.10"))
	if !sandbox.ServiceCIDR6.Contains(clusterIP) {
		t.Fatalf("ClusterIP %s is not in %s", clusterIP, sandbox.ServiceCIDR6)
	}
	// The router's ICMPv6 error comes back within the connect() call, while
	// the kernel holds the socket (TcpExt LockDroppedIcmps); IPv6 TCP then
	// reports it only at the first SYN retransmission, a second later.
	rep, err := d.client.TCP(t.Context(), ap(clusterIP, 80), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Results[0].Err; got != "ENETUNREACH" {
		t.Errorf("tcp to the ClusterIP %s without a proxy: error %q, want ENETUNREACH (no route off the sandbox)", clusterIP, got)
	}
}

// TestServersNameIPv4ClientsPlainly reads the servers' lines themselves:
// the probes' parser would hide an IPv4-mapped address.
func TestServersNameIPv4ClientsPlainly(t *testing.T) {
	sandbox.RequireRoot(t)
	c := newCluster(t)
	udp := c.podAServers["udp"]
	tcp := c.podAServers["tcp"]
	for _, tt := range []struct {
		network string
		dst     netip.AddrPort
	}{
		{"tcp4", tcp.Addr}, {"udp4", udp.Addr}, {"tcp6", tcp.Addr6}, {"udp6", udp.Addr6},
	} {
		t.Run(tt.network, func(t *testing.T) {
			var line, local string
			err := c.client.NS.Do(func() error {
				conn, err := net.DialTimeout(tt.network, tt.dst.String(), 2*time.Second)
				if err != nil {
					return err
				}
				defer conn.Close()
				local = conn.LocalAddr().String()
				_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
				if strings.HasPrefix(tt.network, "udp") {
					if _, err := conn.Write([]byte("ping\n")); err != nil {
						return err
					}
				}
				line, err = bufio.NewReader(conn).ReadString('\n')
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := "pod-a " + local + "\n"; line != want {
				t.Errorf("server line %q, want %q", line, want)
			}
		})
	}
}

func TestIPv6SettingsArePerNamespace(t *testing.T) {
	sandbox.RequireRoot(t)
	keys := []string{"all/forwarding", "all/accept_dad", "default/accept_dad", "all/accept_ra", "default/accept_ra"}
	read := func(key string) (string, error) {
		b, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv6/conf", key))
		return strings.TrimSpace(string(b)), err
	}
	before := map[string]string{}
	for _, k := range keys {
		before[k] = must(read(k))(t)
	}
	sb := sandbox.ForTest(t)
	node := must(sb.AddNode("node1"))(t)
	pod := must(sb.AddPod(node, "pod-a", netip.Addr{}))(t)
	for _, tt := range []struct {
		host *sandbox.Host
		want map[string]string
	}{
		{sb.Router, map[string]string{"all/forwarding": "1", "all/accept_dad": "0"}},
		{node.Host, map[string]string{"all/forwarding": "1", "all/accept_dad": "0", "eth0/accept_dad": "0", "br0/accept_dad": "0"}},
		{pod.Host, map[string]string{"all/forwarding": "0", "all/accept_dad": "0", "eth0/accept_dad": "0", "eth0/accept_ra": "0"}},
	} {
		err := tt.host.NS.Do(func() error {
			for k, w := range tt.want {
				got, err := read(k)
				if err != nil {
					return err
				}
				if got != w {
					t.Errorf("%s: net.ipv6.conf.%s = %s, want %s", tt.host.Name, strings.ReplaceAll(k, "/", "."), got, w)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		if after := must(read(k))(t); after != before[k] {
			t.Errorf("host's net.ipv6.conf.%s changed from %s to %s", k, before[k], after)
		}
	}
}
