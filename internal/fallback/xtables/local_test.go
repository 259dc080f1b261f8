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
		local, rest []string
	}{
		{"cluster CIDR", LocalDetector{CIDR: netip.MustParsePrefix("10.244.1.7/16")}, []string{"-s", "10.244.0.0/16"}, []string{"!", "-s", "10.244.0.0/16"}},
		{"bridge", LocalDetector{Bridge: "cni0"}, []string{"-i", "cni0"}, []string{"!", "-i", "cni0"}},
		{"interface prefix", LocalDetector{InterfacePrefix: "veth"}, []string{"-i", "veth+"}, []string{"!", "-i", "veth+"}},
		{"none", LocalDetector{}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.d.Validate(); err != nil {
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
	for name, d := range map[string]LocalDetector{
		"two ways":         {Bridge: "cni0", InterfacePrefix: "veth"},
		"IPv6":             {CIDR: netip.MustParsePrefix("fd00::/64")},
		"name too long":    {Bridge: "a-very-long-bridge-name"},
		"wildcard in name": {InterfacePrefix: "veth+"},
	} {
		if err := d.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, d)
		}
	}
}
