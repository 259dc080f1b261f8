package xtables

import (
	"fmt"
	"net/netip"
	"strings"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
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

// LocalDetectorFor is --detect-local-mode for the fallback dataplanes. The
// zero detector, with the dataplane's ClusterCIDR, lets them use
// --cluster-cidr. NodeCIDR is refused: the fallbacks cannot run with it.
func LocalDetectorFor(o *config.Options) (LocalDetector, error) {
	switch o.DetectLocalMode {
	case config.DetectLocalBridgeInterface:
		return LocalDetector{Bridge: o.PodBridgeInterface}, nil
	case config.DetectLocalInterfaceNamePrefix:
		return LocalDetector{InterfacePrefix: o.PodInterfacePrefix}, nil
	case config.DetectLocalNodeCIDR:
		return LocalDetector{}, fmt.Errorf("--detect-local-mode=NodeCIDR is not supported in nftables, iptables and ipvs mode: use ClusterCIDR with --cluster-cidr, BridgeInterface or InterfaceNamePrefix")
	}
	return LocalDetector{}, nil
}

// NoteLocalhostNodePorts logs that --iptables-localhost-nodeports has no
// effect in the mode named, where it is set.
func NoteLocalhostNodePorts(o *config.Options, mode string, log *zap.Logger) {
	if o.LocalhostNodePorts {
		log.Info("NodePorts on 127.0.0.1 are not served in " + mode + " mode (nor in kube-proxy's nftables mode): they need route_localnet, which exposes the node's localhost services to its network (CVE-2020-8558); --iptables-localhost-nodeports=true has no effect")
	}
}
