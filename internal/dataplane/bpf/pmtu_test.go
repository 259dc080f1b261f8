package bpf_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// pathMTU is the MTU of the router's route to the external client: smaller
// than every link's, so that the router, not a device, refuses the larger
// packets of replies and says so with an ICMP error.
const pathMTU = 1280

// TestPathMTUDiscoveryThroughANodePort: an external client behind a hop
// whose path MTU (1280) is smaller than the backends' links (1500) holds a
// TCP connection through a NodePort and has lines of 8000 bytes echoed.
// The backend's full-sized replies reach the router as the node translated
// them; the router answers with "fragmentation needed" (IPv4) or "packet
// too big" (IPv6) about a packet from the NodePort, which the node must
// translate back to the backend that sent it, local or on the other node
// (source-NATed), so that it sends smaller segments. Untranslated, the
// error reaches no socket and the echo never comes (a path MTU black
// hole).
func TestPathMTUDiscoveryThroughANodePort(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  func(*testing.T, behaviour.Factory) *behaviour.Env
		f    behaviour.Factory
	}{
		{"IPv4", behaviour.NewEnv, factory},
		{"IPv6", behaviour.NewEnv6, factory6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := tt.env(t, tt.f)
			client := e.Clients[behaviour.ClientExternal]
			nodeA := example.NodeAIP
			if e.IPv6 {
				nodeA = sandbox.IPv6Of(nodeA)
			}
			if err := lockRouteMTU(e.SB.Router, client.IP, client.IP6, e.IPv6); err != nil {
				t.Fatal(err)
			}
			// NodePort 30010 on node-a: every endpoint, masqueraded; a1 is
			// on node-a, b1 on node-b.
			dst := netip.AddrPortFrom(nodeA, 30010)
			held := map[string]*sandbox.Held{}
			for i := 0; (held["a1"] == nil || held["b1"] == nil) && i < 60; i++ {
				h, err := client.Hold(behaviour.Context(t), dst)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { h.Close() })
				if name := h.First.Server; h.First.Err == "" && (name == "a1" || name == "b1") && held[name] == nil {
					held[name] = h
				} else {
					h.Close()
				}
			}
			for _, name := range []string{"a1", "b1"} {
				h := held[name]
				if h == nil {
					t.Fatalf("no connection through %s reached %s", dst, name)
				}
				if err := h.PingSize(500); err != nil {
					t.Fatalf("%s: a short line through %s: %v", name, dst, err)
				}
				for range 3 {
					if err := h.PingSize(8000); err != nil {
						t.Errorf("%s: a line of 8000 bytes through %s behind a path MTU of %d: %v", name, dst, pathMTU, err)
						break
					}
				}
			}
		})
	}
}

// lockRouteMTU gives the router a host route to the client of the family
// with a locked MTU of pathMTU, which it applies to forwarded packets.
func lockRouteMTU(router *sandbox.Host, ip4, ip6 netip.Addr, v6 bool) error {
	dst := ip4
	if v6 {
		dst = ip6
	}
	return router.NS.Do(func() error {
		routes, err := netlink.RouteGet(dst.AsSlice())
		if err != nil || len(routes) == 0 {
			return fmt.Errorf("route to %s on the router: %v", dst, err)
		}
		r := routes[0]
		bits := dst.BitLen()
		route := netlink.Route{
			LinkIndex: r.LinkIndex,
			Dst:       &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(bits, bits)},
			Gw:        r.Gw,
			MTU:       pathMTU,
			MTULock:   true,
		}
		if err := netlink.RouteReplace(&route); err != nil {
			return fmt.Errorf("route to %s with MTU %d: %w", dst, pathMTU, err)
		}
		return nil
	})
}
