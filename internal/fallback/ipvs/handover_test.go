package ipvs

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// The connection table as 6.1 writes it, with a header, an IPv4 TCP
// connection in its handshake, an IPv6 one closed, a UDP one and a
// malformed line.
func TestParseConnections(t *testing.T) {
	table := `Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP 0AF4010C DBF0 0A600050 0050 0AF4010A 1F90 SYN_RECV         59
TCP fd00:0010:0244:0001:0000:0000:0000:000c 8A12 fd00:0010:0096:0000:0000:0000:0000:0050 0050 fd00:0010:0244:0001:0000:0000:0000:000a 1F90 TIME_WAIT       119
UDP 0AF4010C 9C41 0A600035 0035 0AF4010B 0035 UDP             299
TCP zz 0050
`
	got := parseConnections(table)
	want := []ipvsConn{
		{server: vsKey{Addr: netip.MustParseAddr("10.96.0.80"), Proto: model.TCP, Port: 80}, state: "SYN_RECV"},
		{server: vsKey{Addr: netip.MustParseAddr("fd00:10:96::50"), Proto: model.TCP, Port: 80}, state: "TIME_WAIT"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parsed %+v, want %+v", got, want)
	}
}
