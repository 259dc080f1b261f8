package xtables

import (
	"fmt"
	"net/netip"
	"strings"
)

// LocalDetector tells traffic from the node's pods from the rest, as
// kube-proxy's --detect-local-mode does: by source prefix (ClusterCIDR,
// NodeCIDR), by input bridge (BridgeInterface) or by input interface name
// prefix (InterfaceNamePrefix). At most one field is set; the zero value
// detects nothing, as upstream's no-op detector.
type LocalDetector struct {
	// CIDR holds the pods' addresses.
	CIDR netip.Prefix
	// Bridge is the bridge the pods are attached to.
	Bridge string
	// InterfacePrefix starts the names of the pods' host-side interfaces.
	InterfacePrefix string
}

// IsSet says whether the detector detects anything.
func (d LocalDetector) IsSet() bool {
	return d.CIDR.IsValid() || d.Bridge != "" || d.InterfacePrefix != ""
}

// Validate checks that at most one way is given and that it is usable by
// the dataplane of one IP family (ipv6 false: IPv4): a CIDR must be of that
// family, as each of upstream's per-family proxiers has its own detector.
func (d LocalDetector) Validate(ipv6 bool) error {
	n := 0
	if d.CIDR.IsValid() {
		n++
		if d.CIDR.Addr().Is6() != ipv6 {
			want := "IPv4"
			if ipv6 {
				want = "IPv6"
			}
			return fmt.Errorf("local traffic CIDR %s: not %s", d.CIDR, want)
		}
	}
	for _, name := range []string{d.Bridge, d.InterfacePrefix} {
		if name == "" {
			continue
		}
		n++
		if len(name) > 15 || strings.ContainsAny(name, " /+!") {
			return fmt.Errorf("local traffic interface %q: not an interface name", name)
		}
	}
	if n > 1 {
		return fmt.Errorf("local traffic detector: give one of a CIDR, a bridge or an interface prefix")
	}
	return nil
}

// Match returns the iptables words that match local traffic, or with
// negate the rest; nil when the detector is not set.
func (d LocalDetector) Match(negate bool) []string {
	var w []string
	if negate {
		w = append(w, "!")
	}
	switch {
	case d.CIDR.IsValid():
		return append(w, "-s", d.CIDR.Masked().String())
	case d.Bridge != "":
		return append(w, "-i", d.Bridge)
	case d.InterfacePrefix != "":
		return append(w, "-i", d.InterfacePrefix+"+")
	}
	return nil
}
