package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
)

// Chains shared by all Services.
const (
	chainServices         = Prefix + "SERVICES"
	chainNodePorts        = Prefix + "NODEPORTS"
	chainPostrouting      = Prefix + "POSTROUTING"
	chainMarkMasq         = Prefix + "MARK-MASQ"
	chainExternalServices = Prefix + "EXTERNAL-SERVICES"
	chainForward          = Prefix + "FORWARD"
	chainFirewall         = Prefix + "FIREWALL"
)

// Kinds of per-Service chain.
const (
	kindCluster  = "SVC"
	kindLocal    = "SVL"
	kindExternal = "EXT"
	kindFirewall = "FW"
	kindEndpoint = "SEP"
)

// hashLen keeps "EBPFPROXY-SVC-" plus the hash within the 28 characters a
// chain name may have: 14 base32 characters are 70 bits, so a collision
// among even a million chains is vanishingly unlikely.
const hashLen = 14

// serviceChain names a ServicePort's chain of a kind; h is the hash of the
// ServicePortName's String, which covers the namespace, name, port name and
// protocol, like kube-proxy's. All kinds of one ServicePort share it.
func serviceChain(kind, h string) string {
	return Prefix + kind + "-" + h
}

// endpointChain names the chain of one endpoint of a ServicePort.
func endpointChain(name string, ep netip.AddrPort) string {
	return Prefix + kindEndpoint + "-" + hash(name+"|"+ep.String())
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:hashLen]
}
