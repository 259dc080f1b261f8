package tclb_test

import (
	"fmt"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Legacy ethtool commands (linux/ethtool.h), still served by every kernel:
// the sandbox has no ethtool binary.
const (
	ethtoolSTXCSUM = 0x17
)

// setTXChecksum turns transmit checksum offload on or off.
func setTXChecksum(dev string, on bool) error { return ethtoolSet(dev, ethtoolSTXCSUM, on) }

func ethtoolSet(dev string, cmd uint32, on bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{cmd: cmd}
	if on {
		val.data = 1
	}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], dev)
	ifr.data = uintptr(unsafe.Pointer(&val))
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return fmt.Errorf("ethtool command %#x on %s: %w", cmd, dev, errno)
	}
	return nil
}

// attachXDP loads the XDP program onto node-a's uplink in mode, on the
// maps of the TC programs attach put there.
func (e *env) attachXDP(n *node, mode string) *loader.XDPLoaded {
	t := e.t
	t.Helper()
	bpffs := filepath.Join(e.sb.BPFFS.Path(), n.Name)
	var l *loader.XDPLoaded
	err := n.NS.Do(func() error {
		var err error
		l, err = loader.LoadXDP(loader.XDPConfig{
			BPFFSPath: bpffs, Sizes: small, ConntrackSize: 4096, Mode: mode, Devices: []string{sandbox.IfaceName},
		})
		return err
	})
	if err != nil {
		t.Fatalf("XDP on %s: %v", n.Name, err)
	}
	// Before the TC cleanup of attach, which removes the pins.
	t.Cleanup(l.Close)
	if len(l.Attached) != 1 {
		t.Fatalf("XDP in %s mode on %s: attached %v, failed %v", mode, n.Name, l.Attached, l.Failed)
	}
	return l
}

// peerXDPPass gives dev, the router's end of a node's uplink, an XDP
// program that passes every frame.
func (e *env) peerXDPPass(dev string) {
	t := e.t
	t.Helper()
	err := e.sb.Router.NS.Do(func() error {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: ebpf.XDP, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, int32(2) /* XDP_PASS */), asm.Return()},
		})
		if err != nil {
			return err
		}
		defer prog.Close()
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		t.Fatalf("XDP_PASS program on the router's %s: %v", dev, err)
	}
}

// newXDPEnv is newEnv with TC attached to both nodes and the XDP program
// on node-a's uplink in mode.
func newXDPEnv(t *testing.T, mode string) *env {
	t.Helper()
	e := newTopology(t)
	for _, n := range e.nodes {
		e.attach(n, loader.TCAttachAuto, false)
	}
	a := e.nodes[0]
	if mode == loader.XDPNative {
		// A veth stands in for a NIC here. Frames that native XDP sends
		// back out (XDP_TX) reach the peer only when the peer has NAPI,
		// which an XDP program of its own gives it: the router's end
		// gets one that passes everything. And a frame that native XDP
		// sends on loses the skb's "checksum to be completed" state, so
		// the hosts that originate traffic compute full checksums, as
		// every frame on a real wire has them.
		e.peerXDPPass(fmt.Sprintf("node%d", a.Index))
		for _, h := range []*sandbox.Host{e.client.Host, e.other.Host, e.pods["pod-a"].Host, e.pods["pod-b"].Host} {
			if err := h.NS.Do(func() error { return setTXChecksum(sandbox.IfaceName, false) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.attachXDP(a, mode)
	return e
}

// TestXDPExternalTraffic: with the XDP program on node-a's uplink, in
// native and in generic mode, NodePort and ExternalIP traffic to node-b's
// pod is translated and sent back out by XDP, TC seeing none of it, and
// the rest still works through TC, over IPv4 and over IPv6.
func TestXDPExternalTraffic(t *testing.T) {
	for _, mode := range []string{loader.XDPNative, loader.XDPGeneric} {
		t.Run(mode, func(t *testing.T) {
			e := newXDPEnv(t, mode)
			e.sync(scenario()...)
			e.sync6(scenario()...)
			for _, fam := range []string{"IPv4", "IPv6"} {
				t.Run(fam, func(t *testing.T) { testXDPExternalTraffic(t, e, fam == "IPv6") })
			}
		})
	}
}

// testXDPExternalTraffic is TestXDPExternalTraffic in e for one family.
func testXDPExternalTraffic(t *testing.T, e *env, v6 bool) {
	// ip is the family's address of a host or frontend.
	ip := func(a netip.Addr) netip.Addr {
		if v6 {
			return sandbox.IPv6Of(a)
		}
		return a
	}
	a, b := e.nodes[0], e.nodes[1]
	aIP, bIP, extIP, rangedIP := ip(a.IP), ip(b.IP), ip(extIP), ip(rangedIP)
	outside := ip(e.client.IP)
	// The first packet towards a next hop without a neighbour
	// entry is XDP's to pass (TC resolves it); an operator's
	// node has them. One connection resolves node-a's.
	if rep, err := e.client.TCP(e.ctx(), netip.AddrPortFrom(aIP, 30011), 1); err != nil || rep.Results[0].Err != "" {
		t.Fatalf("warm-up connection: %+v, %v", rep, err)
	}

	type counts struct{ xdpNew, xdpFwd, xdpReply, tcNew, tcFwd, tcReply uint64 }
	read := func() counts {
		return counts{
			xdpNew: e.counter(a, bpfobj.TcLbMetricLB_M_XDP_NEW_SNAT), xdpFwd: e.counter(a, bpfobj.TcLbMetricLB_M_XDP_FWD),
			xdpReply: e.counter(a, bpfobj.TcLbMetricLB_M_XDP_REPLY), tcNew: e.counter(a, bpfobj.TcLbMetricLB_M_TC_NEW_SNAT),
			tcFwd: e.counter(a, bpfobj.TcLbMetricLB_M_TC_FWD), tcReply: e.counter(a, bpfobj.TcLbMetricLB_M_TC_REPLY),
		}
	}
	// byXDP checks that n new flows, further packets of them
	// (when more than the first is sent) and replies went
	// through XDP and none through TC.
	byXDP := func(t *testing.T, before counts, n uint64, more bool) {
		t.Helper()
		after := read()
		if after.xdpNew-before.xdpNew != n || (more && after.xdpFwd == before.xdpFwd) || after.xdpReply == before.xdpReply {
			t.Errorf("XDP counted %d new flows (want %d), %d packets, %d replies",
				after.xdpNew-before.xdpNew, n, after.xdpFwd-before.xdpFwd, after.xdpReply-before.xdpReply)
		}
		if after.tcNew != before.tcNew || after.tcFwd != before.tcFwd || after.tcReply != before.tcReply {
			t.Errorf("TC translated some: %+v before, %+v after", before, after)
		}
		if t.Failed() {
			for i, name := range loader.CounterNames {
				if v := e.counter(a, bpfobj.TcLbMetric(i)); v != 0 {
					t.Logf("counter %s = %d", name, v)
				}
			}
		}
	}

	for _, tc := range []struct {
		name string
		to   netip.AddrPort
	}{
		{"NodePort, backend on the other node", netip.AddrPortFrom(aIP, 30011)},
		{"ExternalIP routed to node-a, backend on node-b", netip.AddrPortFrom(extIP, 80)},
	} {
		t.Run(tc.name+": translated by XDP", func(t *testing.T) {
			before := read()
			rep, err := e.client.TCP(e.ctx(), tc.to, 5)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				if r.Err != "" || r.Server != "pod-b" || r.ClientSeen.Addr() != aIP || r.Peer != tc.to {
					t.Errorf("got %+v; want served by pod-b, who sees %s, the client's peer %s", r, aIP, tc.to)
				}
			}
			byXDP(t, before, 5, true)
		})
	}
	t.Run("UDP NodePort, backend on the other node: XDP, the reply from the NodePort", func(t *testing.T) {
		before := read()
		to := netip.AddrPortFrom(aIP, 30012)
		rep, err := e.client.UDPConnected(e.ctx(), to, 5)
		if err != nil {
			t.Fatal(err)
		}
		// Each datagram is sent from a new socket, so each is a new flow,
		// unless the kernel gave a socket the port of an earlier one
		// whose flow is still tracked: its datagram is that flow's next
		// packet.
		ports := map[uint16]bool{}
		for _, r := range rep.Results {
			if r.Err != "" || r.Server != "pod-b" || r.From != to || r.ClientSeen.Addr() != aIP {
				t.Errorf("got %+v; want an answer of pod-b from %s that saw %s", r, to, aIP)
			}
			ports[r.Local.Port()] = true
		}
		if len(ports) < len(rep.Results) {
			t.Logf("%d datagrams from %d client ports", len(rep.Results), len(ports))
		}
		byXDP(t, before, uint64(len(ports)), len(ports) < len(rep.Results))
	})
	t.Run("NodePort, backend on node-a: TC delivers it, client address kept", func(t *testing.T) {
		before := read()
		to := netip.AddrPortFrom(aIP, 30010)
		rep, err := e.client.TCP(e.ctx(), to, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			if r.Err != "" || r.Server != "pod-a" || r.ClientSeen.Addr() != outside || r.Peer != to {
				t.Errorf("got %+v; want pod-a seeing %s", r, outside)
			}
		}
		if after := read(); after.xdpNew != before.xdpNew {
			t.Errorf("XDP took %d flows to a local pod", after.xdpNew-before.xdpNew)
		}
	})
	t.Run("NodePort on node-b (no XDP), backend on node-a", func(t *testing.T) {
		rep, err := e.client.TCP(e.ctx(), netip.AddrPortFrom(bIP, 30010), 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			if r.Err != "" || r.Server != "pod-a" || r.ClientSeen.Addr() != bIP {
				t.Errorf("got %+v; want pod-a seeing %s", r, bIP)
			}
		}
	})
	t.Run("no endpoints: TC's refusal reaches the client", func(t *testing.T) {
		e.expectRefused(t, netip.AddrPortFrom(aIP, 30015), 2)
	})
	t.Run("externalTrafficPolicy=Local without a local endpoint: XDP drops", func(t *testing.T) {
		e.expectDropped(t, e.client, netip.AddrPortFrom(aIP, 30014), a, bpfobj.TcLbMetricLB_M_DROP, "drop")
	})
	t.Run("loadBalancerSourceRanges through XDP", func(t *testing.T) {
		// The client inside is served, the one outside dropped.
		e.expectServed(t, e.client, netip.AddrPortFrom(rangedIP, 80), 1, "pod-b", netip.Addr{})
		e.expectTimedOut(t, e.other, netip.AddrPortFrom(rangedIP, 80))
	})
}
