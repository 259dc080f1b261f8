package ipvs

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// newNetns creates a network namespace that lives until the test ends.
func newNetns(t *testing.T) vnetns.NsHandle {
	t.Helper()
	ns, err := netns.New("")
	if err != nil {
		t.Fatalf("create network namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// handleIn returns a netlink handle that configures ns.
func handleIn(t *testing.T, ns vnetns.NsHandle) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

// link connects two namespaces with a veth pair and gives each end an
// address; nameA lives in a, nameB in b.
func link(t *testing.T, a vnetns.NsHandle, nameA, addrA string, b vnetns.NsHandle, nameB, addrB string) {
	t.Helper()
	ha, hb := handleIn(t, a), handleIn(t, b)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nameA},
		PeerName:      nameB,
		PeerNamespace: netlink.NsFd(b),
	}
	if err := ha.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s/%s: %v", nameA, nameB, err)
	}
	configure(t, ha, nameA, addrA)
	configure(t, hb, nameB, addrB)
}

// configure adds addr (CIDR) to the link and sets it and loopback up.
func configure(t *testing.T, h *netlink.Handle, name, addr string) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("find %s: %v", name, err)
	}
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		t.Fatalf("parse %s: %v", addr, err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", addr, name, err)
	}
	for _, n := range []string{name, "lo"} {
		l, err := h.LinkByName(n)
		if err != nil {
			t.Fatalf("find %s: %v", n, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatalf("set %s up: %v", n, err)
		}
	}
}

// route adds a route to dst (CIDR) via gw in the namespace of h.
func route(t *testing.T, h *netlink.Handle, dst, gw string) {
	t.Helper()
	_, n, err := net.ParseCIDR(dst)
	if err != nil {
		t.Fatalf("parse %s: %v", dst, err)
	}
	if err := h.RouteAdd(&netlink.Route{Dst: n, Gw: net.ParseIP(gw)}); err != nil {
		t.Fatalf("route %s via %s: %v", dst, gw, err)
	}
}
