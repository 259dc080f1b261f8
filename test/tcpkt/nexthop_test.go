package tcpkt_test

import (
	"math/bits"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// TestTrackedFlowsFollowNextHopChanges: the XDP and TC programs keep a
// tracked flow's next hop (the FIB's answer) in its entry for the rest of
// the second it was looked up in. A changed neighbour reaches the flow's
// packets from the next second on, and a packet longer than those the
// lookup let through is looked up again: the MTU still holds for it.
func TestTrackedFlowsFollowNextHopChanges(t *testing.T) {
	for _, hook := range []struct {
		name           string
		tc             bool
		sent, overMTU  pktest.Verdict
		overMTUCounter bpfobj.TcLbMetric
	}{
		{name: "XDP", sent: pktest.XDPTX, overMTU: pktest.XDPPass, overMTUCounter: bpfobj.TcLbMetricLB_M_XDP_TO_TC},
		{name: "TC", tc: true, sent: pktest.TCActRedirect, overMTU: pktest.TCActShot, overMTUCounter: bpfobj.TcLbMetricLB_M_TC_NO_ROUTE},
	} {
		t.Run(hook.name, func(t *testing.T) {
			eachFamily(t, func(t *testing.T, fam string) {
				x := newXFam(t, fam, loadOptions{})
				f := x.f
				xo := f.loadXDP(t, f.ifindex)
				x.sync(t, x.fixtureState())
				syn := x.tcp(x.client, x.np(npWebRemote), pktest.SYN).fromOutside()
				ack := x.tcp(x.client, x.np(npWebRemote), pktest.ACK).fromOutside()
				sent := x.tcp(x.snatSrc(), x.remoteWeb, pktest.ACK).forwarded()
				row := func(name string, in []byte, v pktest.Verdict, out []byte) xrow {
					return xrow{tc: hook.tc, Case: pktest.Case{Name: name, In: in, Verdict: v, Out: out}}
				}
				f.runXDP(t, xo, []xrow{
					row("the flow's first packet", syn.Bytes(), hook.sent,
						x.tcp(x.snatSrc(), x.remoteWeb, pktest.SYN).forwarded().toNodeB().Bytes()),
					row("a tracked packet goes to node-b's MAC", ack.Bytes(), hook.sent, sent.toNodeB().Bytes()),
				})

				// node-b's MAC changes.
				moved := net.HardwareAddr{0x02, 0x77, 0x00, 0x00, 0x00, 0x99}
				nodeB := nodeBAddr
				if x.v6 {
					nodeB = nodeB6
				}
				nl := f.ns.Netlink()
				if err := nl.NeighSet(&netlink.Neigh{LinkIndex: int(f.ifindex), Family: family(x.v6), State: netlink.NUD_PERMANENT,
					IP: nodeB.AsSlice(), HardwareAddr: moved}); err != nil {
					t.Fatal(err)
				}
				waitNextSecond(t)
				f.runXDP(t, xo, []xrow{row("from the next second on: node-b's new MAC", ack.Bytes(), hook.sent, sent.WithMACs(deviceMAC, moved).Bytes())})

				// The device's MTU drops below a longer packet's size.
				link, err := nl.LinkByIndex(int(f.ifindex))
				if err != nil {
					t.Fatal(err)
				}
				if err := nl.LinkSetMTU(link, 1300); err != nil {
					t.Fatal(err)
				}
				big := ack.WithPayload(make([]byte, 1300))
				counted, countedOK := f.counted(hook.overMTUCounter, 1)
				// XDP passes it untouched, for TC to handle; TC drops
				// it, translated but not forwarded (no TTL decrement,
				// no new MAC addresses), as without a kept next hop.
				var overOut []byte
				if hook.tc {
					overOut = x.tcp(x.snatSrc(), x.remoteWeb, pktest.ACK).WithPayload(make([]byte, 1300)).fromOutside().Bytes()
				}
				over := row("a packet over the MTU is not sent as the shorter ones were", big.Bytes(), hook.overMTU, overOut)
				over.Setup, over.Check = counted, countedOK
				f.runXDP(t, xo, []xrow{
					row("a short packet still is", ack.Bytes(), hook.sent, sent.WithMACs(deviceMAC, moved).Bytes()),
					over,
				})
			})
		})
	}
}

func family(v6 bool) int {
	if v6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// waitNextSecond sleeps into the next second of CLOCK_MONOTONIC, the
// programs' clock (bpf_ktime_get_ns).
func waitNextSecond(tb testing.TB) {
	tb.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		tb.Fatal(err)
	}
	time.Sleep(time.Second - time.Duration(ts.Nsec) + 10*time.Millisecond)
}

// TestNewFlowsShareANextHop: where the agent lets them
// (tc_nexthop_share_v1), new flows to a backend take the next hop an
// earlier flow found in the same second instead of looking it up: a
// client's own earlier flow's (NexthopShareClient), or any client's
// (NexthopShareAll). By the tracked flows' rule, a changed neighbour
// reaches them from the next second on, a flow that may not share (another
// client's, with a client's sharing) at once, and a packet longer than the
// shared lookup let through is looked up. With sharing off, every new flow
// is looked up.
func TestNewFlowsShareANextHop(t *testing.T) {
	for _, hook := range []struct {
		name string
		tc   bool
		sent pktest.Verdict
	}{
		{name: "XDP", sent: pktest.XDPTX},
		{name: "TC", tc: true, sent: pktest.TCActRedirect},
	} {
		t.Run(hook.name, func(t *testing.T) {
			eachFamily(t, func(t *testing.T, fam string) {
				x := newXFam(t, fam, loadOptions{})
				f := x.f
				xo := f.loadXDP(t, f.ifindex)
				x.sync(t, x.fixtureState())
				share := func(s loader.NexthopShare) { f.shareNexthops(t, x.v6, s) }
				nodeB := nodeBAddr
				if x.v6 {
					nodeB = nodeB6
				}
				setMAC := func(mac net.HardwareAddr) {
					t.Helper()
					if err := f.ns.Netlink().NeighSet(&netlink.Neigh{LinkIndex: int(f.ifindex), Family: family(x.v6), State: netlink.NUD_PERMANENT,
						IP: nodeB.AsSlice(), HardwareAddr: mac}); err != nil {
						t.Fatal(err)
					}
				}
				moved := net.HardwareAddr{0x02, 0x77, 0x00, 0x00, 0x00, 0x99}
				syn := func(client netip.AddrPort) xpkt { return x.tcp(client, x.np(npWebRemote), pktest.SYN) }
				sent := func(mac net.HardwareAddr) []byte {
					return x.tcp(x.snatSrc(), x.remoteWeb, pktest.SYN).forwarded().WithMACs(deviceMAC, mac).Bytes()
				}
				// Each row is a new flow: the fixture has one source NAT
				// port, free again once the flows are forgotten.
				run := func(name string, in xpkt, out []byte, shared uint64) {
					t.Helper()
					x.resetCT(t)
					setup, check := f.counted(bpfobj.TcLbMetricLB_M_TC_NEXTHOP_SHARED, shared)
					r := xrow{tc: hook.tc, Case: pktest.Case{Name: name, In: in.fromOutside().Bytes(), Verdict: hook.sent, Out: out, Setup: setup, Check: check}}
					f.runXDP(t, xo, []xrow{r})
				}

				share(loader.NexthopShareClient)
				waitNextSecond(t)
				run("a client's first flow looks its next hop up", syn(x.client), sent(nodeBMAC), 0)
				setMAC(moved)
				run("its next flow of the second shares that next hop", syn(x.client), sent(nodeBMAC), 1)
				f.forgetNexthop(t, f.ifindex, x.client.Addr(), x.remoteWeb)
				run("a client whose slot another key took is looked up", syn(x.client), sent(moved), 0)
				setMAC(nodeBMAC)
				run("another client's flow is looked up: node-b's MAC now", syn(x.client2), sent(nodeBMAC), 0)
				setMAC(moved)
				run("a longer packet than the shared lookup's is looked up", syn(x.client).WithPayload(make([]byte, 200)),
					x.tcp(x.snatSrc(), x.remoteWeb, pktest.SYN).WithPayload(make([]byte, 200)).forwarded().WithMACs(deviceMAC, moved).Bytes(), 0)
				waitNextSecond(t)
				run("from the next second on, the client's flows take the new MAC", syn(x.client), sent(moved), 0)

				share(loader.NexthopShareAll)
				waitNextSecond(t)
				run("every client's sharing: a first flow looks the next hop up", syn(x.client), sent(moved), 0)
				setMAC(nodeBMAC)
				run("another client's flow of the second shares it", syn(x.client2), sent(moved), 1)
				run("and so does the first client's next", syn(x.client), sent(moved), 1)
				if x.v6 {
					// A source the kernel forwards nothing from (which its
					// FIB lookup may refuse) takes no next hop found for
					// another source: its flow is looked up, node-b's MAC.
					for _, src := range []string{"fe80::1", "::1", "ff02::1"} {
						client := netip.AddrPortFrom(netip.MustParseAddr(src), 40000)
						run("a flow from "+src+" is looked up", syn(client), sent(nodeBMAC), 0)
					}
				}
				f.forgetNexthop(t, f.ifindex, x.unspecified(), x.remoteWeb)
				run("a flow whose slot another key took is looked up", syn(x.client2), sent(nodeBMAC), 0)
				setMAC(moved)
				run("a longer packet than the shared lookup's is looked up, whatever its client", syn(x.client).WithPayload(make([]byte, 200)),
					x.tcp(x.snatSrc(), x.remoteWeb, pktest.SYN).WithPayload(make([]byte, 200)).forwarded().WithMACs(deviceMAC, moved).Bytes(), 0)
				waitNextSecond(t)
				setMAC(nodeBMAC)
				run("from the next second on, no flow takes the old next hop", syn(x.client2), sent(nodeBMAC), 0)

				share(loader.NexthopShareOff)
				setMAC(moved)
				run("sharing off: the next flow of the second is looked up", syn(x.client2), sent(moved), 0)
			})
		})
	}
}

// shareNexthops sets how far new flows of a family (v6 for IPv6) share
// their next hop, as the agent does (internal/dataplane/bpf nexthop.go:
// every client's, on the fixture's routing).
func (f *fixture) shareNexthops(tb testing.TB, v6 bool, share loader.NexthopShare) {
	tb.Helper()
	if err := loader.SetNexthopSharing(f.objs.TcNexthopShareV1, v6, share); err != nil {
		tb.Fatal(err)
	}
}

// forgetNexthop empties, on every CPU, the slot of the next hop cache
// that a new flow from client to backend through device ifindex takes
// (bpf/lib/nexthop.h nh_slot; client is the unspecified address where
// every client's flows share), so that the flow's lookup misses as the
// first to the backend does, touching nothing else.
func (f *fixture) forgetNexthop(tb testing.TB, ifindex uint32, client netip.Addr, backend netip.AddrPort) {
	tb.Helper()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		tb.Fatal(err)
	}
	// nh_slot hashes the device's index where a flow hash has the source
	// port, in network order.
	dev := netip.AddrPortFrom(client, bits.ReverseBytes16(uint16(ifindex)))
	if client.Is4() {
		l := maps.NewLookups(maps.LookupMaps{})
		idx := l.FlowHash(dev, backend, model.TCP) & (f.objs.Tc4NexthopV1.MaxEntries() - 1)
		err = f.objs.Tc4NexthopV1.Put(idx, make([]bpfobj.TcNh4Slot, cpus))
	} else {
		l := maps.NewLookups6(maps.LookupMaps6{})
		idx := l.FlowHash(dev, backend, model.TCP) & (f.objs.Tc6NexthopV1.MaxEntries() - 1)
		err = f.objs.Tc6NexthopV1.Put(idx, make([]bpfobj.TcNh6Slot, cpus))
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// onOneCPU wraps do (a fixture namespace's Do) so that the runs it wraps
// stay on one CPU, the first the thread may use: the next hop cache is per
// CPU, and a run that moved to another CPU would find that CPU's.
func onOneCPU(do func(func() error) error) func(func() error) error {
	return func(run func() error) error {
		return do(func() error {
			var old, one unix.CPUSet
			if err := unix.SchedGetaffinity(0, &old); err != nil {
				return err
			}
			for c := range 1024 {
				if old.IsSet(c) {
					one.Set(c)
					break
				}
			}
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			defer unix.SchedSetaffinity(0, &old) //nolint:errcheck // the thread's own mask, as it was
			return run()
		})
	}
}

// unspecified is the family's unspecified address: the client of a next
// hop every client's flows share.
func (x *xfam) unspecified() netip.Addr {
	if x.v6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}
