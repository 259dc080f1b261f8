package ipvs

import (
	"fmt"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
)

// Our chains; the prefix is shared with the iptables dataplane, so that
// either mode's start removes the other's chains.
const (
	chainServices    = xtables.Prefix + "SERVICES"
	chainPostrouting = xtables.Prefix + "POSTROUTING"
	chainMarkMasq    = xtables.Prefix + "MARK-MASQ"
	chainForward     = xtables.Prefix + "FORWARD"
	chainFirewall    = xtables.Prefix + "FIREWALL"
)

type rule struct{ table, chain, spec string }

// rules are the whole iptables side of the IPVS dataplane: a fixed set of
// rules matching the ipsets, written on every full sync. Both families
// write the same rules, each with its own tools and its own family's sets:
// ip6tables' addrtype, set, mark and MASQUERADE matches and targets work
// as iptables' do, and IPVS itself refuses connections to a virtual server
// without real servers, with the ICMP of the family.
func rules(cfg *Config, dropInvalid bool) []rule {
	mark := fmt.Sprintf("%#x", uint32(1)<<cfg.MasqueradeBit)
	fam := cfg.family()
	set := func(name string) string { return fam.set(name) }
	r := xtables.Rule
	var out []rule
	add := func(table, chain string, words ...string) {
		out = append(out, rule{table, chain, r(words...)})
	}
	// mangle runs before IPVS in PREROUTING and OUTPUT, so a drop here
	// happens before IPVS could answer with "port unreachable".
	add("mangle", chainFirewall, "-m", "comment", "--comment", "traffic policy Local without a local endpoint",
		"-m", "set", "--match-set", set(setDrop), "dst,dst", "-j", "DROP")
	add("mangle", chainFirewall, "-m", "comment", "--comment", "loadBalancerSourceRanges",
		"-m", "set", "--match-set", set(setLBFirewall), "dst,dst",
		"-m", "set", "!", "--match-set", set(setLBSource), "dst,dst,src",
		"-m", "set", "!", "--match-set", set(setLBSourceIP), "dst,dst,src", "-j", "DROP")

	// nat runs before IPVS too: the mark set here survives IPVS's NAT
	// and is masqueraded in POSTROUTING (with net.ipv4.vs.conntrack on).
	switch {
	case cfg.MasqueradeAll:
		add("nat", chainServices, "-m", "comment", "--comment", "masquerade all ClusterIP traffic",
			"-m", "set", "--match-set", set(setClusterIP), "dst,dst", "-j", chainMarkMasq)
	case cfg.LocalDetector.IsSet():
		add("nat", chainServices, append(cfg.LocalDetector.Match(true), "-m", "comment", "--comment", "masquerade off-cluster ClusterIP traffic",
			"-m", "set", "--match-set", set(setClusterIP), "dst,dst", "-j", chainMarkMasq)...)
	default:
		// The node reaches a ClusterIP bound on the dummy interface
		// from that very address, which no endpoint could answer.
		add("nat", chainServices, "-m", "comment", "--comment", "masquerade the node's ClusterIP traffic",
			"-m", "addrtype", "--src-type", "LOCAL", "-m", "set", "--match-set", set(setClusterIP), "dst,dst", "-j", chainMarkMasq)
	}
	add("nat", chainServices, "-m", "comment", "--comment", "masquerade external traffic (policy Cluster)",
		"-m", "set", "--match-set", set(setExternal), "dst,dst", "-j", chainMarkMasq)
	add("nat", chainServices, "-m", "comment", "--comment", "masquerade the node's external traffic (policy Local)",
		"-m", "addrtype", "--src-type", "LOCAL", "-m", "set", "--match-set", set(setExternalLocal), "dst,dst", "-j", chainMarkMasq)
	add("nat", chainPostrouting, "-m", "comment", "--comment", "endpoint reaching itself (hairpin)",
		"-m", "set", "--match-set", set(setHairpin), "dst,dst,src", "-j", "MASQUERADE")
	add("nat", chainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	add("nat", chainPostrouting, "-j", "MARK", "--xor-mark", mark)
	add("nat", chainPostrouting, "-m", "comment", "--comment", "ebpf-proxy service traffic requiring SNAT", "-j", "MASQUERADE", "--random-fully")
	add("nat", chainMarkMasq, "-j", "MARK", "--or-mark", mark)

	if dropInvalid {
		add("filter", chainForward, "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	}
	add("filter", chainForward, "-m", "comment", "--comment", "ebpf-proxy forwarding rules", "-m", "mark", "--mark", mark+"/"+mark, "-j", "ACCEPT")
	add("filter", chainForward, "-m", "comment", "--comment", "ebpf-proxy forwarding conntrack rule", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	return out
}

// chains lists our chains per table.
var chains = map[string][]string{
	"filter": {chainForward},
	"nat":    {chainServices, chainPostrouting, chainMarkMasq},
	"mangle": {chainFirewall},
}

func hooks() []xtables.Hook {
	r := xtables.Rule
	return []xtables.Hook{
		{Table: "mangle", Chain: "PREROUTING", Spec: r("-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "ebpf-proxy ipvs firewall", "-j", chainFirewall)},
		{Table: "mangle", Chain: "OUTPUT", Spec: r("-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "ebpf-proxy ipvs firewall", "-j", chainFirewall)},
		{Table: "nat", Chain: "PREROUTING", Spec: r("-m", "comment", "--comment", "ebpf-proxy service portals", "-j", chainServices)},
		{Table: "nat", Chain: "OUTPUT", Spec: r("-m", "comment", "--comment", "ebpf-proxy service portals", "-j", chainServices)},
		{Table: "nat", Chain: "POSTROUTING", Spec: r("-m", "comment", "--comment", "ebpf-proxy postrouting rules", "-j", chainPostrouting)},
		{Table: "filter", Chain: "FORWARD", Spec: r("-m", "comment", "--comment", "ebpf-proxy forwarding rules", "-j", chainForward)},
	}
}

// transaction writes every rule, removes our other chains (the iptables
// mode's, an older version's) and lets addHooks fix the jumps.
func transaction(cfg *Config, dropInvalid bool, stale map[string]map[string]bool, addHooks func(*xtables.Transaction) error) (*xtables.Transaction, error) {
	tx := &xtables.Transaction{}
	for _, table := range xtables.Tables {
		for _, c := range chains[table] {
			tx.Table(table).Chain(c)
		}
	}
	if err := addHooks(tx); err != nil {
		return nil, err
	}
	for _, rl := range rules(cfg, dropInvalid) {
		tx.Table(rl.table).Append(rl.chain, rl.spec)
	}
	for _, table := range xtables.Tables {
		var old []string
		for c := range stale[table] {
			if !slices.Contains(chains[table], c) {
				old = append(old, c)
			}
		}
		slices.Sort(old)
		for _, c := range old {
			tx.Table(table).Chain(c)
			tx.Table(table).DeleteChain(c)
		}
	}
	return tx, nil
}
