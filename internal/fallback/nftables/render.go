package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Chains, maps and sets shared by all Services.
const (
	chainFilterPrerouting     = "filter-prerouting"
	chainFilterInput          = "filter-input"
	chainFilterForward        = "filter-forward"
	chainFilterOutput         = "filter-output"
	chainFilterOutputPostDNAT = "filter-output-post-dnat"
	chainNATPrerouting        = "nat-prerouting"
	chainNATOutput            = "nat-output"
	chainNATPostrouting       = "nat-postrouting"

	chainServices       = "services"
	chainMasquerading   = "masquerading"
	chainMarkMasq       = "mark-for-masquerade"
	chainReject         = "reject-chain"
	chainFirewallCheck  = "firewall-check"
	chainServiceEPCheck = "service-endpoints-check"
	chainNodePortEPChk  = "nodeport-endpoints-check"

	setNodePortIPs = "nodeport-ips"
)

// mapID indexes the verdict maps that hold elements of many Services.
type mapID int

const (
	mapServiceIPs mapID = iota
	mapServiceNodePorts
	mapNoEndpointServices
	mapNoEndpointNodePorts
	mapFirewallIPs
	numMaps
)

// verdictMap describes one of the shared verdict maps.
type verdictMap struct {
	name string
	// nodePort maps are keyed by protocol and port alone; the others by
	// address, protocol and port.
	nodePort bool
	comment  string
}

var verdictMaps = [numMaps]verdictMap{
	mapServiceIPs:          {"service-ips", false, "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
	mapServiceNodePorts:    {"service-nodeports", true, "NodePort traffic"},
	mapNoEndpointServices:  {"no-endpoint-services", false, "drop or reject traffic to Service IPs without usable endpoints"},
	mapNoEndpointNodePorts: {"no-endpoint-nodeports", true, "drop or reject traffic to NodePorts without usable endpoints"},
	mapFirewallIPs:         {"firewall-ips", false, "LoadBalancer IPs with loadBalancerSourceRanges"},
}

// element is one element of a verdict map.
type element struct {
	key   []string
	value string
}

func (e element) id() string { return strings.Join(e.key, " . ") + " : " + e.value }

// chain is one chain with its rules.
type chain struct {
	name  string
	rules []string
}

// affinitySet is the set of clients of one endpoint with ClientIP
// affinity, and how long a client stays in it.
type affinitySet struct {
	name    string
	timeout int // seconds
}

// serviceObjs is everything one ServicePort contributes to the table.
type serviceObjs struct {
	chains   []chain
	sets     []affinitySet
	elements [numMaps][]element
}

// renderer turns model verdicts into nftables objects. It never looks at
// endpoint conditions or topology: which endpoints a kind of traffic may
// reach is the model's decision (Service.Internal, External and
// ShortCircuit).
type renderer struct {
	cfg *Config
	// nodeIPs decide whether a LoadBalancer source range admits the node.
	nodeIPs []netip.Addr
	// nodePorts are the State's NodePort addresses.
	nodePorts model.NodePortAddresses
}

// hashLen characters of base32 of a SHA-256 start the name of every
// per-Service chain and set, as upstream's do; the rest of the name is
// readable and makes it unique.
const hashLen = 8

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:hashLen])
}

// servicePortBase is "<hash>-<namespace>/<name>/<protocol>/<port name>".
func servicePortBase(spn model.ServicePortName) string {
	proto := strings.ToLower(spn.Protocol.String())
	return hash(spn.String()) + "-" + spn.Namespace + "/" + spn.Name + "/" + proto + "/" + spn.Port
}

// endpointBase is "<hash>-<namespace>/<name>/<protocol>/<port name>__<ip>/<port>",
// the colons of an IPv6 address written as dots (nft identifiers have none).
func endpointBase(spn model.ServicePortName, ep netip.AddrPort) string {
	proto := strings.ToLower(spn.Protocol.String())
	ip := strings.ReplaceAll(ep.Addr().String(), ":", ".")
	return hash(spn.String()+"|"+ep.String()) + "-" + spn.Namespace + "/" + spn.Name + "/" + proto + "/" + spn.Port +
		"__" + ip + "/" + strconv.Itoa(int(ep.Port()))
}

// service renders one ServicePort.
func (r *renderer) service(svc *model.Service) serviceObjs {
	var out serviceObjs
	sp := svc.Port
	spn := sp.Name
	proto := strings.ToLower(spn.Protocol.String())
	port := strconv.Itoa(int(sp.Port))

	internal, internalEps := svc.Internal()
	external, externalEps := svc.External()
	shortCircuit, clusterEps := svc.ShortCircuit()
	// Reject means no endpoint anywhere, for every kind of traffic alike.
	hasEndpoints := internal != model.Reject

	base := servicePortBase(spn)
	svcChain := "service-" + base
	svlChain := "local-" + base
	extChain := "external-" + base
	fwChain := "firewall-" + base
	internalChain := policyChain(sp.InternalPolicy, svcChain, svlChain)
	externalChain := policyChain(sp.ExternalPolicy, svcChain, svlChain)

	usesExt := hasEndpoints && sp.ExternallyAccessible()
	usesFW := hasEndpoints && len(sp.LoadBalancerIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0

	// The endpoints each policy chain balances over, as in the iptables
	// dataplane: the chain of the Cluster selection and that of the Local
	// one, written when some verdict sends traffic to it.
	policyEps := map[string][]model.Endpoint{}
	if internal == model.Forward {
		policyEps[internalChain] = internalEps
	}
	if usesExt && shortCircuit == model.Forward {
		policyEps[svcChain] = clusterEps
	}
	if usesExt && external == model.Forward {
		policyEps[externalChain] = externalEps
	}

	add := func(m mapID, value string, key ...string) {
		out.elements[m] = append(out.elements[m], element{key: key, value: value})
	}
	if internal == model.Forward {
		add(mapServiceIPs, "goto "+internalChain, sp.ClusterIP.String(), proto, port)
	} else {
		add(mapNoEndpointServices, verdict(internal), sp.ClusterIP.String(), proto, port)
	}
	for _, ip := range sp.ExternalIPs {
		if hasEndpoints {
			add(mapServiceIPs, "goto "+extChain, ip.String(), proto, port)
		}
		if external != model.Forward {
			add(mapNoEndpointServices, verdict(external), ip.String(), proto, port)
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		if hasEndpoints {
			add(mapServiceIPs, "goto "+extChain, ip.String(), proto, port)
		}
		if usesFW {
			add(mapFirewallIPs, "goto "+fwChain, ip.String(), proto, port)
		}
		if external != model.Forward {
			add(mapNoEndpointServices, verdict(external), ip.String(), proto, port)
		}
	}
	if sp.NodePort != 0 {
		// NodePorts are not subject to loadBalancerSourceRanges, as
		// upstream: the LoadBalancer in front may forward to them.
		np := strconv.Itoa(int(sp.NodePort))
		if hasEndpoints {
			add(mapServiceNodePorts, "goto "+extChain, proto, np)
		}
		if external != model.Forward {
			add(mapNoEndpointNodePorts, verdict(external), proto, np)
		}
	}

	// Per-Service chains in a fixed order: service, local, external,
	// firewall, endpoints.
	epChains := map[netip.AddrPort]string{}
	epChain := func(ep *model.Endpoint) string {
		ap := ep.AddrPort()
		if c, ok := epChains[ap]; ok {
			return c
		}
		c := "endpoint-" + endpointBase(spn, ap)
		epChains[ap] = c
		return c
	}
	affinity := sp.AffinityTimeout > 0
	affinitySetOf := func(ep *model.Endpoint) string { return "affinity-" + endpointBase(spn, ep.AddrPort()) }
	for _, pc := range []string{svcChain, svlChain} {
		eps, ok := policyEps[pc]
		if !ok {
			continue
		}
		var rules []string
		if pc == internalChain && internal == model.Forward {
			rules = append(rules, r.internalMasquerade(sp, proto, port)...)
		}
		if affinity {
			for i := range eps {
				rules = append(rules, r.ip()+" saddr @"+affinitySetOf(&eps[i])+" goto "+epChain(&eps[i]))
			}
		}
		rules = append(rules, balance(eps, epChain)...)
		out.chains = append(out.chains, chain{name: pc, rules: rules})
	}
	if usesExt {
		out.chains = append(out.chains, chain{name: extChain, rules: r.externalRules(sp, svcChain, svlChain, external == model.Forward)})
	}
	if usesFW {
		out.chains = append(out.chains, chain{name: fwChain, rules: r.firewallRules(sp)})
	}
	seen := map[netip.AddrPort]bool{}
	for _, pc := range []string{svcChain, svlChain} {
		for i := range policyEps[pc] {
			ep := &policyEps[pc][i]
			if seen[ep.AddrPort()] {
				continue
			}
			seen[ep.AddrPort()] = true
			rules := []string{r.ip() + " saddr " + ep.Addr.String() + " jump " + chainMarkMasq}
			if affinity {
				set := affinitySet{name: affinitySetOf(ep), timeout: affinitySeconds(sp.AffinityTimeout)}
				out.sets = append(out.sets, set)
				rules = append(rules, "update @"+set.name+" { "+r.ip()+" saddr }")
			}
			rules = append(rules, "meta l4proto "+proto+" dnat to "+ep.AddrPort().String())
			out.chains = append(out.chains, chain{name: epChain(ep), rules: rules})
		}
	}
	return out
}

func (r *renderer) ip() string { return r.cfg.family().ip }

func policyChain(p model.TrafficPolicy, cluster, local string) string {
	if p == model.PolicyLocal {
		return local
	}
	return cluster
}

// verdict is the map value of a verdict other than Forward: reject (in a
// filter chain of its own, as upstream, since nft rejects only in the
// input, forward and output hooks) or drop.
func verdict(a model.Action) string {
	if a == model.Reject {
		return "goto " + chainReject
	}
	return "drop"
}

// balance picks an endpoint at random for a new connection, as the
// iptables dataplane does: rule i of n matches with probability 1/(n-i),
// the last always. Upstream's one numgen vmap rule per Service makes an
// anonymous set per Service, which the kernel allocates in time linear in
// the sets of the table: 10,000 Services took 157 s of kernel time to
// write on 6.18, against 5 s with these rules. The Service itself is
// still found by one verdict map lookup; these rules run for the first
// packet of a connection only.
func balance(eps []model.Endpoint, epChain func(*model.Endpoint) string) []string {
	rules := make([]string, 0, len(eps))
	for i := range eps {
		if n := len(eps) - i; n > 1 {
			rules = append(rules, "numgen random mod "+strconv.Itoa(n)+" == 0 goto "+epChain(&eps[i]))
		} else {
			rules = append(rules, "goto "+epChain(&eps[i]))
		}
	}
	return rules
}

func affinitySeconds(d time.Duration) int { return max(1, int(d/time.Second)) }

// local matches traffic from the node's pods by the local traffic
// detector, or with negate the rest; "" when the detector is not set.
func (r *renderer) local(negate bool) string {
	d := r.cfg.LocalDetector
	op := ""
	if negate {
		op = "!= "
	}
	switch {
	case d.CIDR.IsValid():
		return r.ip() + " saddr " + op + d.CIDR.Masked().String()
	case d.Bridge != "":
		return "iifname " + op + strconv.Quote(d.Bridge)
	case d.InterfacePrefix != "":
		return "iifname " + op + strconv.Quote(d.InterfacePrefix+"*")
	}
	return ""
}

// internalMasquerade masquerades ClusterIP traffic that does not come from
// a pod, so that an off-cluster client routed to the ClusterIP gets replies
// back through this node.
func (r *renderer) internalMasquerade(sp *model.ServicePort, proto, port string) []string {
	dst := r.ip() + " daddr " + sp.ClusterIP.String() + " " + proto + " dport " + port
	switch {
	case r.cfg.MasqueradeAll:
		return []string{dst + " jump " + chainMarkMasq}
	case r.cfg.LocalDetector.IsSet():
		return []string{dst + " " + r.local(true) + " jump " + chainMarkMasq}
	}
	return nil
}

// externalRules are the external chain: external traffic (NodePort,
// ExternalIP, LoadBalancer IP) to the External verdict's endpoints, except
// traffic from pods and from the node itself, which ShortCircuit sends to
// all endpoints.
func (r *renderer) externalRules(sp *model.ServicePort, svcChain, svlChain string, localForward bool) []string {
	if sp.ExternalPolicy != model.PolicyLocal {
		// Endpoints may be on other nodes: masquerade so that replies
		// come back through this node.
		return []string{"jump " + chainMarkMasq, "goto " + svcChain}
	}
	var rules []string
	if r.cfg.LocalDetector.IsSet() {
		rules = append(rules, r.local(false)+" goto "+svcChain)
	}
	// The node's own traffic leaves with the external address as its
	// source, which the endpoint could not answer: masquerade it.
	rules = append(rules,
		"fib saddr type local jump "+chainMarkMasq,
		"fib saddr type local goto "+svcChain)
	if localForward {
		rules = append(rules, "goto "+svlChain)
	}
	// Without a local endpoint the rest returns un-DNATed and
	// no-endpoint-services drops it.
	return rules
}

// firewallRules drop LoadBalancer traffic from outside
// loadBalancerSourceRanges; the rest returns and goes on to the services
// chain.
func (r *renderer) firewallRules(sp *model.ServicePort) []string {
	var allowed []string
	for _, src := range sp.LoadBalancerSourceRanges {
		allowed = append(allowed, src.Masked().String())
	}
	// A node that holds the LoadBalancer IP locally talks to it with
	// that IP as the source.
	_, fromNode := sp.SourceRangesAdmitNode(r.nodeIPs)
	for _, ip := range fromNode {
		allowed = append(allowed, ip.String())
	}
	return []string{r.ip() + " saddr != { " + strings.Join(allowed, ", ") + " } drop"}
}

// baseChain is one of the chains the table hooks into netfilter with.
type baseChain struct {
	name, typ, hook, priority string
}

// baseChains are our hooks. The firewall is checked before DNAT, which
// changes the destination; the no-endpoint verdicts after it, so that
// traffic short-circuited to an endpoint is no longer addressed to the
// frontend the verdict is about. nft names the DNAT priority (-100) in the
// prerouting hook only: the output chains give it as a number.
var baseChains = []baseChain{
	{chainFilterPrerouting, "filter", "prerouting", "dstnat - 10"},
	{chainFilterInput, "filter", "input", "filter - 10"},
	{chainFilterForward, "filter", "forward", "filter - 10"},
	{chainFilterOutput, "filter", "output", "-110"},
	{chainFilterOutputPostDNAT, "filter", "output", "-90"},
	{chainNATPrerouting, "nat", "prerouting", "dstnat"},
	{chainNATOutput, "nat", "output", "dstnat"},
	{chainNATPostrouting, "nat", "postrouting", "srcnat"},
}

// regularChains are the shared chains that are no base chains.
var regularChains = []string{chainServices, chainMasquerading, chainMarkMasq, chainReject,
	chainFirewallCheck, chainServiceEPCheck, chainNodePortEPChk}

// staticRules are the rules of the shared chains, which do not depend on
// the Services, in order.
func (r *renderer) staticRules(forwardDropInvalid bool) []chain {
	mark := r.cfg.masqMark()
	fam := r.cfg.family()
	// Localhost NodePorts would need route_localnet, which exposes the
	// node's 127.0.0.1 services to its network (CVE-2020-8558): loopback
	// destinations never reach the NodePorts, as in upstream's nftables
	// mode, even where --nodeport-addresses holds them.
	nodePortDst := "fib daddr type local " + fam.ip + " daddr != " + fam.loopback.String()
	if !r.nodePorts.All {
		nodePortDst = fam.ip + " daddr @" + setNodePortIPs
	}
	forward := []string{"ct state new jump " + chainServiceEPCheck}
	if forwardDropInvalid {
		// Out-of-window packets are INVALID and would leave un-NATed
		// (kubernetes#74839).
		forward = append([]string{"ct state invalid drop"}, forward...)
	}
	return []chain{
		{chainFilterPrerouting, []string{"ct state new jump " + chainFirewallCheck}},
		{chainFilterInput, []string{"ct state new jump " + chainNodePortEPChk, "ct state new jump " + chainServiceEPCheck}},
		{chainFilterForward, forward},
		{chainFilterOutput, []string{"ct state new jump " + chainFirewallCheck}},
		{chainFilterOutputPostDNAT, []string{"ct state new jump " + chainServiceEPCheck}},
		{chainNATPrerouting, []string{"jump " + chainServices}},
		{chainNATOutput, []string{"jump " + chainServices}},
		{chainNATPostrouting, []string{"jump " + chainMasquerading}},
		{chainServices, []string{
			fam.ip + " daddr . meta l4proto . th dport vmap @" + verdictMaps[mapServiceIPs].name,
			nodePortDst + " meta l4proto . th dport vmap @" + verdictMaps[mapServiceNodePorts].name,
		}},
		{chainMasquerading, []string{
			"meta mark & " + mark + " == 0 return",
			// Clear the bit so that a packet masqueraded here and
			// forwarded again is not masqueraded twice.
			"meta mark set meta mark ^ " + mark,
			"masquerade fully-random",
		}},
		{chainMarkMasq, []string{"meta mark set meta mark | " + mark}},
		{chainReject, []string{"reject with " + fam.icmp + " port-unreachable"}},
		{chainFirewallCheck, []string{fam.ip + " daddr . meta l4proto . th dport vmap @" + verdictMaps[mapFirewallIPs].name}},
		{chainServiceEPCheck, []string{fam.ip + " daddr . meta l4proto . th dport vmap @" + verdictMaps[mapNoEndpointServices].name}},
		{chainNodePortEPChk, []string{nodePortDst + " meta l4proto . th dport vmap @" + verdictMaps[mapNoEndpointNodePorts].name}},
	}
}
