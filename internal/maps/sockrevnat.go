package maps

import (
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// SockTranslated returns a check whether the socket with the given cookie
// was sent to backend by the socket programs, from the entries they keep in
// sock4_revnat_v1. An entry the LRU has already evicted reads as "not
// translated".
func SockTranslated(m *ebpf.Map) func(cookie uint64, backend netip.AddrPort) bool {
	return func(cookie uint64, backend netip.AddrPort) bool {
		if !backend.Addr().Is4() {
			return false
		}
		k := bpfobj.SockSock4RevnatKey{Cookie: cookie, Address: be32(backend.Addr()), Port: be16(backend.Port())}
		var v bpfobj.SockSock4Revnat
		return m.Lookup(&k, &v) == nil
	}
}

// SockTranslated6 is SockTranslated for IPv6 backends, from the entries the
// socket programs keep in sock6_revnat_v1.
func SockTranslated6(m *ebpf.Map) func(cookie uint64, backend netip.AddrPort) bool {
	return func(cookie uint64, backend netip.AddrPort) bool {
		if !ipv6.holds(backend.Addr()) {
			return false
		}
		k := bpfobj.SockSock6RevnatKey{Cookie: cookie, Address: be128(backend.Addr()), Port: be16(backend.Port())}
		var v bpfobj.SockSock6Revnat
		return m.Lookup(&k, &v) == nil
	}
}
