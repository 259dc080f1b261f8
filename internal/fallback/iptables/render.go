package iptables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// shared indexes the chains that hold rules of many Services.
type shared int

const (
	natServices shared = iota
	natNodePorts
	filterServices
	filterExternal
	filterNodePorts
	filterFirewall
	numShared
)

var sharedChains = [numShared]struct{ table, chain string }{
	natServices:     {"nat", chainServices},
	natNodePorts:    {"nat", chainNodePorts},
	filterServices:  {"filter", chainServices},
	filterExternal:  {"filter", chainExternalServices},
	filterNodePorts: {"filter", chainNodePorts},
	filterFirewall:  {"filter", chainFirewall},
}

// chain is one per-Service nat chain with its rules.
type chain struct {
	name  string
	rules []string
}

// serviceRules is everything one ServicePort contributes to the tables.
type serviceRules struct {
	chains []chain
	shared [numShared][]string
}

// renderer turns model verdicts into rules. It never looks at endpoint
// conditions or topology: which endpoints a kind of traffic may reach is
// the model's decision (Service.Internal, External, ShortCircuit).
type renderer struct {
	cfg *Config
	// nodeIPs decide whether a LoadBalancer source range admits the node.
	nodeIPs []netip.Addr
	// nodePorts are the State's NodePort addresses: the static rules
	// send traffic to them into the NodePort chain.
	nodePorts model.NodePortAddresses
	// comments are left out of per-Service chains in large clusters.
	comments bool
}

// localhost says whether NodePorts are served on 127.0.0.0/8 to the node's
// own processes: --iptables-localhost-nodeports, where the NodePort
// addresses hold a loopback one (model.NodePortAddresses.Localhost, never
// for IPv6).
func (r *renderer) localhost() bool { return r.nodePorts.Localhost && !r.cfg.IPv6 }

// ruleBuilder collects the words of one rule in iptables-save's order: the
// IP header matches first, then the -m matches as added, then the target.
type ruleBuilder struct {
	header, matches, target []string
}

func (b *ruleBuilder) src(p string, negate bool) *ruleBuilder {
	if negate {
		b.header = append(b.header, "!")
	}
	b.header = append(b.header, "-s", p)
	return b
}

func (b *ruleBuilder) dst(p string, negate bool) *ruleBuilder {
	if negate {
		b.header = append(b.header, "!")
	}
	b.header = append(b.header, "-d", p)
	return b
}

func (b *ruleBuilder) proto(p string) *ruleBuilder {
	b.header = append(b.header, "-p", p)
	return b
}

func (b *ruleBuilder) match(words ...string) *ruleBuilder {
	b.matches = append(b.matches, words...)
	return b
}

func (b *ruleBuilder) comment(c string) *ruleBuilder {
	if c != "" {
		b.matches = append(b.matches, "-m", "comment", "--comment", c)
	}
	return b
}

// dport matches a destination port of proto ("-m tcp --dport 80").
func (b *ruleBuilder) dport(proto string, port uint16) *ruleBuilder {
	return b.match("-m", proto, "--dport", strconv.Itoa(int(port)))
}

func (b *ruleBuilder) jump(target string, args ...string) string {
	b.target = append(append(b.target, "-j", target), args...)
	words := make([]string, 0, len(b.header)+len(b.matches)+len(b.target))
	words = append(append(append(words, b.header...), b.matches...), b.target...)
	return xtables.Rule(words...)
}

func rule() *ruleBuilder { return &ruleBuilder{} }

// localSrc and localIn match the local traffic detector d (or with negate
// the rest) in iptables-save's order of the header: the source before the
// destination, the input interface after it. Each is a no-op for the
// other kind of detector.
func (b *ruleBuilder) localSrc(d xtables.LocalDetector, negate bool) *ruleBuilder {
	if d.CIDR.IsValid() {
		b.header = append(b.header, d.Match(negate)...)
	}
	return b
}

func (b *ruleBuilder) localIn(d xtables.LocalDetector, negate bool) *ruleBuilder {
	if !d.CIDR.IsValid() {
		b.header = append(b.header, d.Match(negate)...)
	}
	return b
}

func host(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// service renders one ServicePort.
func (r *renderer) service(svc *model.Service) serviceRules {
	var out serviceRules
	sp := svc.Port
	spn := sp.Name
	name := spn.String()
	proto := strings.ToLower(spn.Protocol.String())

	internal, internalEps := svc.Internal()
	external, externalEps := svc.External()
	shortCircuit, clusterEps := svc.ShortCircuit()
	// Reject means no endpoint anywhere, for every kind of traffic alike.
	hasEndpoints := internal != model.Reject

	h := hash(name)
	svcChain := serviceChain(kindCluster, h)
	svlChain := serviceChain(kindLocal, h)
	extChain := serviceChain(kindExternal, h)
	fwChain := serviceChain(kindFirewall, h)
	// Endpoint chain names, hashed once per endpoint.
	seps := map[netip.AddrPort]string{}
	sep := func(ep *model.Endpoint) string {
		ap := ep.AddrPort()
		if c, ok := seps[ap]; ok {
			return c
		}
		c := endpointChain(name, ap)
		seps[ap] = c
		return c
	}
	internalChain := policyChain(sp.InternalPolicy, svcChain, svlChain)
	externalChain := policyChain(sp.ExternalPolicy, svcChain, svlChain)

	usesExt := hasEndpoints && sp.ExternallyAccessible()
	usesFW := hasEndpoints && len(sp.LoadBalancerIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0
	lbTarget := extChain
	if usesFW {
		lbTarget = fwChain
	}

	// The endpoint chains each policy chain balances over. A chain is
	// written only when some rule jumps to it; the endpoints of SVC always
	// are the Cluster selection and those of SVL the Local one, whichever
	// verdict names them.
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

	// Frontends in the shared chains.
	if internal == model.Forward {
		out.shared[natServices] = append(out.shared[natServices], rule().
			dst(host(sp.ClusterIP), false).proto(proto).comment(name+" cluster IP").dport(proto, sp.Port).jump(internalChain))
	} else {
		out.shared[filterServices] = append(out.shared[filterServices], r.verdict(rule().
			dst(host(sp.ClusterIP), false).proto(proto).comment(name+" "+verdictComment(internal)).dport(proto, sp.Port), internal))
	}
	for _, ip := range sp.ExternalIPs {
		if hasEndpoints {
			out.shared[natServices] = append(out.shared[natServices], rule().
				dst(host(ip), false).proto(proto).comment(name+" external IP").dport(proto, sp.Port).jump(extChain))
		}
		if external != model.Forward {
			out.shared[filterExternal] = append(out.shared[filterExternal], r.verdict(rule().
				dst(host(ip), false).proto(proto).comment(name+" "+verdictComment(external)).dport(proto, sp.Port), external))
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		if hasEndpoints {
			out.shared[natServices] = append(out.shared[natServices], rule().
				dst(host(ip), false).proto(proto).comment(name+" loadbalancer IP").dport(proto, sp.Port).jump(lbTarget))
		}
		if usesFW {
			// Whatever the firewall chain did not send on is still
			// addressed to the LoadBalancer IP here: drop it.
			out.shared[filterFirewall] = append(out.shared[filterFirewall], rule().
				dst(host(ip), false).proto(proto).comment(name+" traffic not accepted by "+fwChain).dport(proto, sp.Port).jump("DROP"))
		}
		if external != model.Forward {
			out.shared[filterExternal] = append(out.shared[filterExternal], r.verdict(rule().
				dst(host(ip), false).proto(proto).comment(name+" "+verdictComment(external)).dport(proto, sp.Port), external))
		}
	}
	if sp.NodePort != 0 {
		// NodePorts are not subject to loadBalancerSourceRanges, as
		// upstream: the LoadBalancer in front may forward to them.
		if hasEndpoints {
			if r.localhost() {
				// The NodePort on 127.0.0.1 first, alone: its
				// counter is
				// kubeproxy_iptables_localhost_nodeports_accepted_packets_total
				// (LocalhostAccepted), as kube-proxy counts it with
				// nfacct.
				out.shared[natNodePorts] = append(out.shared[natNodePorts], rule().
					dst(r.cfg.family().loopback.String(), false).proto(proto).comment(name).dport(proto, sp.NodePort).jump(extChain))
			}
			out.shared[natNodePorts] = append(out.shared[natNodePorts], rule().
				proto(proto).comment(name).dport(proto, sp.NodePort).jump(extChain))
		}
		if external != model.Forward {
			// Not on loopback addresses when they never reach the
			// NodePorts (see staticRules). The IPv4 rule keeps the
			// order it was first written in; the IPv6 one has
			// ip6tables-save's.
			b := rule()
			switch loopback := r.cfg.family().loopback.String(); {
			case r.localhost():
				b.proto(proto)
			case r.cfg.IPv6:
				b.dst(loopback, true).proto(proto)
			default:
				b.proto(proto).dst(loopback, true)
			}
			out.shared[filterExternal] = append(out.shared[filterExternal], r.verdict(b.
				comment(name+" "+verdictComment(external)).match("-m", "addrtype", "--dst-type", "LOCAL").dport(proto, sp.NodePort), external))
		}
	}
	if sp.HealthCheckNodePort != 0 {
		out.shared[filterNodePorts] = append(out.shared[filterNodePorts], rule().
			proto("tcp").comment(name+" health check node port").dport("tcp", sp.HealthCheckNodePort).jump("ACCEPT"))
	}

	// Per-Service chains, in a fixed order: SVC, SVL, EXT, FW, SEPs.
	for _, pc := range []string{svcChain, svlChain} {
		eps, ok := policyEps[pc]
		if !ok {
			continue
		}
		var rules []string
		if pc == internalChain && internal == model.Forward {
			rules = append(rules, r.internalMasquerade(sp, proto, name)...)
		}
		rules = append(rules, r.balance(sp, eps, name, sep)...)
		out.chains = append(out.chains, chain{name: pc, rules: rules})
	}
	if usesExt {
		out.chains = append(out.chains, chain{name: extChain, rules: r.externalRules(sp, name, svcChain, svlChain, external == model.Forward)})
	}
	if usesFW {
		out.chains = append(out.chains, chain{name: fwChain, rules: r.firewallRules(sp, name, extChain)})
	}
	seen := map[netip.AddrPort]bool{}
	for _, pc := range []string{svcChain, svlChain} {
		for i := range policyEps[pc] {
			ep := &policyEps[pc][i]
			if seen[ep.AddrPort()] {
				continue
			}
			seen[ep.AddrPort()] = true
			out.chains = append(out.chains, chain{name: sep(ep), rules: r.endpointRules(sp, ep, proto, name, sep(ep))})
		}
	}
	return out
}

func policyChain(p model.TrafficPolicy, cluster, local string) string {
	if p == model.PolicyLocal {
		return local
	}
	return cluster
}

// verdict ends b with the target of a verdict other than Forward: REJECT
// with the family's ICMP type, or DROP.
func (r *renderer) verdict(b *ruleBuilder, a model.Action) string {
	if a == model.Reject {
		return b.jump(a.String(), r.cfg.family().reject...)
	}
	return b.jump(a.String())
}

func verdictComment(a model.Action) string {
	if a == model.Drop {
		return "has no local endpoints"
	}
	return "has no endpoints"
}

// comment returns c where per-Service chains carry comments.
func (r *renderer) comment(c string) string {
	if r.comments {
		return c
	}
	return ""
}

// internalMasquerade masquerades ClusterIP traffic that does not come from
// a pod, so that an off-cluster client routed to the ClusterIP gets replies
// back through this node.
func (r *renderer) internalMasquerade(sp *model.ServicePort, proto, name string) []string {
	switch {
	case r.cfg.MasqueradeAll:
		return []string{rule().dst(host(sp.ClusterIP), false).proto(proto).comment(r.comment(name+" cluster IP")).
			dport(proto, sp.Port).jump(chainMarkMasq)}
	case r.cfg.LocalDetector.IsSet():
		d := r.cfg.LocalDetector
		return []string{rule().localSrc(d, true).dst(host(sp.ClusterIP), false).localIn(d, true).proto(proto).
			comment(r.comment(name+" cluster IP")).dport(proto, sp.Port).jump(chainMarkMasq)}
	}
	return nil
}

// balance spreads new connections over eps at random, as kube-proxy does:
// rule i of n matches with probability 1/(n-i), the last always. With
// ClientIP affinity, a client seen within the timeout first goes back to its
// endpoint.
func (r *renderer) balance(sp *model.ServicePort, eps []model.Endpoint, name string, sep func(*model.Endpoint) string) []string {
	rules := make([]string, 0, 2*len(eps))
	if sp.AffinityTimeout > 0 {
		secs := strconv.Itoa(affinitySeconds(sp.AffinityTimeout))
		for i := range eps {
			c := sep(&eps[i])
			rules = append(rules, rule().comment(r.comment(name+" -> "+eps[i].String())).
				match("-m", "recent", "--rcheck", "--seconds", secs, "--reap", "--name", c, "--mask", r.cfg.family().hostMask, "--rsource").jump(c))
		}
	}
	for i := range eps {
		b := rule()
		if r.comments {
			b.comment(name + " -> " + eps[i].String())
		}
		if n := len(eps) - i; n > 1 {
			b.match("-m", "statistic", "--mode", "random", "--probability", probability(n))
		}
		rules = append(rules, b.jump(sep(&eps[i])))
	}
	return rules
}

func probability(n int) string { return strconv.FormatFloat(1.0/float64(n), 'f', 10, 64) }

func affinitySeconds(d time.Duration) int { return max(1, int(d/time.Second)) }

// externalRules are the EXT chain: external traffic (NodePort, ExternalIP,
// LoadBalancer IP) to the External verdict's endpoints, except traffic from
// pods and from the node itself, which ShortCircuit sends to all endpoints.
func (r *renderer) externalRules(sp *model.ServicePort, name, svcChain, svlChain string, localForward bool) []string {
	if sp.ExternalPolicy != model.PolicyLocal {
		// Endpoints may be on other nodes: masquerade so that replies
		// come back through this node.
		return []string{
			rule().comment(r.comment("masquerade traffic for " + name + " external destinations")).jump(chainMarkMasq),
			rule().jump(svcChain),
		}
	}
	var rules []string
	if d := r.cfg.LocalDetector; d.IsSet() {
		rules = append(rules, rule().localSrc(d, false).localIn(d, false).
			comment(r.comment("pod traffic for "+name+" external destinations")).jump(svcChain))
	}
	// The node's own traffic leaves with the external address as its
	// source, which the endpoint could not answer: masquerade it.
	rules = append(rules,
		rule().comment(r.comment("masquerade LOCAL traffic for "+name+" external destinations")).
			match("-m", "addrtype", "--src-type", "LOCAL").jump(chainMarkMasq),
		rule().comment(r.comment("route LOCAL traffic for "+name+" external destinations")).
			match("-m", "addrtype", "--src-type", "LOCAL").jump(svcChain),
	)
	if localForward {
		rules = append(rules, rule().jump(svlChain))
	}
	// Without a local endpoint the rest falls through un-DNATed and the
	// filter table drops it.
	return rules
}

// firewallRules send traffic from loadBalancerSourceRanges on to the EXT
// chain; the rest falls through and EBPFPROXY-FIREWALL drops it.
func (r *renderer) firewallRules(sp *model.ServicePort, name, extChain string) []string {
	var rules []string
	for _, src := range sp.LoadBalancerSourceRanges {
		rules = append(rules, rule().src(src.Masked().String(), false).comment(r.comment(name+" loadbalancer IP")).jump(extChain))
	}
	// A node that holds the LoadBalancer IP locally talks to it with
	// that IP as the source.
	_, fromNode := sp.SourceRangesAdmitNode(r.nodeIPs)
	for _, ip := range fromNode {
		rules = append(rules, rule().src(host(ip), false).comment(r.comment(name+" loadbalancer IP")).jump(extChain))
	}
	return rules
}

// endpointRules are an SEP chain: masquerade an endpoint reaching itself
// (hairpin), remember the client for affinity, DNAT.
func (r *renderer) endpointRules(sp *model.ServicePort, ep *model.Endpoint, proto, name, sep string) []string {
	c := r.comment(name)
	dnat := rule().proto(proto).comment(c)
	if sp.AffinityTimeout > 0 {
		dnat.match("-m", "recent", "--set", "--name", sep, "--mask", r.cfg.family().hostMask, "--rsource")
	}
	dnat.match("-m", proto)
	return []string{
		rule().src(host(ep.Addr), false).comment(c).jump(chainMarkMasq),
		dnat.jump("DNAT", "--to-destination", ep.String()),
	}
}

// staticRules are the rules of the shared chains that do not depend on
// Services, per table and chain, in order.
type staticRule struct{ table, chain, spec string }

func (r *renderer) staticRules(forwardDropInvalid bool) []staticRule {
	mark := r.cfg.masqMark()
	rules := []staticRule{
		{"nat", chainPostrouting, rule().match("-m", "mark", "!", "--mark", mark+"/"+mark).jump("RETURN")},
		// Clear the bit so that a packet masqueraded here and forwarded
		// again (a tunnel, another proxy) is not masqueraded twice.
		{"nat", chainPostrouting, rule().jump("MARK", "--xor-mark", mark)},
		{"nat", chainPostrouting, rule().comment("ebpf-proxy service traffic requiring SNAT").jump("MASQUERADE", "--random-fully")},
		{"nat", chainMarkMasq, rule().jump("MARK", "--or-mark", mark)},
	}
	if forwardDropInvalid {
		// Out-of-window packets are INVALID and would leave un-NATed
		// (kubernetes#74839).
		rules = append(rules, staticRule{"filter", chainForward, rule().match("-m", "conntrack", "--ctstate", "INVALID").jump("DROP")})
	}
	rules = append(rules,
		staticRule{"filter", chainForward, rule().comment("ebpf-proxy forwarding rules").match("-m", "mark", "--mark", mark+"/"+mark).jump("ACCEPT")},
		staticRule{"filter", chainForward, rule().comment("ebpf-proxy forwarding conntrack rule").match("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED").jump("ACCEPT")},
	)
	// Last in nat EBPFPROXY-SERVICES: partial syncs insert Service rules at
	// the top so that this stays last.
	const npComment = "ebpf-proxy service nodeports; NOTE: this must be the last rule in this chain"
	// NodePorts on 127.0.0.1 (r.localhost) need route_localnet, which the
	// dataplane sets as kube-proxy's iptables mode does, and which would
	// let the node's network reach its 127.0.0.1 services
	// (CVE-2020-8558): the rule kube-proxy and the kubelet add drops such
	// packets, unless they come from loopback or were DNATed. Without
	// them, loopback destinations never reach the NodePorts, as in
	// kube-proxy's nftables mode. IPv6 has no route_localnet, and upstream
	// never serves NodePorts on ::1 either.
	loopback := r.cfg.family().loopback
	localhost := r.localhost()
	if localhost {
		rules = append(rules, staticRule{"filter", chainFirewall, rule().src(loopback.String(), true).dst(loopback.String(), false).
			comment("block incoming localnet connections").match("-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT").jump("DROP")})
	}
	if r.nodePorts.All {
		b := rule()
		if !localhost {
			b.dst(loopback.String(), true)
		}
		rules = append(rules, staticRule{"nat", chainServices, b.comment(npComment).
			match("-m", "addrtype", "--dst-type", "LOCAL").jump(chainNodePorts)})
	}
	if !localhost && slices.ContainsFunc(r.nodePorts.Prefixes, loopback.Overlaps) {
		rules = append(rules, staticRule{"nat", chainServices, rule().dst(loopback.String(), false).
			comment("ebpf-proxy: no NodePorts on loopback addresses").jump("RETURN")})
	}
	for _, p := range r.nodePorts.Prefixes {
		if !localhost && p.Bits() >= loopback.Bits() && loopback.Contains(p.Addr()) {
			continue
		}
		rules = append(rules, staticRule{"nat", chainServices, rule().dst(p.Masked().String(), false).comment(npComment).
			match("-m", "addrtype", "--dst-type", "LOCAL").jump(chainNodePorts)})
	}
	return rules
}

// hooks are the jumps from the built-in chains, in the order each chain
// should list them.
func hooks() []xtables.Hook {
	newConn := []string{"-m", "conntrack", "--ctstate", "NEW"}
	h := func(table, chain string, ctNew bool, comment, target string) xtables.Hook {
		b := rule()
		if ctNew {
			b.match(newConn...)
		}
		return xtables.Hook{Table: table, Chain: chain, Spec: b.comment(comment).jump(target)}
	}
	return []xtables.Hook{
		h("nat", "PREROUTING", false, "ebpf-proxy service portals", chainServices),
		h("nat", "OUTPUT", false, "ebpf-proxy service portals", chainServices),
		h("nat", "POSTROUTING", false, "ebpf-proxy postrouting rules", chainPostrouting),
		h("filter", "INPUT", true, "ebpf-proxy load balancer firewall", chainFirewall),
		h("filter", "INPUT", false, "ebpf-proxy health check service ports", chainNodePorts),
		h("filter", "INPUT", true, "ebpf-proxy externally-visible service portals", chainExternalServices),
		h("filter", "FORWARD", true, "ebpf-proxy load balancer firewall", chainFirewall),
		h("filter", "FORWARD", false, "ebpf-proxy forwarding rules", chainForward),
		h("filter", "FORWARD", true, "ebpf-proxy service portals", chainServices),
		h("filter", "FORWARD", true, "ebpf-proxy externally-visible service portals", chainExternalServices),
		h("filter", "OUTPUT", true, "ebpf-proxy load balancer firewall", chainFirewall),
		h("filter", "OUTPUT", true, "ebpf-proxy service portals", chainServices),
	}
}

// sharedChainNames lists, per table, every chain the dataplane keeps
// whatever the Services.
var sharedChainNames = map[string][]string{
	"filter": {chainServices, chainExternalServices, chainNodePorts, chainForward, chainFirewall},
	"nat":    {chainServices, chainNodePorts, chainPostrouting, chainMarkMasq},
}
