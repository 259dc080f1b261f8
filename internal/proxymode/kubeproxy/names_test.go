package kubeproxy

import "testing"

func TestIsChainNamesKubeProxysChainsOnly(t *testing.T) {
	tests := []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"filter", "KUBE-SERVICES", true},
		{"filter", "KUBE-EXTERNAL-SERVICES", true},
		{"nat", "KUBE-NODEPORTS", true},
		{"nat", "KUBE-POSTROUTING", true},
		{"nat", "KUBE-MARK-MASQ", true},
		{"filter", "KUBE-FORWARD", true},
		{"filter", "KUBE-PROXY-FIREWALL", true},
		{"mangle", "KUBE-PROXY-CANARY", true},
		{"nat", "KUBE-SVC-6G4VTUJ2WNFMC3ZC", true},
		{"nat", "KUBE-SVL-6G4VTUJ2WNFMC3ZC", true},
		{"nat", "KUBE-SEP-2XZJVPRY2PQVE3B3", true},
		{"nat", "KUBE-EXT-6G4VTUJ2WNFMC3ZC", true},
		{"nat", "KUBE-FW-6G4VTUJ2WNFMC3ZC", true},
		{"nat", "KUBE-XLB-6G4VTUJ2WNFMC3ZC", true},
		{"nat", "KUBE-LOAD-BALANCER", true},
		{"nat", "KUBE-NODE-PORT", true},
		{"filter", "KUBE-IPVS-FILTER", true},
		{"filter", "KUBE-SOURCE-RANGES-FIREWALL", true},
		{"filter", "KUBE-FIREWALL", false},
		{"mangle", "KUBE-KUBELET-CANARY", false},
		{"mangle", "KUBE-IPTABLES-HINT", false},
		{"nat", "KUBE-MARK-DROP", false},
		{"nat", "KUBE-SERVICES-MINE", false},
		{"nat", "EBPFPROXY-SERVICES", false},
		{"filter", "CALICO-INPUT", false},
	}
	for _, tt := range tests {
		if got := IsChain(tt.table, tt.chain); got != tt.want {
			t.Errorf("IsChain(%s, %s) = %v, want %v", tt.table, tt.chain, got, tt.want)
		}
	}
}

func TestIPv6SetNamesFollowKubeProxy(t *testing.T) {
	for in, want := range map[string]string{
		"KUBE-CLUSTER-IP":                "KUBE-6-CLUSTER-IP",
		"KUBE-LOAD-BALANCER-SOURCE-CIDR": "KUBE-6-LOAD-BALANCER-SOURCE-CID",
		"KUBE-NODE-PORT-LOCAL-SCTP-HASH": "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS",
	} {
		if got := ipv6SetName(in); got != want {
			t.Errorf("ipv6SetName(%s) = %s, want %s", in, got, want)
		}
	}
}
