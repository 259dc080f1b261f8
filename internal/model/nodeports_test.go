package model

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/addrs"
)

func TestNodePortAddressesResolve(t *testing.T) {
	local := addrs.Parse("127.0.0.1", "192.168.77.11", "10.0.0.5", "10.244.1.1", "::1", "fd00:192:168:77::11", "fd00:10:244:1::1")
	node := Node{Name: "node-a", Addrs: addrs.Parse("192.168.77.11")}
	tests := []struct {
		name      string
		flag      []string
		ipv6      bool
		localhost bool
		node      *Node
		// want are the addresses, all whether every one accepts
		// NodePorts, external those the network reaches NodePorts on.
		want, external []string
		all, lo        bool
	}{
		{name: "unset: every local address", want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"},
			external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true},
		{name: "unset, localhost NodePorts: 127.0.0.1 for the node's sockets", localhost: true,
			want:     []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"},
			external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true, lo: true},
		{name: "a CIDR: the local addresses in it", flag: []string{"10.0.0.0/8"}, localhost: true,
			want: []string{"10.0.0.5", "10.244.1.1"}, external: []string{"10.0.0.5", "10.244.1.1"}},
		{name: "an unmasked CIDR is its network", flag: []string{"192.168.77.9/24"},
			want: []string{"192.168.77.11"}, external: []string{"192.168.77.11"}},
		{name: "two CIDRs", flag: []string{"10.0.0.0/24", "192.168.77.11/32"},
			want: []string{"10.0.0.5", "192.168.77.11"}, external: []string{"10.0.0.5", "192.168.77.11"}},
		{name: "loopback CIDR, localhost NodePorts", flag: []string{"127.0.0.0/8"}, localhost: true,
			want: []string{"127.0.0.1"}, external: []string{}, lo: true},
		{name: "loopback CIDR without localhost NodePorts: the health check listens, no NodePort", flag: []string{"127.0.0.0/8"},
			want: []string{"127.0.0.1"}, external: []string{}},
		{name: "a zero CIDR among others: every address", flag: []string{"10.0.0.0/8", "0.0.0.0/0"},
			want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"}, external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true},
		{name: "only IPv6 CIDRs: every IPv4 address", flag: []string{"fd00::/64"},
			want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"}, external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true},
		{name: "a CIDR with no local address: nowhere", flag: []string{"172.16.0.0/12"}, want: nil, external: []string{}},
		{name: "primary: the node's primary IP", flag: []string{"primary"}, localhost: true,
			want: []string{"192.168.77.11"}, external: []string{"192.168.77.11"}},
		{name: "primary not on an interface: nowhere", flag: []string{"primary"}, node: &Node{Addrs: addrs.Parse("192.168.77.50")},
			want: nil, external: []string{}},
		{name: "primary unknown: every address", flag: []string{"primary"}, node: &Node{},
			want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"}, external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true},
		{name: "primary loopback (kube-proxy's fallback): every address", flag: []string{"primary"}, node: &Node{Addrs: addrs.Parse("127.0.0.1")},
			want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"}, external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true},
		{name: "IPv6 unset: every local IPv6 address, and no localhost NodePorts on ::1", ipv6: true, localhost: true,
			want: []string{"::1", "fd00:10:244:1::1", "fd00:192:168:77::11"}, external: []string{"fd00:10:244:1::1", "fd00:192:168:77::11"}, all: true},
		{name: "IPv6: the list's IPv6 CIDRs", ipv6: true, flag: []string{"192.168.77.0/24", "fd00:192:168:77::/64"},
			want: []string{"fd00:192:168:77::11"}, external: []string{"fd00:192:168:77::11"}},
		{name: "IPv6: only IPv4 CIDRs: every IPv6 address", ipv6: true, flag: []string{"192.168.77.0/24"},
			want: []string{"::1", "fd00:10:244:1::1", "fd00:192:168:77::11"}, external: []string{"fd00:10:244:1::1", "fd00:192:168:77::11"}, all: true},
		{name: "all: every address", flag: []string{"all"}, localhost: true,
			want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"}, external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true, lo: true},
		{name: "primary,localhost (1.37): the primary IP and 127.0.0.1", flag: []string{"primary", "localhost"}, localhost: true,
			want: []string{"127.0.0.1", "192.168.77.11"}, external: []string{"192.168.77.11"}, lo: true},
		{name: "a CIDR and primary: both", flag: []string{"10.0.0.0/24", "primary"},
			want: []string{"10.0.0.5", "192.168.77.11"}, external: []string{"10.0.0.5", "192.168.77.11"}},
		{name: "primary unknown beside localhost: localhost only", flag: []string{"primary", "localhost"}, node: &Node{}, localhost: true,
			want: []string{"127.0.0.1"}, external: []string{}, lo: true},
		{name: "all beside primary: every address", flag: []string{"primary", "all"},
			want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"}, external: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}, all: true},
		{name: "IPv6 localhost: ::1 only", ipv6: true, flag: []string{"localhost"},
			want: []string{"::1"}, external: []string{}},
		{name: "IPv6 primary,localhost", ipv6: true, flag: []string{"primary", "localhost"}, node: &Node{Addrs: addrs.Parse("fd00:192:168:77::11")},
			want: []string{"::1", "fd00:192:168:77::11"}, external: []string{"fd00:192:168:77::11"}},
		{name: "IPv6 primary", ipv6: true, flag: []string{"primary"}, node: &Node{Addrs: addrs.Parse("fd00:192:168:77::11")},
			want: []string{"fd00:192:168:77::11"}, external: []string{"fd00:192:168:77::11"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := ParseNodePortSpec(tc.flag, tc.ipv6, tc.localhost)
			if err != nil {
				t.Fatal(err)
			}
			n := &node
			if tc.node != nil {
				n = tc.node
			}
			got := spec.Resolve(n, local)
			if s := addrStrings(got.Addrs); !slices.Equal(s, tc.want) {
				t.Errorf("Addrs = %v, want %v", s, tc.want)
			}
			if s := addrStrings(got.External()); !slices.Equal(s, tc.external) {
				t.Errorf("External = %v, want %v", s, tc.external)
			}
			if got.All != tc.all || got.Localhost != tc.lo {
				t.Errorf("All = %t, Localhost = %t; want %t, %t", got.All, got.Localhost, tc.all, tc.lo)
			}
		})
	}
}

func addrStrings(a []netip.Addr) []string {
	if a == nil {
		return nil
	}
	out := make([]string, len(a))
	for i, x := range a {
		out[i] = x.String()
	}
	return out
}

func TestParseNodePortSpecRejects(t *testing.T) {
	for _, values := range [][]string{
		{"192.168.77.2"}, // an address without a length
		{"eth0"},
		{"primary", "10.0.0.0/8", "primary"}, // a keyword twice
		{"all", "all"},
		{"Primary"}, // keywords are lower case, as kube-proxy's
	} {
		if _, err := ParseNodePortSpec(values, false, false); err == nil {
			t.Errorf("ParseNodePortSpec(%q) succeeded, want an error", values)
		}
	}
}
