package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// The ipsets the iptables rules match, by their IPv4 names (family.set
// gives the IPv6 ones). Entries are kept per frontend, so a Service costs
// set entries, never rules.
const (
	// setClusterIP holds ClusterIP,proto:port of every Service.
	setClusterIP = "EBPFPROXY-CLUSTER-IP"
	// setExternal holds the external frontends (ExternalIPs, LoadBalancer
	// IPs, node IPs with NodePorts) of externalTrafficPolicy=Cluster
	// Services, whose traffic is masqueraded.
	setExternal = "EBPFPROXY-EXTERNAL"
	// setExternalLocal holds those of Local ones, whose traffic keeps its
	// source except when the node itself sends it.
	setExternalLocal = "EBPFPROXY-EXTERNAL-LOCAL"
	// setDrop holds frontends whose verdict is Drop.
	setDrop = "EBPFPROXY-DROP"
	// setLBFirewall holds LoadBalancer frontends with source ranges,
	// setLBSource the admitted (frontend, source range) pairs and
	// setLBSourceIP the (frontend, LoadBalancer IP) pairs admitted because
	// a range holds the node.
	setLBFirewall = "EBPFPROXY-LB-FW"
	setLBSource   = "EBPFPROXY-LB-SRC"
	setLBSourceIP = "EBPFPROXY-LB-SRC-IP"
	// setHairpin holds endpoint,proto:port,endpoint: an endpoint reaching
	// itself through a Service is masqueraded.
	setHairpin = "EBPFPROXY-HAIRPIN"
)

// ipsetTypes are the sets and their types, in creation order.
var ipsetTypes = []struct{ name, typ string }{
	{setClusterIP, "hash:ip,port"},
	{setExternal, "hash:ip,port"},
	{setExternalLocal, "hash:ip,port"},
	{setDrop, "hash:ip,port"},
	{setLBFirewall, "hash:ip,port"},
	{setLBSource, "hash:ip,port,net"},
	{setLBSourceIP, "hash:ip,port,ip"},
	{setHairpin, "hash:ip,port,ip"},
}

// frontendSets are the sets that together hold every frontend we created a
// virtual server for; after a restart they tell our NodePort virtual
// servers (on the node's own addresses) from anyone else's.
var frontendSets = []string{setClusterIP, setExternal, setExternalLocal}

// vsKey identifies a virtual server.
type vsKey struct {
	Addr  netip.Addr
	Proto model.Protocol
	Port  uint16
}

func (k vsKey) String() string {
	return fmt.Sprintf("%s %s", k.Proto, netip.AddrPortFrom(k.Addr, k.Port))
}

// virtualServer is a virtual server as the model wants it.
type virtualServer struct {
	Key       vsKey
	Scheduler string
	// Persistence is the ClientIP affinity timeout, 0 without affinity.
	Persistence time.Duration
	// Reals are the endpoints, sorted.
	Reals []netip.AddrPort
	// Kind and Owner say where it comes from, for the dump and logs.
	Kind  string
	Owner model.ServicePortName
}

// setEntry is one ipset entry. IP2 and CIDR2 are used by the
// three-dimensional sets only; a CIDR2 of IP2's bit length is a host.
type setEntry struct {
	// Set is the set's IPv4 name, one of the set constants, whatever
	// the family of the addresses.
	Set   string
	IP    netip.Addr
	Proto model.Protocol
	Port  uint16
	IP2   netip.Addr
	CIDR2 int
}

// String renders the entry as `ipset list` does, after the set name.
func (e setEntry) String() string {
	s := fmt.Sprintf("%s,%s:%d", e.IP, strings.ToLower(e.Proto.String()), e.Port)
	if e.IP2.IsValid() {
		s += "," + e.IP2.String()
		if e.CIDR2 != e.IP2.BitLen() && e.CIDR2 != 0 {
			s += fmt.Sprintf("/%d", e.CIDR2)
		}
	}
	return s
}

// serviceConfig is everything one ServicePort needs in the kernel.
type serviceConfig struct {
	Servers []virtualServer
	// Addrs are bound on the dummy interface.
	Addrs   []netip.Addr
	Entries []setEntry
}

// renderer turns model verdicts into IPVS configuration; it never looks at
// endpoint conditions or topology.
type renderer struct {
	cfg *Config
	// nodeIPs are the node's addresses: they decide whether a source
	// range admits the node (model.ServicePort.SourceRangesAdmitNode).
	nodeIPs []netip.Addr
	// nodePortIPs serve the NodePorts.
	nodePortIPs []netip.Addr
}

func (r *renderer) service(svc *model.Service) serviceConfig {
	var out serviceConfig
	sp := svc.Port
	proto := sp.Name.Protocol
	internal, internalEps := svc.Internal()
	external, externalEps := svc.External()

	frontendSet := setExternal
	if sp.ExternalPolicy == model.PolicyLocal {
		frontendSet = setExternalLocal
	}
	add := func(kind string, addr netip.Addr, port uint16, verdict model.Action, eps []model.Endpoint, set string) {
		vs := virtualServer{
			Key:         vsKey{Addr: addr, Proto: proto, Port: port},
			Scheduler:   r.cfg.Scheduler,
			Persistence: sp.AffinityTimeout,
			Kind:        kind,
			Owner:       sp.Name,
		}
		for i := range eps {
			vs.Reals = append(vs.Reals, eps[i].AddrPort())
		}
		out.Servers = append(out.Servers, vs)
		out.Entries = append(out.Entries, setEntry{Set: set, IP: addr, Proto: proto, Port: port})
		if verdict == model.Drop {
			out.Entries = append(out.Entries, setEntry{Set: setDrop, IP: addr, Proto: proto, Port: port})
		}
	}

	add("ClusterIP", sp.ClusterIP, sp.Port, internal, internalEps, setClusterIP)
	out.Addrs = append(out.Addrs, sp.ClusterIP)
	for _, ip := range sp.ExternalIPs {
		add("ExternalIP", ip, sp.Port, external, externalEps, frontendSet)
		out.Addrs = append(out.Addrs, ip)
	}
	allowNode, _ := sp.SourceRangesAdmitNode(r.nodeIPs)
	for _, ip := range sp.LoadBalancerIPs {
		add("LoadBalancer", ip, sp.Port, external, externalEps, frontendSet)
		out.Addrs = append(out.Addrs, ip)
		if len(sp.LoadBalancerSourceRanges) == 0 {
			continue
		}
		out.Entries = append(out.Entries, setEntry{Set: setLBFirewall, IP: ip, Proto: proto, Port: sp.Port})
		for _, src := range sp.LoadBalancerSourceRanges {
			if !r.cfg.inFamily(src.Addr()) {
				continue // an inet6 set holds no IPv4 range, nor the reverse
			}
			out.Entries = append(out.Entries, setEntry{Set: setLBSource, IP: ip, Proto: proto, Port: sp.Port, IP2: src.Masked().Addr(), CIDR2: src.Bits()})
		}
		// A node holding the LoadBalancer IP talks to it from that IP.
		// As upstream's IPVS mode, each LoadBalancer IP admits itself
		// only (iptables admits every LoadBalancer IP of the port).
		if allowNode {
			out.Entries = append(out.Entries, setEntry{Set: setLBSourceIP, IP: ip, Proto: proto, Port: sp.Port, IP2: ip, CIDR2: ip.BitLen()})
		}
	}
	if sp.NodePort != 0 {
		// NodePorts are not subject to loadBalancerSourceRanges.
		for _, ip := range r.nodePortIPs {
			if ip.IsLoopback() || !r.cfg.inFamily(ip) {
				// Never ::1, as upstream; 127.0.0.0/8 would need
				// route_localnet, which we never set.
				continue
			}
			add("NodePort", ip, sp.NodePort, external, externalEps, frontendSet)
		}
	}

	seen := map[netip.AddrPort]bool{}
	for _, vs := range out.Servers {
		for _, rs := range vs.Reals {
			if !seen[rs] {
				seen[rs] = true
				out.Entries = append(out.Entries, setEntry{Set: setHairpin, IP: rs.Addr(), Proto: proto, Port: rs.Port(), IP2: rs.Addr(), CIDR2: rs.Addr().BitLen()})
			}
		}
	}
	return out
}

// dump renders a configuration of family f as sorted lines, the form the
// golden files and failure messages use.
func dump(f *family, cfgs map[model.ServicePortName]serviceConfig) string {
	var lines []string
	addrs := map[netip.Addr]bool{}
	for _, c := range cfgs {
		for _, a := range c.Addrs {
			addrs[a] = true
		}
		for _, vs := range c.Servers {
			line := fmt.Sprintf("service %s %s", vs.Key, vs.Scheduler)
			if vs.Persistence > 0 {
				line += fmt.Sprintf(" persistent %d", int(vs.Persistence/time.Second))
			}
			line += fmt.Sprintf(" (%s %s)", vs.Kind, vs.Owner)
			if len(vs.Reals) == 0 {
				line += " no real servers"
			}
			lines = append(lines, line)
			for _, rs := range vs.Reals {
				lines = append(lines, fmt.Sprintf("service %s -> %s masq weight 1", vs.Key, rs))
			}
		}
		for _, e := range c.Entries {
			lines = append(lines, fmt.Sprintf("ipset %s %s", f.set(e.Set), e))
		}
	}
	for a := range addrs {
		lines = append(lines, fmt.Sprintf("address %s/%d dev %s", a, a.BitLen(), DummyName))
	}
	slices.Sort(lines)
	lines = slices.Compact(lines)
	return strings.Join(lines, "\n") + "\n"
}
