package pktest

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Checksum returns the Internet checksum (RFC 1071) of b: the value to put
// into a zeroed checksum field. It is written here rather than taken from
// the packet library that builds the fixtures, so that the verifier checks
// the builders instead of sharing their mistakes.
func Checksum(b []byte) uint16 {
	return ^fold(sum(b, 0))
}

// sum adds b as big-endian 16-bit words to acc, with a trailing odd byte
// padded with zero.
func sum(b []byte, acc uint32) uint32 {
	for len(b) >= 2 {
		acc += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	return acc
}

func fold(acc uint32) uint16 {
	for acc > 0xffff {
		acc = acc&0xffff + acc>>16
	}
	return uint16(acc)
}

// pseudoHeaderSum is the sum of the IPv4 pseudo-header that TCP and UDP
// checksums cover.
func pseudoHeaderSum(src, dst []byte, proto uint8, length int) uint32 {
	acc := sum(src, 0)
	acc = sum(dst, acc)
	acc += uint32(proto)
	acc += uint32(length)
	return acc
}

// ChecksumStatus is the outcome of verifying one checksum field.
type ChecksumStatus uint8

// Outcomes of a checksum verification.
const (
	// ChecksumOK: the field is right.
	ChecksumOK ChecksumStatus = iota
	// ChecksumBad: the field is wrong.
	ChecksumBad
	// ChecksumNone: a UDP checksum of zero, which means the sender
	// computed none (RFC 768).
	ChecksumNone
	// ChecksumUnverifiable: the bytes the checksum covers are not all in
	// the packet: a fragment, a truncated packet, or the first 8 bytes of a
	// segment quoted in an ICMP error.
	ChecksumUnverifiable
)

// String returns a short word for the status.
func (s ChecksumStatus) String() string {
	switch s {
	case ChecksumOK:
		return "ok"
	case ChecksumBad:
		return "bad"
	case ChecksumNone:
		return "none"
	case ChecksumUnverifiable:
		return "not verifiable"
	}
	return fmt.Sprintf("ChecksumStatus(%d)", uint8(s))
}

// ChecksumCheck is the verification of one checksum field of a decoded
// packet.
type ChecksumCheck struct {
	// Field names the checksum, as in Diff: "ipv4.checksum",
	// "udp.checksum", "icmp.inner.ipv4.checksum".
	Field  string
	Status ChecksumStatus
	// Got is the field's value; Want the value that would be right, when
	// Status is ChecksumOK or ChecksumBad.
	Got, Want uint16
	// Reason says why a checksum is ChecksumUnverifiable.
	Reason string
}

// String describes the check, as "0x1c47 (bad, want 0x1c46)".
func (c ChecksumCheck) String() string {
	switch c.Status {
	case ChecksumBad:
		return fmt.Sprintf("%#04x (bad, want %#04x)", c.Got, c.Want)
	case ChecksumUnverifiable:
		return fmt.Sprintf("%#04x (not verifiable: %s)", c.Got, c.Reason)
	}
	return fmt.Sprintf("%#04x (%s)", c.Got, c.Status)
}

// VerifyChecksums decodes frame and returns an error naming every IPv4,
// TCP, UDP and ICMP checksum in it that is wrong, including those of an IP
// header quoted in an ICMP error. Checksums that cannot be verified
// (fragments, truncated packets) and UDP's "no checksum" are not errors.
func VerifyChecksums(frame []byte) error {
	var bad []string
	for _, c := range Decode(frame).Checksums {
		if c.Status == ChecksumBad {
			bad = append(bad, c.Field+": "+c.String())
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("bad checksums: %s", strings.Join(bad, "; "))
	}
	return nil
}
