package xtables

import (
	"net/netip"
	"slices"
	"testing"
)

func TestLocalDetectorMatches(t *testing.T) {
	for _, tc := range []struct {
		name        string
		d           LocalDetector
		ipv6        bool
		local, rest []string
	}{
		{"cluster CIDR", LocalDetector{CIDR: netip.MustParsePrefix("10.244.1.7/16")}, false, []string{"-s", "10.244.0.0/16"}, []string{"!", "-s", "10.244.0.0/16"}},
		{"IPv6 cluster CIDR", LocalDetector{CIDR: netip.MustParsePrefix("fd00:10:244:1::7/56")}, true, []string{"-s", "fd00:10:244::/56"}, []string{"!", "-s", "fd00:10:244::/56"}},
		{"bridge", LocalDetector{Bridge: "cni0"}, false, []string{"-i", "cni0"}, []string{"!", "-i", "cni0"}},
		{"bridge for IPv6", LocalDetector{Bridge: "cni0"}, true, []string{"-i", "cni0"}, []string{"!", "-i", "cni0"}},
		{"interface prefix", LocalDetector{InterfacePrefix: "veth"}, false, []string{"-i", "veth+"}, []string{"!", "-i", "veth+"}},
		{"none", LocalDetector{}, false, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.d.Validate(tc.ipv6); err != nil {
				t.Fatal(err)
			}
			if got := tc.d.Match(false); !slices.Equal(got, tc.local) {
				t.Errorf("local: %q, want %q", got, tc.local)
			}
			if got := tc.d.Match(true); !slices.Equal(got, tc.rest) {
				t.Errorf("not local: %q, want %q", got, tc.rest)
			}
			if tc.d.IsSet() != (tc.local != nil) {
				t.Errorf("IsSet %v", tc.d.IsSet())
			}
		})
	}
}

func TestLocalDetectorRefusesBadInput(t *testing.T) {
	for name, tc := range map[string]struct {
		d    LocalDetector
		ipv6 bool
	}{
		"two ways":                  {LocalDetector{Bridge: "cni0", InterfacePrefix: "veth"}, false},
		"IPv6 CIDR for IPv4":        {LocalDetector{CIDR: netip.MustParsePrefix("fd00::/64")}, false},
		"IPv4 CIDR for IPv6":        {LocalDetector{CIDR: netip.MustParsePrefix("10.244.0.0/16")}, true},
		"name too long":             {LocalDetector{Bridge: "a-very-long-bridge-name"}, false},
		"wildcard in name":          {LocalDetector{InterfacePrefix: "veth+"}, false},
		"wildcard in name for IPv6": {LocalDetector{InterfacePrefix: "veth+"}, true},
	} {
		if err := tc.d.Validate(tc.ipv6); err == nil {
			t.Errorf("%s: %+v accepted", name, tc.d)
		}
	}
}
