package example

import "net/netip"

// Scenario is one rendering of the example cluster on node-a that the
// iptables and nftables golden tests check: a dataplane configuration (the
// fields their Configs share), --nodeport-addresses, and whether a partial
// sync follows the full one.
type Scenario struct {
	// Name names the golden files: "<Name>-full", and "<Name>-partial"
	// when Partial.
	Name string
	// IPv6 renders the IPv6 example (Example6 on Node6) instead of the
	// IPv4 one (see NodeASource).
	IPv6          bool
	ClusterCIDR   netip.Prefix
	MasqueradeAll bool
	MasqueradeBit int
	// NodePorts is --nodeport-addresses; unset is every address.
	NodePorts []string
	// NoLocalhostNodePorts is --iptables-localhost-nodeports=false: the
	// node's 127.0.0.1 is among its addresses, and the iptables golden
	// files show NodePorts on it unless this is set.
	NoLocalhostNodePorts bool
	// Partial: after the full sync the example churns (Churn), and the
	// partial sync's output is checked against "<Name>-partial".
	Partial bool
}

// Scenarios are the golden tests' renderings, IPv4 and IPv6: the node with
// a cluster CIDR (and NodePorts on 127.0.0.1 in iptables mode), then
// churned; --masquerade-all without a cluster CIDR, with a mark bit of 12,
// NodePorts on 192.168.77.0/24 and loopback, and
// --iptables-localhost-nodeports=false (IPv6: ::1, and an IPv4 prefix the IPv6 dataplane ignores).
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "node-a", ClusterCIDR: ClusterCIDR, Partial: true},
		{Name: "node-a-masquerade-all", MasqueradeAll: true, MasqueradeBit: 12,
			NodePorts: []string{"192.168.77.0/24", "127.0.0.1/32"}, NoLocalhostNodePorts: true},
		{Name: "node-a-ipv6", IPv6: true, ClusterCIDR: ClusterCIDR6, Partial: true},
		{Name: "node-a-ipv6-masquerade-all", IPv6: true, MasqueradeAll: true, MasqueradeBit: 12,
			NodePorts: []string{"fd00:192:168:77::/64", "::1/128", "192.168.77.0/24"}},
	}
}
