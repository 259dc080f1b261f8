package sandbox

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The address plan of the project's tests. All of these exist only inside
// sandbox namespaces.
var (
	// PodCIDR holds every pod; node i (from 1) gets 10.244.i.0/24.
	PodCIDR = netip.MustParsePrefix("10.244.0.0/16")
	// ServiceCIDR is where tests allocate ClusterIPs. No route leads there:
	// only a proxy's translation makes these addresses reachable.
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	// NodeCIDR is the node network; the router is .1, node i is .(10+i).
	NodeCIDR = netip.MustParsePrefix("192.168.77.0/24")
	// ExternalCIDR holds clients outside the cluster; the router is .1.
	ExternalCIDR = netip.MustParsePrefix("198.18.0.0/24")
	// LoadBalancerCIDR is where tests allocate LoadBalancer and external
	// IPs; see RouteToNode.
	LoadBalancerCIDR = netip.MustParsePrefix("198.19.0.0/24")
)

// Interface names used in every sandbox.
const (
	// IfaceName is a pod's, client's and external client's only interface,
	// and a node's uplink to the router.
	IfaceName = "eth0"
	// BridgeName is the bridge in a node that its pods are attached to.
	BridgeName = "br0"

	routerLAN      = "lan0"
	routerExternal = "ext0"
	maxNodes       = 200

	// linkActiveTimeout bounds the wait for the kernel to activate a new
	// link, normally a few milliseconds.
	linkActiveTimeout = 5 * time.Second
)

var (
	routerLANAddr       = netip.MustParseAddr("192.168.77.1")
	routerExternalAddr  = netip.MustParseAddr("198.18.0.1")
	routerLANAddr6      = IPv6Of(routerLANAddr)
	routerExternalAddr6 = IPv6Of(routerExternalAddr)
)

// Host is one network namespace of a sandbox with its main addresses, one of
// each IP family: a node, a pod, a client or the router.
type Host struct {
	// Name is the host's name in the sandbox; servers report it.
	Name string
	// NS is the host's network namespace.
	NS *Netns
	// IP is the host's main IPv4 address: a pod's or client's IP, a node's
	// address on the node network.
	IP netip.Addr
	// IP6 is the host's main IPv6 address, IPv6Of(IP), on the same
	// interface.
	IP6 netip.Addr

	mu      sync.Mutex
	closed  bool
	servers []*Server
}

// Node is a host standing for a Kubernetes node: a bridge for its pods
// (br0, holding the pods' gateway address) and an uplink (eth0) to the node
// network. It forwards between the two, like a node running a CNI bridge.
type Node struct {
	*Host
	// Index numbers the node from 1 and selects its pod subnet.
	Index int
	// PodCIDR is the node's pod subnet, 10.244.<Index>.0/24.
	PodCIDR netip.Prefix
	// PodCIDR6 is the node's IPv6 pod subnet, fd00:10:244:<Index in
	// hex>::/64, the twin of PodCIDR.
	PodCIDR6 netip.Prefix
	// Gateway is the node's address on its bridge, its pods' default route.
	Gateway netip.Addr
	// Gateway6 is the node's IPv6 address on its bridge (IPv6Of(Gateway),
	// ::1 of PodCIDR6), its pods' IPv6 default route.
	Gateway6 netip.Addr

	used map[netip.Addr]bool
}

// Pod is a host attached to a node's bridge by a veth pair.
type Pod struct {
	*Host
	// Node is the node the pod runs on.
	Node *Node
	// HostVeth is the name of the pod's veth peer inside the node namespace.
	HostVeth string
}

// addRouter creates the router namespace: bridges for the node network and
// the external network, and nothing else.
func (s *Sandbox) addRouter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.register("router"); err != nil {
		return err
	}
	h, err := s.newHost("router", routerLANAddr)
	if err != nil {
		return err
	}
	s.Router = h
	nl := h.NS.Netlink()
	if err := addBridge(nl, routerLAN, netip.PrefixFrom(routerLANAddr, NodeCIDR.Bits()),
		netip.PrefixFrom(routerLANAddr6, NodeCIDR6.Bits())); err != nil {
		return err
	}
	if err := addBridge(nl, routerExternal, netip.PrefixFrom(routerExternalAddr, ExternalCIDR.Bits()),
		netip.PrefixFrom(routerExternalAddr6, ExternalCIDR6.Bits())); err != nil {
		return err
	}
	return h.NS.Do(enableForwarding)
}

// AddNode adds a node. Node i (counting from 1) gets pod subnet 10.244.i.0/24
// with gateway 10.244.i.1 and node address 192.168.77.(10+i), and their IPv6
// twins (see IPv6Of): pod subnet fd00:10:244:i::/64 with gateway
// fd00:10:244:i::1 and node address fd00:192:168:77::(10+i), i in hex. Nodes
// reach each other's pods directly in both families; their default routes
// lead to the router.
func (s *Sandbox) AddNode(name string) (*Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.register(name); err != nil {
		return nil, err
	}
	idx := len(s.nodes) + 1
	if idx > maxNodes {
		return nil, fmt.Errorf("add node %s: at most %d nodes", name, maxNodes)
	}
	n := &Node{
		Index:   idx,
		PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(idx), 0}), 24),
		Gateway: netip.AddrFrom4([4]byte{10, 244, byte(idx), 1}),
		used:    map[netip.Addr]bool{},
	}
	n.PodCIDR6 = netip.PrefixFrom(IPv6Of(n.PodCIDR.Addr()), 64)
	n.Gateway6 = IPv6Of(n.Gateway)
	h, err := s.newHost(name, netip.AddrFrom4([4]byte{192, 168, 77, byte(10 + idx)}))
	if err != nil {
		return nil, fmt.Errorf("add node %s: %w", name, err)
	}
	n.Host = h
	if err := s.setUpNode(n); err != nil {
		return nil, fmt.Errorf("add node %s: %w", name, err)
	}
	s.nodes = append(s.nodes, n)
	return n, nil
}

func (s *Sandbox) setUpNode(n *Node) error {
	nl := n.NS.Netlink()
	if err := addBridge(nl, BridgeName, netip.PrefixFrom(n.Gateway, n.PodCIDR.Bits()),
		netip.PrefixFrom(n.Gateway6, n.PodCIDR6.Bits())); err != nil {
		return err
	}
	if err := s.attach(s.Router, routerLAN, fmt.Sprintf("node%d", n.Index), n.Host,
		ifaceAddr{netip.PrefixFrom(n.IP, NodeCIDR.Bits()), routerLANAddr},
		ifaceAddr{netip.PrefixFrom(n.IP6, NodeCIDR6.Bits()), routerLANAddr6}); err != nil {
		return err
	}
	if err := n.NS.Do(enableForwarding); err != nil {
		return err
	}
	// Each node's pod subnets are reached through that node: from the
	// router and from every other node.
	if err := routePodsVia(s.Router.NS.Netlink(), n); err != nil {
		return err
	}
	for _, other := range s.nodes {
		if err := routePodsVia(nl, other); err != nil {
			return err
		}
		if err := routePodsVia(other.NS.Netlink(), n); err != nil {
			return err
		}
	}
	return nil
}

// AddPod adds a pod named name on node with address ip, which must lie in
// the node's PodCIDR; the zero Addr picks the next free one from .10 on. The
// pod's IPv6 address is IPv6Of(ip), in the node's PodCIDR6.
func (s *Sandbox) AddPod(node *Node, name string, ip netip.Addr) (*Pod, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, veth, err := s.addToNode(node, name, ip)
	if err != nil {
		return nil, fmt.Errorf("add pod %s: %w", name, err)
	}
	return &Pod{Host: h, Node: node, HostVeth: veth}, nil
}

// AddClient adds a client attached to node's bridge like a pod (for example
// 10.244.1.100 on node 1), from which probes run. The zero Addr picks the
// next free address.
func (s *Sandbox) AddClient(node *Node, name string, ip netip.Addr) (*Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, _, err := s.addToNode(node, name, ip)
	if err != nil {
		return nil, fmt.Errorf("add client %s: %w", name, err)
	}
	return s.clientAt(h), nil
}

// addToNode creates a host attached to node's bridge; it must be called with
// s.mu held.
func (s *Sandbox) addToNode(node *Node, name string, ip netip.Addr) (*Host, string, error) {
	if node == nil || node.Host == nil {
		return nil, "", errors.New("no node")
	}
	if !ip.IsValid() {
		ip = nextFree(node.PodCIDR, node.used)
	}
	if err := checkHostIP(node.PodCIDR, node.Gateway, node.used, ip); err != nil {
		return nil, "", err
	}
	if err := s.register(name); err != nil {
		return nil, "", err
	}
	h, err := s.newHost(name, ip)
	if err != nil {
		return nil, "", err
	}
	node.used[ip] = true
	s.veths++
	veth := fmt.Sprintf("veth%d", s.veths)
	if err := s.attach(node.Host, BridgeName, veth, h,
		ifaceAddr{netip.PrefixFrom(ip, node.PodCIDR.Bits()), node.Gateway},
		ifaceAddr{netip.PrefixFrom(h.IP6, node.PodCIDR6.Bits()), node.Gateway6}); err != nil {
		return nil, "", err
	}
	return h, veth, nil
}

// AddExternalClient adds a client outside the cluster on the external
// network 198.18.0.0/24 and fd00:198:18::/64, routed to the nodes through
// the router. The zero Addr picks the next free IPv4 address from .10 on;
// the IPv6 address is IPv6Of of the IPv4 one.
func (s *Sandbox) AddExternalClient(name string, ip netip.Addr) (*Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	used := map[netip.Addr]bool{}
	for _, e := range s.external {
		used[e.IP] = true
	}
	if !ip.IsValid() {
		ip = nextFree(ExternalCIDR, used)
	}
	if err := checkHostIP(ExternalCIDR, routerExternalAddr, used, ip); err != nil {
		return nil, fmt.Errorf("add external client %s: %w", name, err)
	}
	if err := s.register(name); err != nil {
		return nil, fmt.Errorf("add external client %s: %w", name, err)
	}
	h, err := s.newHost(name, ip)
	if err != nil {
		return nil, fmt.Errorf("add external client %s: %w", name, err)
	}
	s.external = append(s.external, h)
	if err := s.attach(s.Router, routerExternal, fmt.Sprintf("ext%d", len(s.external)), h,
		ifaceAddr{netip.PrefixFrom(ip, ExternalCIDR.Bits()), routerExternalAddr},
		ifaceAddr{netip.PrefixFrom(h.IP6, ExternalCIDR6.Bits()), routerExternalAddr6}); err != nil {
		return nil, fmt.Errorf("add external client %s: %w", name, err)
	}
	return s.clientAt(h), nil
}

// RouteToNode makes the router send traffic for dst to node, the way a
// LoadBalancer or a BGP speaker announces LoadBalancer and external IPs. An
// IPv6 prefix is routed to the node's IPv6 address, an IPv4 one to its IPv4
// address.
func (s *Sandbox) RouteToNode(dst netip.Prefix, node *Node) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("sandbox is closed")
	}
	via := node.IP
	if dst.Addr().Is6() {
		via = node.IP6
	}
	if err := addRoute(s.Router.NS.Netlink(), dst, via); err != nil {
		return fmt.Errorf("route %s to node %s: %w", dst, node.Name, err)
	}
	return nil
}

// ifaceAddr is an address of a host's interface with the gateway of its
// family's default route.
type ifaceAddr struct {
	addr netip.Prefix
	gw   netip.Addr
}

// attach connects host to bridge in parent with a veth pair (parentVeth in
// the parent, IfaceName in host), gives host the addresses and, for each, a
// default route via its gateway.
func (s *Sandbox) attach(parent *Host, bridge, parentVeth string, host *Host, addrs ...ifaceAddr) error {
	pnl := parent.NS.Netlink()
	br, err := pnl.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("find bridge %s in %s: %w", bridge, parent.Name, err)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: parentVeth, MasterIndex: br.Attrs().Index},
		PeerName:      IfaceName,
		PeerNamespace: netlink.NsFd(host.NS.Handle()),
	}
	if err := pnl.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s in %s: %w", parentVeth, parent.Name, err)
	}
	if err := pnl.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set %s up in %s: %w", parentVeth, parent.Name, err)
	}
	hnl := host.NS.Netlink()
	link, err := hnl.LinkByName(IfaceName)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", IfaceName, host.Name, err)
	}
	for _, a := range addrs {
		if err := hnl.AddrAdd(link, linkAddr(a.addr)); err != nil {
			return fmt.Errorf("add address %s in %s: %w", a.addr, host.Name, err)
		}
	}
	if err := hnl.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up in %s: %w", IfaceName, host.Name, err)
	}
	for _, a := range addrs {
		def := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: a.gw.AsSlice()}
		if err := hnl.RouteAdd(def); err != nil {
			return fmt.Errorf("add default route via %s in %s: %w", a.gw, host.Name, err)
		}
	}
	if err := waitActive(pnl, parentVeth, bridge); err != nil {
		return fmt.Errorf("in %s: %w", parent.Name, err)
	}
	if err := waitActive(hnl, IfaceName); err != nil {
		return fmt.Errorf("in %s: %w", host.Name, err)
	}
	return nil
}

// waitActive waits until the kernel has activated links that were just set
// up. Until its link watcher has run, a link keeps the noop qdisc, which
// drops every packet: a test's first SYN would be lost and retransmitted a
// second later.
//
// A link whose carrier is on and whose qdisc is active passes traffic even
// while its operational state is still "unknown": a bridge's carrier event
// is not urgent to the link watcher, which kernels before 6.7 (6.1 in the
// matrix) run up to a second after the previous batch; newer kernels run it
// when the link is read. Waiting for "up" there cost about a second per
// host attached to a bridge.
func waitActive(nl *netlink.Handle, names ...string) error {
	deadline := time.Now().Add(linkActiveTimeout)
	for _, name := range names {
		for {
			active, err := linkActive(nl, name)
			if err != nil {
				return err
			}
			if active {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("link %s not active after %s", name, linkActiveTimeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

func linkActive(nl *netlink.Handle, name string) (bool, error) {
	link, err := nl.LinkByName(name)
	if err != nil {
		return false, fmt.Errorf("find link %s: %w", name, err)
	}
	switch attrs := link.Attrs(); {
	case attrs.OperState == netlink.OperUp:
	case attrs.OperState == netlink.OperUnknown && attrs.RawFlags&unix.IFF_LOWER_UP != 0:
	default:
		return false, nil
	}
	qdiscs, err := nl.QdiscList(link)
	if err != nil {
		return false, fmt.Errorf("list qdiscs of %s: %w", name, err)
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Type() == "noop" {
			return false, nil
		}
	}
	return true, nil
}

// addBridge creates a bridge holding addrs. Its multicast snooping is off:
// the bridge floods IPv6 neighbour solicitations to every port rather than
// waiting to learn who listens for them.
func addBridge(nl *netlink.Handle, name string, addrs ...netip.Prefix) error {
	snooping := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}, MulticastSnooping: &snooping}
	if err := nl.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s: %w", name, err)
	}
	for _, addr := range addrs {
		if err := nl.AddrAdd(br, linkAddr(addr)); err != nil {
			return fmt.Errorf("add address %s to %s: %w", addr, name, err)
		}
	}
	if err := nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// routePodsVia routes both of n's pod subnets, IPv4 and IPv6, through n's
// node addresses.
func routePodsVia(nl *netlink.Handle, n *Node) error {
	if err := addRoute(nl, n.PodCIDR, n.IP); err != nil {
		return err
	}
	return addRoute(nl, n.PodCIDR6, n.IP6)
}

func addRoute(nl *netlink.Handle, dst netip.Prefix, gw netip.Addr) error {
	r := &netlink.Route{Dst: ipNet(dst.Masked()), Gw: gw.AsSlice()}
	if err := nl.RouteAdd(r); err != nil {
		return fmt.Errorf("add route %s via %s: %w", dst, gw, err)
	}
	return nil
}

// enableForwarding turns on IPv4 and IPv6 forwarding in the calling
// thread's network namespace; it must run inside Netns.Do. /proc/sys/net
// resolves to the namespace of the thread that opens it, so the host's
// settings are untouched.
func enableForwarding() error {
	for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding: %w", err)
		}
	}
	return nil
}

// linkAddr is addr as an interface address. An IPv6 one skips duplicate
// address detection (see ipv6Settings), should the namespace's default not
// have reached the interface.
func linkAddr(addr netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: ipNet(addr)}
	if addr.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nextFree returns the first address from .10 of the /24 prefix that is not
// in used, or the zero Addr if there is none.
func nextFree(prefix netip.Prefix, used map[netip.Addr]bool) netip.Addr {
	base := prefix.Masked().Addr().As4()
	for i := 10; i < 255; i++ {
		base[3] = byte(i)
		if a := netip.AddrFrom4(base); !used[a] {
			return a
		}
	}
	return netip.Addr{}
}

// checkHostIP accepts ip as a new host address in subnet.
func checkHostIP(subnet netip.Prefix, gw netip.Addr, used map[netip.Addr]bool, ip netip.Addr) error {
	switch {
	case !ip.IsValid():
		return fmt.Errorf("no free address left in %s", subnet)
	case !ip.Is4() || !subnet.Contains(ip):
		return fmt.Errorf("address %s is not in %s", ip, subnet)
	case ip == subnet.Masked().Addr() || ip == lastAddr(subnet):
		return fmt.Errorf("address %s is the network or broadcast address of %s", ip, subnet)
	case ip == gw:
		return fmt.Errorf("address %s is the gateway of %s", ip, subnet)
	case used[ip]:
		return fmt.Errorf("address %s is already used", ip)
	}
	return nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	for i := range 4 {
		a[3-i] |= byte(host >> (8 * i))
	}
	return netip.AddrFrom4(a)
}

// close stops the host's servers and deletes its namespace.
func (h *Host) close() error {
	h.mu.Lock()
	h.closed = true
	servers := h.servers
	h.servers = nil
	h.mu.Unlock()
	var errs []error
	for _, srv := range servers {
		if err := srv.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := h.NS.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
