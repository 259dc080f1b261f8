// Package testbed builds what the end-to-end tests run traffic through: the
// sandbox's nodes, each with its own cgroup, pods running servers, a client
// pod, the node itself and external clients as traffic sources, the Node
// objects in a real API server (package cluster), and at most one proxy
// under test per node (StartProxy): upstream kube-proxy in iptables or
// nftables mode, or ebpf-proxy.
//
// Test binaries that use it must call Main from TestMain: probes re-execute
// the binary.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/interrupt"
)

// PodCIDR is the cluster CIDR every pod's IPv4 address is in; upstream
// kube-proxy gets it, with the IPv6 one, as clusterCIDR (ClusterCIDRs), so
// that it tells pod traffic from other traffic.
const PodCIDR = "10.244.0.0/16"

// ClusterCIDRs are both families' cluster CIDRs, for --cluster-cidr.
var ClusterCIDRs = PodCIDR + "," + sandbox.PodCIDR6.String()

// NodeSpec describes one node of a Testbed.
type NodeSpec struct {
	// Name is the node's name: the sandbox host, the Node object and the
	// proxies' --hostname-override.
	Name string
	// Zone becomes the Node's topology.kubernetes.io/zone label when set.
	Zone string
	// IPv4Only makes the Node object list the node's IPv4 address alone,
	// as a kubelet given a single --node-ip on a dual-stack cluster does;
	// the host itself keeps both families, and its pods theirs.
	IPv4Only bool
	// Pods are the names of the pods on this node. Each serves every port of
	// Options.TCPPorts and Options.UDPPorts, answering as "<pod>:<port>", so
	// that a probe sees which port of which pod served it.
	Pods []string
}

// Options describe a Testbed.
type Options struct {
	// Nodes are the nodes, in order: node i gets 192.168.77.(10+i) and pod
	// subnet 10.244.i.0/24.
	Nodes []NodeSpec
	// TCPPorts and UDPPorts are served by every pod.
	TCPPorts []uint16
	UDPPorts []uint16
	// SCTPPorts are served by every pod too; they need the kernel's sctp
	// module (sandbox.Host.SCTPAvailable).
	SCTPPorts []uint16
	// ExternalClients are names of clients outside the cluster, on
	// 198.18.0.0/24 behind the router.
	ExternalClients []string
}

// Testbed is a running set of nodes attached to a cluster.
type Testbed struct {
	// Cluster is the control plane the testbed's Node objects live in.
	Cluster *cluster.Cluster
	// Sandbox holds the namespaces, cgroups and bpffs.
	Sandbox *sandbox.Sandbox
	// Nodes are the nodes, in the order of Options.Nodes.
	Nodes []*Node
	// External are the external clients, in the order of
	// Options.ExternalClients.
	External []*sandbox.Client

	opts    Options
	mu      sync.Mutex
	names   map[netip.Addr]string
	proxies []*Proxy
	// servers are the servers of each pod, for StopServing.
	servers map[*sandbox.Pod][]*sandbox.Server
}

// Node is a node of the testbed.
type Node struct {
	*sandbox.Node
	// Spec is what the node was made from.
	Spec NodeSpec
	// Cgroup is the node's cgroup: ebpf-proxy on this node attaches to it,
	// and Client and Self run their probes in it.
	Cgroup *sandbox.Cgroup
	// Pods are the node's pods, in the order of Spec.Pods.
	Pods []*sandbox.Pod
	// Client is a client pod on the node ("<node>-client") that runs no
	// server.
	Client *sandbox.Client
	// Self runs probes in the node's own network namespace.
	Self *sandbox.Client
	// API is how the node's proxies reach the API server; pausing it cuts
	// the node off the API server alone.
	API *cluster.Forwarder

	tb *Testbed
}

// New builds a testbed for the test and tears it down in t.Cleanup (and on
// SIGINT or SIGTERM): proxies are stopped, namespaces, cgroups and mounts
// removed. The Node objects are created in c unless they exist already, so
// several testbeds can follow one another on one cluster; a proxy must only
// ever see its Node with the same addresses, which a testbed guarantees by
// giving node i the address 192.168.77.(10+i) every time.
func New(t testing.TB, c *cluster.Cluster, opts Options) *Testbed {
	t.Helper()
	sandbox.RequireRoot(t)
	sb, err := sandbox.New()
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	tb := &Testbed{Cluster: c, Sandbox: sb, opts: opts, names: map[netip.Addr]string{}, servers: map[*sandbox.Pod][]*sandbox.Server{}}
	var closeOnce sync.Once
	teardown := func() {
		closeOnce.Do(func() {
			tb.stopProxies()
			if err := sb.Close(); err != nil {
				t.Errorf("close sandbox: %v", err)
			}
		})
	}
	unregister := interrupt.Register(teardown)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testbed at failure:\n%s", sb)
		}
		teardown()
		unregister()
	})
	if err := tb.build(t, opts); err != nil {
		t.Fatalf("build testbed: %v", err)
	}
	return tb
}

func (tb *Testbed) build(t testing.TB, opts Options) error {
	sb := tb.Sandbox
	tb.name(sb.Router, "router")
	if err := setSysctls(sb.Router.NS, routerSysctls); err != nil {
		return err
	}
	if err := refuseServiceCIDR(sb); err != nil {
		return err
	}
	for _, spec := range opts.Nodes {
		n, err := tb.addNode(t, spec, opts)
		if err != nil {
			return fmt.Errorf("node %s: %w", spec.Name, err)
		}
		tb.Nodes = append(tb.Nodes, n)
	}
	for _, name := range opts.ExternalClients {
		ext, err := sb.AddExternalClient(name, netip.Addr{})
		if err != nil {
			return err
		}
		tb.name(ext.Host, name)
		tb.External = append(tb.External, ext)
	}
	return tb.ensureNodeObjects(context.Background())
}

// routerSysctls make the router answer every packet it cannot route with
// an ICMP error at once: rate-limited (per peer, and per namespace
// overall), an unroutable attempt would now and then look like a timeout (a
// DROP) instead. An empty mask exempts every ICMP type from both limits.
// The IPv6 mask matters as much as the IPv4 one: a wave of the
// differential suite sends the router thousands of unproxied attempts a
// second, past the namespace's 1,000 ICMP errors a second (icmp_msgs_per_sec,
// shared by both families), and with the default IPv6 mask ("0-1,3-127",
// destination unreachable included) an error now and then was not sent.
var routerSysctls = map[string]string{
	"net/ipv4/icmp_ratelimit": "0",
	"net/ipv4/icmp_ratemask":  "0",
	"net/ipv6/icmp/ratelimit": "0",
	"net/ipv6/icmp/ratemask":  "",
}

// ServiceCIDR is the cluster's Service range (cluster.ServiceCIDR).
var ServiceCIDR = netip.MustParsePrefix(cluster.ServiceCIDR)

// refuseServiceCIDR makes the router refuse, with ICMP "administratively
// prohibited", every packet for the Service range: one that reaches it was
// translated by no proxy. The client fails at once with EACCES, which tells
// "not proxied" apart from a proxy's REJECT (ECONNREFUSED) and DROP (a
// timeout). Left to routing, the router would answer with "network
// unreachable" through the kernel's route-error limiter, a global setting
// of one error a second per source after a burst of five, and clients would
// see timeouts now and then instead.
func refuseServiceCIDR(sb *sandbox.Sandbox) error {
	nl := sb.Router.NS.Netlink()
	lan, err := nl.LinkByName("lan0")
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	// Routes, so that the packet reaches the forward hook at all; the
	// rule refuses it before any neighbour lookup.
	for _, p := range []netip.Prefix{ServiceCIDR, sandbox.ServiceCIDR6} {
		if err := nl.RouteAdd(&netlink.Route{LinkIndex: lan.Attrs().Index, Dst: &net.IPNet{
			IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}); err != nil {
			return fmt.Errorf("router: route %s: %w", p, err)
		}
	}
	rules := fmt.Sprintf(`table inet sandbox {
	chain forward {
		type filter hook forward priority 0; policy accept;
		ip daddr %s reject with icmp type admin-prohibited
		ip6 daddr %s reject with icmpv6 type admin-prohibited
	}
}
`, ServiceCIDR, sandbox.ServiceCIDR6)
	cmd := exec.Command("ip", "netns", "exec", sb.Router.NS.Name(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("router: nft: %w: %s", err, out)
	}
	return nil
}

// nodeSysctls are set in each node's namespace only; the keys are
// per-namespace on the kernels this project supports, and the root
// namespace is never written.
var nodeSysctls = map[string]string{
	// Same-node pod -> ClusterIP -> pod traffic: the pods share the node's
	// bridge, so the reply from the endpoint is bridged straight back to
	// the client at layer 2 and would bypass the node's conntrack and its
	// reverse DNAT (the client would get an answer from the pod address and
	// reset it). With bridge-nf-call-iptables, bridged IPv4 frames traverse
	// the node's netfilter hooks (iptables and nftables alike), as on a real
	// node with br_netfilter loaded, which kube-proxy requires. It is a
	// per-namespace setting since Linux 5.3; the root namespace is
	// untouched.
	"net/bridge/bridge-nf-call-iptables": "1",
	// The same for bridged IPv6 frames and ip6tables.
	"net/bridge/bridge-nf-call-ip6tables": "1",
	// The node routes same-subnet pod traffic (DNATed to a pod on the same
	// bridge) back out of the bridge it came from, and would then tell the
	// client pod with an ICMP redirect to send to the endpoint directly,
	// still addressed to the ClusterIP, which the endpoint drops.
	"net/ipv4/conf/all/send_redirects":     "0",
	"net/ipv4/conf/default/send_redirects": "0",
	"net/ipv4/conf/br0/send_redirects":     "0",
	// REJECT answers with ICMP port unreachable; rate-limited (per peer,
	// and per namespace overall), a REJECT would now and then look like a
	// DROP. An empty mask exempts every ICMP type from both limits.
	"net/ipv4/icmp_ratelimit": "0",
	"net/ipv4/icmp_ratemask":  "0",
	// ICMPv6 errors (REJECT's port unreachable) likewise: an empty mask
	// (the IPv6 one is a list of types) exempts them all.
	"net/ipv6/icmp/ratelimit": "0",
	"net/ipv6/icmp/ratemask":  "",
}

// podSysctls are set in each pod's and client's namespace. IPv6 has no
// switch for the node's redirects (the IPv4 send_redirects above): the
// pods ignore them instead, for the reason given there.
var podSysctls = map[string]string{
	"net/ipv6/conf/all/accept_redirects":  "0",
	"net/ipv6/conf/eth0/accept_redirects": "0",
}

// setSysctls writes sysctls inside ns. /proc/sys/net resolves to the
// namespace of the thread that opens it, which Do switches.
func setSysctls(ns *sandbox.Netns, kv map[string]string) error {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return ns.Do(func() error {
		for _, k := range keys {
			p := filepath.Join("/proc/sys", k)
			if err := os.WriteFile(p, []byte(kv[k]+"\n"), 0o644); err != nil {
				return fmt.Errorf("set %s in netns %s: %w", k, ns.Name(), err)
			}
			got, err := os.ReadFile(p)
			if err != nil || string(got) != kv[k]+"\n" {
				return fmt.Errorf("%s in netns %s reads %q after writing %q: %v", k, ns.Name(), got, kv[k], err)
			}
		}
		return nil
	})
}

func (tb *Testbed) addNode(t testing.TB, spec NodeSpec, opts Options) (*Node, error) {
	sb := tb.Sandbox
	sn, err := sb.AddNode(spec.Name)
	if err != nil {
		return nil, err
	}
	n := &Node{Node: sn, Spec: spec, tb: tb}
	tb.name(sn.Host, spec.Name)
	tb.names[sn.Gateway] = spec.Name + "/br0"
	tb.names[sn.Gateway6] = spec.Name + "/br0"
	if err := setSysctls(sn.NS, nodeSysctls); err != nil {
		return nil, err
	}
	if n.Cgroup, err = sb.AddCgroup(spec.Name); err != nil {
		return nil, err
	}
	for _, name := range spec.Pods {
		pod, err := sb.AddPod(sn, name, netip.Addr{})
		if err != nil {
			return nil, err
		}
		tb.name(pod.Host, name)
		if err := setSysctls(pod.NS, podSysctls); err != nil {
			return nil, err
		}
		if err := tb.StartServing(pod); err != nil {
			return nil, err
		}
		n.Pods = append(n.Pods, pod)
	}
	client, err := sb.AddClient(sn, spec.Name+"-client", netip.Addr{})
	if err != nil {
		return nil, err
	}
	tb.name(client.Host, client.Name)
	if err := setSysctls(client.NS, podSysctls); err != nil {
		return nil, err
	}
	n.Client = client.InCgroup(n.Cgroup)
	if err := setHairpin(sn); err != nil {
		return nil, err
	}
	n.Self = sb.ClientAt(sn.Host).InCgroup(n.Cgroup)

	// The proxies on this node reach the API server at the address their
	// kubeconfig names. The forwarder must go before the namespace, which
	// its socket would keep alive: t.Cleanup runs it before the testbed's
	// teardown, registered earlier.
	f, err := tb.Cluster.ForwardIntoNetNS(sn.NS.Path())
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = f.Close() })
	n.API = f
	return n, nil
}

// StartServing starts pod's servers, one on every port of Options.TCPPorts,
// Options.UDPPorts and Options.SCTPPorts, answering as "<pod>:<port>"; New starts them for
// every pod, and StartServing again after StopServing, as a pod that was
// replaced by one with the same name and address.
func (tb *Testbed) StartServing(pod *sandbox.Pod) error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.servers[pod]) > 0 {
		return fmt.Errorf("pod %s is serving already", pod.Name)
	}
	var srvs []*sandbox.Server
	for _, port := range tb.opts.TCPPorts {
		srv, err := pod.StartTCPServerNamed(port, fmt.Sprintf("%s:%d", pod.Name, port))
		if err != nil {
			return err
		}
		srvs = append(srvs, srv)
	}
	for _, port := range tb.opts.UDPPorts {
		srv, err := pod.StartUDPServerNamed(port, fmt.Sprintf("%s:%d", pod.Name, port))
		if err != nil {
			return err
		}
		srvs = append(srvs, srv)
	}
	for _, port := range tb.opts.SCTPPorts {
		srv, err := pod.StartSCTPServerNamed(port, fmt.Sprintf("%s:%d", pod.Name, port))
		if err != nil {
			return err
		}
		srvs = append(srvs, srv)
	}
	tb.servers[pod] = srvs
	return nil
}

// StopServing closes pod's servers, as a pod that ended: new connections
// to it are refused and its open ones end.
func (tb *Testbed) StopServing(pod *sandbox.Pod) error {
	tb.mu.Lock()
	srvs := tb.servers[pod]
	delete(tb.servers, pod)
	tb.mu.Unlock()
	var errs []error
	for _, srv := range srvs {
		errs = append(errs, srv.Close())
	}
	return errors.Join(errs...)
}

// setHairpin turns on hairpin mode on every port of the node's bridge, as
// the kubelet (--hairpin-mode=hairpin-veth) or the bridge CNI plugin
// ("hairpinMode": true) do on a real node. A pod reaching itself through a
// Service needs it: the node DNATs the packet back to the pod on the bridge
// it came from, and the bridge sends a frame out of the port it came in on
// only in hairpin mode.
func setHairpin(n *sandbox.Node) error {
	nl := n.NS.Netlink()
	br, err := nl.LinkByName(sandbox.BridgeName)
	if err != nil {
		return err
	}
	links, err := nl.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if l.Attrs().MasterIndex != br.Attrs().Index {
			continue
		}
		if err := nl.LinkSetHairpin(l, true); err != nil {
			return fmt.Errorf("hairpin mode on %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// FlushConntrack empties the connection tracking table of the node's
// namespace. Probes open connections far faster than real clients, and the
// kernel soon hands a client a source port it used a moment ago: a new
// connection would then match the stale, un-NATed entry of an earlier
// attempt made under other rules and never see the current ones.
func (n *Node) FlushConntrack() error { return n.FlushConntrackExcept(nil) }

// FlushConntrackExcept is FlushConntrack that spares the flows whose
// original source is in keep: connections a test holds open across a
// change of the rules, which a flush would break under kube-proxy (its
// DNAT lives in the flow's entry).
func (n *Node) FlushConntrackExcept(keep map[netip.AddrPort]bool) error {
	h := n.NS.Netlink()
	if len(keep) == 0 {
		if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			return fmt.Errorf("flush conntrack on %s: %w", n.Spec.Name, err)
		}
		return nil
	}
	f := keepFilter(keep)
	for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, family, f); err != nil {
			return fmt.Errorf("flush conntrack on %s: %w", n.Spec.Name, err)
		}
	}
	return nil
}

// keepFilter matches every flow but those whose original source it holds.
type keepFilter map[netip.AddrPort]bool

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (k keepFilter) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	src, ok := netip.AddrFromSlice(f.Forward.SrcIP)
	if !ok {
		return true
	}
	return !k[netip.AddrPortFrom(src.Unmap(), f.Forward.SrcPort)]
}

// ensureNodeObjects creates the Node objects that do not exist yet.
func (tb *Testbed) ensureNodeObjects(ctx context.Context) error {
	nodes := tb.Cluster.Clientset().CoreV1().Nodes()
	for _, n := range tb.Nodes {
		existing, err := nodes.Get(ctx, n.Spec.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			if !hasInternalIP(existing, n.IP) || hasInternalIP(existing, n.IP6) == n.Spec.IPv4Only {
				return fmt.Errorf("node object %s exists with addresses %v, want InternalIPs %v: a proxy would exit on the change",
					n.Spec.Name, existing.Status.Addresses, n.internalIPs())
			}
			continue
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("get node %s: %w", n.Spec.Name, err)
		}
		labels := map[string]string{}
		if n.Spec.Zone != "" {
			labels[cluster.ZoneLabel] = n.Spec.Zone
		}
		if _, err := tb.Cluster.CreateNode(ctx, cluster.Node{
			Name:        n.Spec.Name,
			InternalIPs: n.internalIPs(),
			Labels:      labels,
			PodCIDRs:    []string{n.PodCIDR.String(), n.PodCIDR6.String()},
		}); err != nil {
			return err
		}
	}
	return nil
}

// internalIPs are the InternalIPs of n's Node object.
func (n *Node) internalIPs() []string {
	if n.Spec.IPv4Only {
		return []string{n.IP.String()}
	}
	return []string{n.IP.String(), n.IP6.String()}
}

func hasInternalIP(n *corev1.Node, ip netip.Addr) bool {
	return slices.Contains(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
}

// name names both addresses of h.
func (tb *Testbed) name(h *sandbox.Host, name string) {
	tb.names[h.IP] = name
	tb.names[h.IP6] = name
}

// Node returns the node named name, or nil.
func (tb *Testbed) Node(name string) *Node {
	for _, n := range tb.Nodes {
		if n.Spec.Name == name {
			return n
		}
	}
	return nil
}

// Pod returns the pod named name and its node, or nils.
func (tb *Testbed) Pod(name string) (*sandbox.Pod, *Node) {
	for _, n := range tb.Nodes {
		for _, p := range n.Pods {
			if p.Name == name {
				return p, n
			}
		}
	}
	return nil, nil
}

// PodClient returns a client that runs probes from inside a pod that
// serves, in its node's cgroup: the pod as a client of a Service it is an
// endpoint of.
func (tb *Testbed) PodClient(pod *sandbox.Pod) (*sandbox.Client, error) {
	for _, n := range tb.Nodes {
		if slices.Contains(n.Pods, pod) {
			return tb.Sandbox.ClientAt(pod.Host).InCgroup(n.Cgroup), nil
		}
	}
	return nil, errors.New("pod is not in this testbed")
}

// AddressName names an address of the testbed: a host's name, "<node>/br0"
// for a node's bridge address, "router"; else the address itself.
func (tb *Testbed) AddressName(a netip.Addr) string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if name, ok := tb.names[a]; ok {
		return name
	}
	return a.String()
}

// RouteToNode makes the router send traffic for ip (an ExternalIP or a
// LoadBalancer IP) to node, as a load balancer or BGP speaker would.
func (tb *Testbed) RouteToNode(ip netip.Addr, node *Node) error {
	return tb.Sandbox.RouteToNode(netip.PrefixFrom(ip, ip.BitLen()), node.Node)
}
