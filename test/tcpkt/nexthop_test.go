package tcpkt_test

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/pktest"
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
