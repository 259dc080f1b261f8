package socklb_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// held is a TCP connection opened through a Service before the changes a
// test makes, used again after each one.
type held struct {
	h *sandbox.Held
}

func (e *env) hold(addr netip.AddrPort) *held {
	e.t.Helper()
	h, err := e.client.Hold(e.ctx(), addr)
	if err != nil {
		e.t.Fatal(err)
	}
	if h.First.Err != "" {
		e.t.Fatalf("held connection to %s: %+v", addr, h.First)
	}
	e.t.Cleanup(func() { h.Close() })
	return &held{h}
}

// check fails the test if the held connection no longer carries data.
func (h *held) check(t *testing.T) {
	t.Helper()
	if err := h.h.Ping(); err != nil {
		t.Errorf("connection opened before the change (to %s) broke: %v", h.h.First.Server, err)
	}
}
