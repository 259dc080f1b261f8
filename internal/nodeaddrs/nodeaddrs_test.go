package nodeaddrs

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func TestListenAddrs(t *testing.T) {
	local := addrs("127.0.0.1", "192.168.77.2", "10.0.5.1", "fd00::2")
	listLocal := func() ([]netip.Addr, error) { return local, nil }
	tests := []struct {
		name    string
		values  []string
		primary string
		want    []netip.Addr
	}{
		{"unset: every address", nil, "192.168.77.2", addrs("0.0.0.0")},
		{"a CIDR: the local addresses in it", []string{"192.168.77.0/24"}, "192.168.77.2", addrs("192.168.77.2")},
		{"an unmasked CIDR is its network", []string{"192.168.77.9/24"}, "", addrs("192.168.77.2")},
		{"two CIDRs", []string{"10.0.0.0/8", "192.168.77.2/32"}, "", addrs("192.168.77.2", "10.0.5.1")},
		{"a zero CIDR among others: every address", []string{"10.0.0.0/8", "0.0.0.0/0"}, "", addrs("0.0.0.0")},
		{"only IPv6 CIDRs: every IPv4 address", []string{"fd00::/64"}, "", addrs("0.0.0.0")},
		{"a CIDR with no local address: nowhere", []string{"172.16.0.0/12"}, "", nil},
		{"primary: the node's primary IP", []string{"primary"}, "192.168.77.2", addrs("192.168.77.2")},
		{"primary not on an interface: nowhere", []string{"primary"}, "192.168.77.50", nil},
		{"primary unknown: every address", []string{"primary"}, "", addrs("0.0.0.0")},
		{"primary loopback (kube-proxy's fallback): every address", []string{"primary"}, "127.0.0.1", addrs("0.0.0.0")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			npa, err := Parse(tc.values, false)
			if err != nil {
				t.Fatal(err)
			}
			var primary netip.Addr
			if tc.primary != "" {
				primary = netip.MustParseAddr(tc.primary)
			}
			got, err := npa.ListenAddrs(primary, listLocal)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ListenAddrs = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestListenAddrsWithoutInterfacesListensEverywhere(t *testing.T) {
	npa, err := Parse([]string{"10.0.0.0/8"}, false)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("netlink down")
	got, err := npa.ListenAddrs(netip.Addr{}, func() ([]netip.Addr, error) { return nil, boom })
	if !errors.Is(err, boom) || !slices.Equal(got, addrs("0.0.0.0")) {
		t.Errorf("ListenAddrs = %v, %v; want [0.0.0.0] and the error", got, err)
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name   string
		values []string
	}{
		{"an address without a length", []string{"192.168.77.2"}},
		{"garbage", []string{"nodes"}},
		{"primary with a CIDR", []string{"primary", "10.0.0.0/8"}},
		{"a CIDR then primary", []string{"10.0.0.0/8", "primary"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse(tc.values, false); err == nil {
				t.Errorf("Parse(%q) succeeded, want an error", tc.values)
			}
		})
	}
}

func TestInterfaceAddrsIncludesLoopback(t *testing.T) {
	got, err := InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("InterfaceAddrs = %v, want 127.0.0.1 among them", got)
	}
}
