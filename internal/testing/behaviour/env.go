// Package behaviour holds the behaviour table every dataplane runs (Cases:
// the BPF dataplane and the fallbacks alike) and the sandbox it runs real
// traffic through (Env): the example cluster of internal/testing/example
// on two nodes, one dataplane per node. A new dataplane, or a new IP
// family, is checked by running the same table against it.
package behaviour

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nodeaddrs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Factory creates the dataplane under test for a node of the sandbox. The
// dataplane must program node.NS and node.Cgroup and nothing else; the
// factory registers its own cleanup with t.
type Factory func(t *testing.T, node *Node) dataplane.Dataplane

// Node is a node of the example cluster, as a dataplane sees it.
type Node struct {
	*sandbox.Node
	// Cgroup holds the sockets of the node's pods and of the node's own
	// clients, as a node's root cgroup holds every process on it.
	Cgroup *sandbox.Cgroup
	// BPFFS is a directory of the sandbox's bpf filesystem for the node's
	// pins.
	BPFFS string
}

// Client names of the behaviour table.
const (
	// ClientPodA is a pod on node-a that is no endpoint.
	ClientPodA = "pod-a"
	// ClientPodB is a pod on node-b that is no endpoint.
	ClientPodB = "pod-b"
	// ClientNodeA is node-a itself.
	ClientNodeA = "node-a"
	// ClientA1 is pod a1, an endpoint of several Services.
	ClientA1 = "a1"
	// ClientExternal is outside the cluster, inside the example's
	// loadBalancerSourceRanges (198.18.0.0/25).
	ClientExternal = "external"
	// ClientBlocked is outside the cluster and outside the ranges.
	ClientBlocked = "external-blocked"
)

// Addresses of the example's clients.
var (
	ClientPodAIP    = netip.MustParseAddr("10.244.1.100")
	ClientPodBIP    = netip.MustParseAddr("10.244.2.100")
	ClientExtIP     = netip.MustParseAddr("198.18.0.10")
	ClientBlockedIP = netip.MustParseAddr("198.18.0.200")
)

// Env is the example cluster in a sandbox: node-a and node-b with pods a1,
// a2 and b1 serving, clients, and one dataplane per node fed by its own
// Source, as one agent per node would be.
type Env struct {
	T *testing.T
	// IPv6: the dataplanes serve the IPv6 twin of the example cluster
	// (example.Example6), and the rows of the table are run against the
	// IPv6 twins of their addresses (sandbox.IPv6Of).
	IPv6    bool
	SB      *sandbox.Sandbox
	Nodes   map[string]*sandbox.Node
	Pods    map[string]*sandbox.Pod
	Clients map[string]*sandbox.Client
	// Sources and Dataplanes are keyed by node name.
	Sources    map[string]*example.Source
	Dataplanes map[string]dataplane.Dataplane
	// Example is what the Sources were given.
	Example []example.Pair
}

// NewEnv builds the sandbox, starts the servers, creates a dataplane per
// node with factory and syncs the example cluster to both.
func NewEnv(t *testing.T, factory Factory) *Env {
	t.Helper()
	return newEnv(t, factory, false)
}

// NewEnv6 is NewEnv for IPv6 dataplanes: the same sandbox, whose hosts are
// dual-stack, with the example cluster's IPv6 twin synced to both nodes.
func NewEnv6(t *testing.T, factory Factory) *Env {
	t.Helper()
	return newEnv(t, factory, true)
}

func newEnv(t *testing.T, factory Factory, ipv6 bool) *Env {
	t.Helper()
	sb := sandbox.ForTest(t)
	e := &Env{
		T: t, SB: sb,
		Nodes: map[string]*sandbox.Node{}, Pods: map[string]*sandbox.Pod{}, Clients: map[string]*sandbox.Client{},
		Sources: map[string]*example.Source{}, Dataplanes: map[string]dataplane.Dataplane{},
		Example: example.Example(), IPv6: ipv6,
	}
	if ipv6 {
		e.Example = example.Example6()
	}
	cgroups := map[string]*sandbox.Cgroup{}
	for _, name := range []string{example.NodeA, example.NodeB} {
		n, err := sb.AddNode(name)
		if err != nil {
			t.Fatal(err)
		}
		e.Nodes[name] = n
		if cgroups[name], err = sb.AddCgroup(name); err != nil {
			t.Fatal(err)
		}
	}
	if e.Nodes[example.NodeA].IP != example.NodeAIP || e.Nodes[example.NodeB].IP != example.NodeBIP {
		t.Fatalf("sandbox gave the nodes %s and %s, the example cluster expects %s and %s", e.Nodes[example.NodeA].IP, e.Nodes[example.NodeB].IP, example.NodeAIP, example.NodeBIP)
	}
	for _, p := range []struct {
		name, node string
		ip         netip.Addr
	}{{"a1", example.NodeA, example.PodA1}, {"a2", example.NodeA, example.PodA2}, {"b1", example.NodeB, example.PodB1}} {
		pod, err := sb.AddServingPod(e.Nodes[p.node], p.name, p.ip, example.TCPTarget, example.UDPTarget)
		if err != nil {
			t.Fatal(err)
		}
		e.Pods[p.name] = pod
	}
	// Clients on a node are born in its cgroup; external ones in none.
	add := func(name string, c *sandbox.Client, err error, cg ...*sandbox.Cgroup) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range cg {
			c = c.InCgroup(g)
		}
		e.Clients[name] = c
	}
	c, err := sb.AddClient(e.Nodes[example.NodeA], ClientPodA, ClientPodAIP)
	add(ClientPodA, c, err, cgroups[example.NodeA])
	c, err = sb.AddClient(e.Nodes[example.NodeB], ClientPodB, ClientPodBIP)
	add(ClientPodB, c, err, cgroups[example.NodeB])
	c, err = sb.AddExternalClient(ClientExternal, ClientExtIP)
	add(ClientExternal, c, err)
	c, err = sb.AddExternalClient(ClientBlocked, ClientBlockedIP)
	add(ClientBlocked, c, err)
	e.Clients[ClientNodeA] = sb.ClientAt(e.Nodes[example.NodeA].Host).InCgroup(cgroups[example.NodeA])
	e.Clients[ClientA1] = sb.ClientAt(e.Pods["a1"].Host).InCgroup(cgroups[example.NodeA])
	// LoadBalancer and external IPs are announced to node-a.
	for _, lb := range []netip.Prefix{sandbox.LoadBalancerCIDR, sandbox.LoadBalancerCIDR6} {
		if err := sb.RouteToNode(lb, e.Nodes[example.NodeA]); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range e.Nodes {
		if err := RouteBridgeThroughNode(n); err != nil {
			t.Fatal(err)
		}
	}
	bridged := []struct {
		host *sandbox.Host
		node string
	}{
		{e.Pods["a1"].Host, example.NodeA}, {e.Pods["a2"].Host, example.NodeA}, {e.Pods["b1"].Host, example.NodeB},
		{e.Clients[ClientPodA].Host, example.NodeA}, {e.Clients[ClientPodB].Host, example.NodeB},
	}
	for _, b := range bridged {
		if err := RouteIPv6ThroughNode(b.host, e.Nodes[b.node]); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{example.NodeA, example.NodeB} {
		if ipv6 {
			e.Sources[name] = example.NewSource6(t, example.Node6(name)).Add(e.Example...)
		} else {
			e.Sources[name] = example.NewSource(t, example.Node(name)).Add(e.Example...)
		}
		// The node's addresses, read as the agent's sync loop reads them,
		// before a dataplane adds any of its own.
		var local []netip.Addr
		if err := e.Nodes[name].NS.Do(func() (err error) {
			local, err = nodeaddrs.Local()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		e.Sources[name].SetLocalAddrs(local)
		e.Dataplanes[name] = factory(t, &Node{Node: e.Nodes[name], Cgroup: cgroups[name], BPFFS: filepath.Join(sb.BPFFS.Path(), name)})
	}
	e.Sync(true)
	return e
}

// Sync hands every node's dataplane the changes recorded in its Source.
func (e *Env) Sync(full bool) {
	e.T.Helper()
	for _, name := range []string{example.NodeA, example.NodeB} {
		up := e.Sources[name].Update()
		up.Full = up.Full || full
		if err := e.Dataplanes[name].Sync(up); err != nil {
			e.T.Fatalf("sync %s on %s: %v", e.Dataplanes[name].Name(), name, err)
		}
	}
}

// Each records the same change in the Source of every node.
func (e *Env) Each(change func(*example.Source)) {
	for _, name := range []string{example.NodeA, example.NodeB} {
		change(e.Sources[name])
	}
}

// RouteBridgeThroughNode makes every packet between two hosts on node's
// bridge pass through the node's IP stack, as it does on a node whose CNI
// routes each pod through the host (and as br_netfilter would make it
// appear). Without it, a pod's reply to a client on the same node is
// switched by the bridge straight to the client: the node's conntrack never
// sees it, so the DNAT of a Service is not undone and the client resets the
// connection.
//
// Everything happens inside the node's namespace, nothing on the host:
// the bridge ports are isolated, so hosts on the bridge no longer reach
// each other at layer 2, and the node answers their ARP requests for each
// other with its own address (proxy_arp_pvlan, without proxy_delay), so
// they send everything to the node, which routes it back out of the bridge.
// ICMP redirects are off so that no host learns a shortcut.
//
// Where br_netfilter is present (a module load makes it so in every
// namespace of the machine, with bridge-nf-call-iptables on), it is turned
// off in the node's namespace: it would hand a DNATed packet whose endpoint
// sits on the same bridge back to the bridge, which the isolated ports then
// drop. The node is then a plain router, whatever the host has loaded, and
// the tests do not depend on a global module.
//
// Call it after the node's pods and clients exist.
func RouteBridgeThroughNode(node *sandbox.Node) error {
	nl := node.NS.Netlink()
	br, err := nl.LinkByName(sandbox.BridgeName)
	if err != nil {
		return fmt.Errorf("node %s: find bridge: %w", node.Name, err)
	}
	links, err := nl.LinkList()
	if err != nil {
		return fmt.Errorf("node %s: list links: %w", node.Name, err)
	}
	for _, l := range links {
		if l.Attrs().MasterIndex != br.Attrs().Index {
			continue
		}
		if err := nl.LinkSetIsolated(l, true); err != nil {
			return fmt.Errorf("node %s: isolate bridge port %s: %w", node.Name, l.Attrs().Name, err)
		}
	}
	return node.NS.Do(func() error {
		for _, key := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"} {
			path := filepath.Join("/proc/sys/net/bridge", key)
			if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
				continue // no br_netfilter: nothing to turn off
			}
			if err := os.WriteFile(path, []byte("0"), 0o644); err != nil {
				return fmt.Errorf("node %s: turn off %s: %w", node.Name, key, err)
			}
		}
		for _, s := range []struct{ key, value string }{
			{"ipv4/conf/" + sandbox.BridgeName + "/proxy_arp_pvlan", "1"},
			{"ipv4/neigh/" + sandbox.BridgeName + "/proxy_delay", "0"},
			{"ipv4/conf/all/send_redirects", "0"},
			{"ipv4/conf/" + sandbox.BridgeName + "/send_redirects", "0"},
		} {
			if err := os.WriteFile(filepath.Join("/proc/sys/net", s.key), []byte(s.value), 0o644); err != nil {
				return fmt.Errorf("node %s: set %s: %w", node.Name, s.key, err)
			}
		}
		return nil
	})
}

// RouteIPv6ThroughNode is RouteBridgeThroughNode's IPv6 half, done in
// host, a pod or client on node's bridge: IPv6 has no proxy ARP, and
// neighbour discovery between isolated bridge ports fails, so the host's
// pod subnet is routed through the node's bridge address instead of being
// on-link, and the node's ICMPv6 redirects (which Linux sends when it
// forwards a packet back out of the interface it came in on) are ignored.
func RouteIPv6ThroughNode(host *sandbox.Host, node *sandbox.Node) error {
	nl := host.NS.Netlink()
	eth, err := nl.LinkByName(sandbox.IfaceName)
	if err != nil {
		return fmt.Errorf("%s: find %s: %w", host.Name, sandbox.IfaceName, err)
	}
	onLink := &netlink.Route{LinkIndex: eth.Attrs().Index, Dst: prefixNet(node.PodCIDR6)}
	if err := nl.RouteDel(onLink); err != nil {
		return fmt.Errorf("%s: remove the on-link route to %s: %w", host.Name, node.PodCIDR6, err)
	}
	gw := netip.PrefixFrom(node.Gateway6, 128)
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: prefixNet(gw), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("%s: route to the gateway %s: %w", host.Name, node.Gateway6, err)
	}
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: prefixNet(node.PodCIDR6), Gw: node.Gateway6.AsSlice()}); err != nil {
		return fmt.Errorf("%s: route %s through %s: %w", host.Name, node.PodCIDR6, node.Gateway6, err)
	}
	return host.NS.Do(func() error {
		for _, key := range []string{"all/accept_redirects", sandbox.IfaceName + "/accept_redirects"} {
			if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", key), []byte("0"), 0o644); err != nil {
				return fmt.Errorf("%s: set net.ipv6.conf.%s: %w", host.Name, key, err)
			}
		}
		return nil
	})
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Context returns a context bounded for one test.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
