package main

import (
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nodeaddrs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
)

// modes are the proxy modes, in the order --proxy-mode=auto tries those
// it may choose.
var modes = proxymode.Modes{bpf.Mode, nftables.Mode, iptables.Mode, ipvs.Mode}

// localAddrs lists the node's interface addresses, among which
// --nodeport-addresses selects, for the sync loop to read before every
// sync. The IPVS mode's dummy interface holds Service addresses, never
// node addresses, whatever the mode in use.
func localAddrs() ([]netip.Addr, error) { return nodeaddrs.Local(ipvs.DummyName) }
