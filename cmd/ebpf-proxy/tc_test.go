package main

import (
	"net/netip"
	"slices"
	"testing"
)

func TestNodePortAddresses(t *testing.T) {
	node := []netip.Addr{netip.MustParseAddr("192.168.77.11")}
	local := []netip.Addr{
		netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.77.11"),
		netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.244.1.1"),
	}
	for _, tc := range []struct {
		name      string
		flag      []string
		localhost bool
		want      []string
		error     bool
	}{
		{name: "unset: every local address but loopback, as iptables mode", flag: nil, want: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}},
		{name: "unset, localhost NodePorts: 127.0.0.1 too", flag: nil, localhost: true, want: []string{"10.0.0.5", "10.244.1.1", "127.0.0.1", "192.168.77.11"}},
		{name: "loopback CIDR, localhost NodePorts", flag: []string{"127.0.0.0/8"}, localhost: true, want: []string{"127.0.0.1"}},
		{name: "primary, localhost NodePorts: the CIDRs do not hold 127.0.0.1", flag: []string{"primary"}, localhost: true, want: []string{"192.168.77.11"}},
		{name: "a CIDR without loopback, localhost NodePorts", flag: []string{"10.0.0.0/8"}, localhost: true, want: []string{"10.0.0.5", "10.244.1.1"}},
		{name: "primary", flag: []string{"primary"}, want: []string{"192.168.77.11"}},
		{name: "a CIDR: local addresses inside it only", flag: []string{"10.0.0.0/8"}, want: []string{"10.0.0.5", "10.244.1.1"}},
		{name: "a CIDR and primary", flag: []string{"10.0.0.0/24", "primary"}, want: []string{"10.0.0.5", "192.168.77.11"}},
		{name: "all: every local address but loopback", flag: []string{"0.0.0.0/0"}, want: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}},
		{name: "an IPv6 CIDR only: the IPv4 proxy takes every address", flag: []string{"::/0"}, want: []string{"10.0.0.5", "10.244.1.1", "192.168.77.11"}},
		{name: "not a CIDR", flag: []string{"eth0"}, error: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cidrs, primary, err := parseNodePortAddresses(tc.flag)
			np := newNodePortAddresses(cidrs, primary, tc.localhost)
			if tc.error {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range np.addresses(node, local) {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
