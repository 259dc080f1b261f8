package main

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/addrs"
)

func TestOrderFamilies(t *testing.T) {
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	for _, tc := range []struct {
		name  string
		bind  string
		found []v1.IPFamily
		want  []string
	}{
		{name: "nothing known: IPv4 primary", want: []string{"IPv4", "IPv6"}},
		{name: "IPv4 node: both served, as kube-proxy", found: []v1.IPFamily{v4}, want: []string{"IPv4", "IPv6"}},
		{name: "IPv6-only node", found: []v1.IPFamily{v6}, want: []string{"IPv6", "IPv4"}},
		{name: "dual-stack, IPv6 primary", found: []v1.IPFamily{v6, v4}, want: []string{"IPv6", "IPv4"}},
		{name: "--bind-address makes its family primary", bind: "192.168.77.10", found: []v1.IPFamily{v6, v4}, want: []string{"IPv4", "IPv6"}},
		{name: "--bind-address's family is primary without a node address of it", bind: "fd00::1", found: []v1.IPFamily{v4}, want: []string{"IPv6", "IPv4"}},
	} {
		var bind netip.Addr
		if tc.bind != "" {
			bind = netip.MustParseAddr(tc.bind)
		}
		if got := orderFamilies(bind, tc.found); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestAddrFamilies(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		want  []v1.IPFamily
	}{
		{[]string{"127.0.0.1", "::1", "fe80::1"}, nil},
		{[]string{"127.0.0.1", "::1", "fe80::1", "192.168.77.10"}, []v1.IPFamily{v1.IPv4Protocol}},
		{[]string{"fd00:192:168:77::10", "192.168.77.10"}, []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}},
		{[]string{"fd00:192:168:77::10"}, []v1.IPFamily{v1.IPv6Protocol}},
	} {
		if got := addrFamilies(addrs.Parse(tc.addrs...)); !slices.Equal(got, tc.want) {
			t.Errorf("%v: %v, want %v", tc.addrs, got, tc.want)
		}
	}
}
