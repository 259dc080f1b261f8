// Package kubeproxy removes what upstream kube-proxy left on a node that
// ebpf-proxy has taken over: kube-proxy does not remove its rules when it
// exits, so after a migration its iptables chains (iptables and IPVS
// modes), its IPVS virtual servers, ipsets and kube-ipvs0 interface, and
// its nftables tables stay behind. It removes exactly kube-proxy's
// objects, never the kubelet's or another program's, and only once no
// kube-proxy process runs on the node (see Watcher).
//
// The names come from upstream kube-proxy (pkg/proxy/iptables, ipvs and
// nftables as of v1.37, the same as v1.33's, and the chains of releases
// since 1.20).
package kubeproxy

import (
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// chains are kube-proxy's fixed chain names, in any table.
//
// Left out on purpose: KUBE-FIREWALL (the kubelet's, in filter; kube-proxy
// only keeps a duplicate of its rule), KUBE-KUBELET-CANARY and
// KUBE-IPTABLES-HINT (the kubelet's), and KUBE-MARK-DROP, which kube-proxy
// v1.33 to v1.37 neither create nor use and kubelets created until their
// IPTablesOwnershipCleanup (on by default from 1.27): whose it is cannot
// be told, and unreferenced it does nothing.
var chains = map[string]bool{
	// iptables mode.
	"KUBE-SERVICES":          true,
	"KUBE-EXTERNAL-SERVICES": true,
	"KUBE-NODEPORTS":         true,
	"KUBE-POSTROUTING":       true,
	"KUBE-MARK-MASQ":         true,
	"KUBE-FORWARD":           true,
	"KUBE-PROXY-FIREWALL":    true,
	"KUBE-PROXY-CANARY":      true,
	// IPVS mode (KUBE-SERVICES, KUBE-POSTROUTING, KUBE-MARK-MASQ,
	// KUBE-FORWARD and KUBE-PROXY-FIREWALL as above).
	"KUBE-NODE-PORT":              true,
	"KUBE-LOAD-BALANCER":          true,
	"KUBE-SOURCE-RANGES-FIREWALL": true,
	"KUBE-IPVS-FILTER":            true,
	"KUBE-IPVS-OUT-FILTER":        true,
	// The userspace mode, removed in 1.26.
	"KUBE-PORTALS-CONTAINER":  true,
	"KUBE-PORTALS-HOST":       true,
	"KUBE-NODEPORT-CONTAINER": true,
	"KUBE-NODEPORT-HOST":      true,
	"KUBE-NODEPORT-NON-LOCAL": true,
}

// chainPrefixes start the names of the iptables mode's per-Service
// chains: cluster (SVC), local (SVL; XLB before 1.24), endpoint (SEP),
// firewall (FW) and external (EXT).
var chainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-XLB-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-"}

// IsChain reports whether chain, in an iptables table, is kube-proxy's.
// The table does not matter: kube-proxy's names are its own in every table.
func IsChain(table, chain string) bool {
	if chains[chain] {
		return true
	}
	for _, p := range chainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// DummyName is the IPVS mode's interface holding the Service addresses.
const DummyName = "kube-ipvs0"

// ipsets are the IPVS mode's sets. The IPv6 proxier names its sets with
// "KUBE-6-" instead of "KUBE-", cut to ipset's 31 characters.
var ipsets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-LOCAL", "KUBE-LOAD-BALANCER-FW",
	"KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
	"KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
}

// nodePortSets are the sets listing the IPVS mode's NodePorts; the
// virtual servers on those ports (at the node's addresses) are its own.
var nodePortSets = map[string]model.Protocol{
	"KUBE-NODE-PORT-TCP": model.TCP, "KUBE-NODE-PORT-LOCAL-TCP": model.TCP,
	"KUBE-NODE-PORT-UDP": model.UDP, "KUBE-NODE-PORT-LOCAL-UDP": model.UDP,
	"KUBE-NODE-PORT-SCTP-HASH": model.SCTP, "KUBE-NODE-PORT-LOCAL-SCTP-HASH": model.SCTP,
}

// ipv6SetName is kube-proxy's name for the IPv6 twin of a set.
func ipv6SetName(name string) string {
	n := "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
	if len(n) > 31 {
		n = n[:31]
	}
	return n
}

// foreignIPVS names the IPVS mode's objects for the ipvs package.
func foreignIPVS() ipvs.Foreign {
	f := ipvs.Foreign{Dummy: DummyName, NodePortSets: map[string]model.Protocol{}}
	for _, s := range ipsets {
		f.Sets = append(f.Sets, s, ipv6SetName(s))
	}
	for s, p := range nodePortSets {
		f.NodePortSets[s] = p
		f.NodePortSets[ipv6SetName(s)] = p
	}
	return f
}

// nftTables are the nftables mode's tables, as "family name".
var nftTables = []string{"ip kube-proxy", "ip6 kube-proxy"}
