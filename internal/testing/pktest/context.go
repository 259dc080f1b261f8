package pktest

import (
	"encoding/binary"
	"fmt"
)

// SKBContext is the part of struct __sk_buff that BPF_PROG_TEST_RUN takes
// from the caller for TC programs and gives back after the run
// (convert___skb_to_skb and convert_skb_to___skb in net/bpf/test_run.c);
// the kernel rejects input with any other field set.
type SKBContext struct {
	Mark     uint32
	Priority uint32
	// IngressIfindex becomes skb->skb_iif (skb->ingress_ifindex).
	IngressIfindex uint32
	// Ifindex names the device the skb belongs to, in the network namespace
	// of the calling thread; 0 or 1 means the loopback device, whose
	// address is all zeros, so unicast frames get PACKET_OTHERHOST. The
	// kernel fails the run with ENODEV for an ifindex it does not know.
	Ifindex uint32
	// CB is skb->cb, the scratch space TC programs share.
	CB       [5]uint32
	Tstamp   uint64
	WireLen  uint32
	GSOSegs  uint32
	GSOSize  uint32
	Hwtstamp uint64
}

// Offsets in struct __sk_buff (linux/bpf.h, the same on every kernel since
// the fields were added; checked against the running kernel's BTF by the
// tests).
const (
	skbOffMark           = 8
	skbOffPriority       = 32
	skbOffIngressIfindex = 36
	skbOffIfindex        = 40
	skbOffCB             = 48
	skbOffTstamp         = 152
	skbOffWireLen        = 160
	skbOffGSOSegs        = 164
	skbOffGSOSize        = 176
	skbOffHwtstamp       = 184
	skbSize              = 192
)

func (c *SKBContext) marshal() []byte {
	b := make([]byte, skbSize)
	if c == nil {
		return b
	}
	le := binary.NativeEndian
	le.PutUint32(b[skbOffMark:], c.Mark)
	le.PutUint32(b[skbOffPriority:], c.Priority)
	le.PutUint32(b[skbOffIngressIfindex:], c.IngressIfindex)
	le.PutUint32(b[skbOffIfindex:], c.Ifindex)
	for i, v := range c.CB {
		le.PutUint32(b[skbOffCB+4*i:], v)
	}
	le.PutUint64(b[skbOffTstamp:], c.Tstamp)
	le.PutUint32(b[skbOffWireLen:], c.WireLen)
	le.PutUint32(b[skbOffGSOSegs:], c.GSOSegs)
	le.PutUint32(b[skbOffGSOSize:], c.GSOSize)
	le.PutUint64(b[skbOffHwtstamp:], c.Hwtstamp)
	return b
}

func unmarshalSKB(b []byte) (*SKBContext, error) {
	if len(b) != skbSize {
		return nil, fmt.Errorf("__sk_buff context of %d bytes, want %d", len(b), skbSize)
	}
	le := binary.NativeEndian
	c := &SKBContext{
		Mark:           le.Uint32(b[skbOffMark:]),
		Priority:       le.Uint32(b[skbOffPriority:]),
		IngressIfindex: le.Uint32(b[skbOffIngressIfindex:]),
		Ifindex:        le.Uint32(b[skbOffIfindex:]),
		Tstamp:         le.Uint64(b[skbOffTstamp:]),
		WireLen:        le.Uint32(b[skbOffWireLen:]),
		GSOSegs:        le.Uint32(b[skbOffGSOSegs:]),
		GSOSize:        le.Uint32(b[skbOffGSOSize:]),
		Hwtstamp:       le.Uint64(b[skbOffHwtstamp:]),
	}
	for i := range c.CB {
		c.CB[i] = le.Uint32(b[skbOffCB+4*i:])
	}
	return c, nil
}

// XDPContext is the part of struct xdp_md a case sets for XDP programs.
type XDPContext struct {
	// LinearLen is how many bytes of the frame the kernel puts into the
	// linear buffer that the program reads through ctx->data; the rest goes
	// into fragment pages, as for a multi-buffer frame (jumbo MTU, GRO). A
	// program without frags support sees only the linear part but returns
	// a verdict for the whole frame. 0 means as much as fits: the whole
	// frame up to 3520 bytes (4 KiB pages), beyond which the kernel always
	// uses fragments.
	LinearLen uint32
	// IngressIfindex names the device the frame arrived on
	// (ctx->ingress_ifindex, and the device of FIB lookups with it), in
	// the network namespace of the calling thread; 0 means none.
	IngressIfindex uint32
}

// XDPResult is struct xdp_md after the run.
type XDPResult struct {
	// LinearLen is the linear part's length after the program, which
	// bpf_xdp_adjust_head and bpf_xdp_adjust_tail change.
	LinearLen uint32
}

// Offsets in struct xdp_md.
const (
	xdpOffData    = 0
	xdpOffDataEnd = 4
	xdpOffIfindex = 12
	xdpSize       = 24
)

func (c *XDPContext) marshal(frameLen int) []byte {
	b := make([]byte, xdpSize)
	end := uint32(frameLen)
	if c != nil && c.LinearLen != 0 {
		end = c.LinearLen
	}
	binary.NativeEndian.PutUint32(b[xdpOffDataEnd:], end)
	if c != nil {
		binary.NativeEndian.PutUint32(b[xdpOffIfindex:], c.IngressIfindex)
	}
	return b
}

func unmarshalXDP(b []byte) *XDPResult {
	le := binary.NativeEndian
	return &XDPResult{LinearLen: le.Uint32(b[xdpOffDataEnd:]) - le.Uint32(b[xdpOffData:])}
}
