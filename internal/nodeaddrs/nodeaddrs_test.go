package nodeaddrs

import (
	"net/netip"
	"slices"
	"testing"
)

func TestLocalIncludesLoopback(t *testing.T) {
	got, err := Local()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("Local = %v, want 127.0.0.1 among them", got)
	}
}

func TestLocalSkipsNamedInterfaces(t *testing.T) {
	got, err := Local("lo")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(got, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("Local(\"lo\") = %v, want no 127.0.0.1", got)
	}
}
