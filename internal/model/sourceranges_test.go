package model_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/addrs"
)

func TestSourceRangesAdmitNode(t *testing.T) {
	for _, tc := range []struct {
		name        string
		lbIPs       []netip.Addr
		ranges      []netip.Prefix
		node        []netip.Addr
		wantAdmit   bool
		wantSources []netip.Addr
	}{{
		name:   "no ranges: nothing is restricted, nothing to admit",
		lbIPs:  addrs.Parse("198.19.0.8"),
		node:   addrs.Parse("192.168.77.11"),
		ranges: nil,
	}, {
		name:   "ranges without a LoadBalancer IP restrict nothing",
		ranges: addrs.Prefixes("192.168.77.0/24"),
		node:   addrs.Parse("192.168.77.11"),
	}, {
		name:   "no range holds the node",
		lbIPs:  addrs.Parse("198.19.0.8"),
		ranges: addrs.Prefixes("203.0.113.0/24", "198.51.100.7/32"),
		node:   addrs.Parse("192.168.77.11"),
	}, {
		name:      "a range holds the node: admitted with every LoadBalancer IP as a source",
		lbIPs:     addrs.Parse("198.19.0.8", "198.19.0.9"),
		ranges:    addrs.Prefixes("203.0.113.0/24", "192.168.77.0/24"),
		node:      addrs.Parse("192.168.77.11"),
		wantAdmit: true, wantSources: addrs.Parse("198.19.0.8", "198.19.0.9"),
	}, {
		name:      "any of the node's addresses will do",
		lbIPs:     addrs.Parse("198.19.0.8"),
		ranges:    addrs.Prefixes("10.0.0.0/8"),
		node:      addrs.Parse("192.168.77.11", "10.1.2.3"),
		wantAdmit: true, wantSources: addrs.Parse("198.19.0.8"),
	}, {
		name:      "a range with host bits set is the network it names",
		lbIPs:     addrs.Parse("198.19.0.8"),
		ranges:    addrs.Prefixes("192.168.77.200/24"),
		node:      addrs.Parse("192.168.77.11"),
		wantAdmit: true, wantSources: addrs.Parse("198.19.0.8"),
	}, {
		name:      "a single-address range naming the node",
		lbIPs:     addrs.Parse("198.19.0.8"),
		ranges:    addrs.Prefixes("192.168.77.11/32"),
		node:      addrs.Parse("192.168.77.11"),
		wantAdmit: true, wantSources: addrs.Parse("198.19.0.8"),
	}, {
		name:   "a range of the other family never holds the node",
		lbIPs:  addrs.Parse("198.19.0.8"),
		ranges: addrs.Prefixes("::/0", "2001:db8::/32"),
		node:   addrs.Parse("192.168.77.11"),
	}, {
		name:      "IPv6: a range holding the node's IPv6 address",
		lbIPs:     addrs.Parse("fd00:198:19::8"),
		ranges:    addrs.Prefixes("fd00:192:168:77::/64"),
		node:      addrs.Parse("192.168.77.11", "fd00:192:168:77::11"),
		wantAdmit: true, wantSources: addrs.Parse("fd00:198:19::8"),
	}, {
		name:   "no node addresses: never admitted",
		lbIPs:  addrs.Parse("198.19.0.8"),
		ranges: addrs.Prefixes("0.0.0.0/1", "128.0.0.0/1"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			sp := &model.ServicePort{LoadBalancerIPs: tc.lbIPs, LoadBalancerSourceRanges: tc.ranges}
			admit, sources := sp.SourceRangesAdmitNode(tc.node)
			if admit != tc.wantAdmit || !slices.Equal(sources, tc.wantSources) {
				t.Errorf("SourceRangesAdmitNode(%v) = %v, %v; want %v, %v", tc.node, admit, sources, tc.wantAdmit, tc.wantSources)
			}
		})
	}
}
