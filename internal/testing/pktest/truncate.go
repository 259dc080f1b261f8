package pktest

import (
	"fmt"
	"slices"
)

// MinFrameLen is the shortest input BPF_PROG_TEST_RUN accepts for TC and
// XDP programs: an Ethernet header (ETH_HLEN). Shorter input fails with
// EINVAL on every kernel the project supports.
const MinFrameLen = 14

// Truncate returns a copy of the first n bytes of frame.
func Truncate(frame []byte, n int) []byte {
	return slices.Clone(frame[:n])
}

// Cut is frame truncated to Len bytes.
type Cut struct {
	Len   int
	Frame []byte
	// Where says what the cut falls into: "inside the udp header (3 of 8
	// bytes)", or "after the ipv4 header" for a cut at a header boundary.
	Where string
	// Boundary is set when the cut falls between two headers (or between
	// the last header and the payload).
	Boundary bool
}

// Name is a case name for the cut, as "truncated to 37 bytes, inside the
// udp header (3 of 8 bytes)".
func (c Cut) Name() string {
	return fmt.Sprintf("truncated to %d bytes, %s", c.Len, c.Where)
}

// Cuts returns frame truncated to every length from MinFrameLen to one byte
// short of the whole, each saying which header the cut falls into. A
// program must pass or drop each of them, never translate half a header:
//
//	for _, c := range pktest.Cuts(in) {
//		cases = append(cases, pktest.Case{Name: c.Name(), In: c.Frame, Verdict: pktest.XDPPass})
//	}
func Cuts(frame []byte) []Cut {
	spans := Decode(frame).Spans
	var cuts []Cut
	for n := MinFrameLen; n < len(frame); n++ {
		c := Cut{Len: n, Frame: Truncate(frame, n), Where: "beyond the decoded headers"}
		for i, s := range spans {
			if n < s.Off || n >= s.Off+s.Len {
				continue
			}
			if n == s.Off && i > 0 {
				c.Where = "after the " + spanName(spans[i-1].Name)
				c.Boundary = true
			} else {
				c.Where = fmt.Sprintf("inside the %s (%d of %d bytes)", spanName(s.Name), n-s.Off, s.Need)
			}
			break
		}
		cuts = append(cuts, c)
	}
	return cuts
}

func spanName(s string) string {
	switch s {
	case "payload", "trailer", "icmp.inner.payload":
		return s
	}
	return s + " header"
}
