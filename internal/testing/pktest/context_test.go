package pktest

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestContextLayouts checks the offsets the contexts are marshalled at
// against the running kernel's own description of the structs.
func TestContextLayouts(t *testing.T) {
	spec, err := btf.LoadKernelSpec()
	sandbox.RequireFeature(t, "kernel BTF", err)
	tests := []struct {
		typ     string
		size    uint32
		members map[string]uint32 // byte offsets
	}{
		{"__sk_buff", skbSize, map[string]uint32{
			"mark": skbOffMark, "priority": skbOffPriority, "ingress_ifindex": skbOffIngressIfindex,
			"ifindex": skbOffIfindex, "cb": skbOffCB, "tstamp": skbOffTstamp, "wire_len": skbOffWireLen,
			"gso_segs": skbOffGSOSegs, "gso_size": skbOffGSOSize, "hwtstamp": skbOffHwtstamp,
		}},
		{"xdp_md", xdpSize, map[string]uint32{"data": xdpOffData, "data_end": xdpOffDataEnd}},
	}
	for _, tt := range tests {
		t.Run(tt.typ, func(t *testing.T) {
			var s *btf.Struct
			if err := spec.TypeByName(tt.typ, &s); err != nil {
				t.Fatal(err)
			}
			if s.Size != tt.size {
				t.Errorf("size %d, want %d", s.Size, tt.size)
			}
			found := 0
			for _, m := range s.Members {
				want, ok := tt.members[m.Name]
				if !ok {
					continue
				}
				found++
				if got := m.Offset.Bytes(); got != want {
					t.Errorf("%s at %d, want %d", m.Name, got, want)
				}
			}
			if found != len(tt.members) {
				t.Errorf("found %d of %d members", found, len(tt.members))
			}
		})
	}
}

func TestSKBContextRoundTrip(t *testing.T) {
	in := SKBContext{
		Mark: 1, Priority: 2, IngressIfindex: 3, Ifindex: 4, CB: [5]uint32{5, 6, 7, 8, 9},
		Tstamp: 10, WireLen: 11, GSOSegs: 12, GSOSize: 13, Hwtstamp: 14,
	}
	out, err := unmarshalSKB(in.marshal())
	if err != nil {
		t.Fatal(err)
	}
	if *out != in {
		t.Errorf("got %+v want %+v", *out, in)
	}
	if b := (*SKBContext)(nil).marshal(); len(b) != skbSize {
		t.Errorf("zero context of %d bytes", len(b))
	}
}
