package maps

import (
	"encoding/binary"
	"net/netip"
)

// Byte order is converted here and nowhere else. The C types hold network
// order (__be32, __be16) in memory; the generated Go fields are plain
// integers read in host order, so a network-order value is stored as the
// host-order integer whose memory bytes are the network bytes.

// be32 returns the host integer whose bytes are a's in network order.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// addrFromBE32 inverts be32.
func addrFromBE32(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// be16 returns the host integer whose bytes are p in network order.
func be16(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// portFromBE16 inverts be16.
func portFromBE16(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}
