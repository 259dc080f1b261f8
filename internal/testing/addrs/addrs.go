// Package addrs parses the address literals of tests. It imports nothing of
// the project, so that the tests of every package, the model's and the
// sources' included, can use it.
package addrs

import "net/netip"

// Parse returns the addresses written in ss; it panics on a bad literal,
// which is a mistake in the test.
func Parse(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// Prefixes returns the prefixes written in ss; it panics on a bad literal.
func Prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}
