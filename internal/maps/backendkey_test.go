package maps

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// TestBackendKeyKeepsTheBackend checks that the compact key of a backend
// gives it back whole and that an IPv4 address and the same address mapped
// into IPv6 are two backends, as they are two netip.Addrs.
func TestBackendKeyKeepsTheBackend(t *testing.T) {
	bs := []Backend{
		{Addr: netip.MustParseAddr("10.244.1.7"), Port: 8080, Proto: model.TCP},
		{Addr: netip.MustParseAddr("::ffff:10.244.1.7"), Port: 8080, Proto: model.TCP},
		{Addr: netip.MustParseAddr("fd00:10:244::7"), Port: 53, Proto: model.UDP},
		{Addr: netip.MustParseAddr("fd00:10:244::7"), Port: 53, Proto: model.TCP},
		{Addr: netip.MustParseAddr("0.0.0.0"), Port: 0, Proto: model.SCTP},
	}
	seen := map[backendKey]Backend{}
	for _, b := range bs {
		k := keyOf(b)
		if got := k.backend(); got != b {
			t.Errorf("keyOf(%v).backend() = %v", b, got)
		}
		if other, ok := seen[k]; ok {
			t.Errorf("%v and %v have one key", b, other)
		}
		seen[k] = b
	}
}
