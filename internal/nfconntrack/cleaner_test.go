package nfconntrack

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main()
	os.Exit(m.Run())
}

// createEntries writes one UDP or TCP entry per flow (original source,
// original destination, reply source) into the conntrack table of the
// namespace behind nl, as a translated flow's entry looks.
func createEntries(t *testing.T, nl *netlink.Handle, flows ...*netlink.ConntrackFlow) {
	t.Helper()
	for _, f := range flows {
		family := netlink.InetFamily(unix.AF_INET)
		if f.Forward.SrcIP.To4() == nil {
			family = unix.AF_INET6
		}
		f.FamilyType = uint8(family)
		f.TimeOut = 120
		if err := nl.ConntrackCreate(netlink.ConntrackTable, family, f); err != nil {
			t.Fatalf("create conntrack entry %s: %v", f, err)
		}
	}
}

// entries lists the conntrack entries of a family in nl's namespace as
// "src->dst replied by src" strings, sorted.
func entries(t *testing.T, nl *netlink.Handle, ipv6 bool) []string {
	t.Helper()
	family := netlink.InetFamily(unix.AF_INET)
	if ipv6 {
		family = unix.AF_INET6
	}
	flows, err := nl.ConntrackTableList(netlink.ConntrackTable, family)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range flows {
		out = append(out, describe(f))
	}
	slices.Sort(out)
	return out
}

func describe(f *netlink.ConntrackFlow) string {
	proto := "udp"
	if f.Forward.Protocol == unix.IPPROTO_TCP {
		proto = "tcp"
	}
	return proto + " " + addrPort(f.Forward.SrcIP, f.Forward.SrcPort).String() + "->" + addrPort(f.Forward.DstIP, f.Forward.DstPort).String() +
		" replied by " + addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort).String()
}

// TestCleanerDeletesInItsNamespace: the Cleaner deletes, in the table of
// its own namespace and family only, the entries a sync made stale, and
// counts them.
func TestCleanerDeletesInItsNamespace(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		ipv6                        bool
		client, vip, dead, live, np string
	}{
		{"IPv4", false, "10.244.1.100", "10.96.0.10", "10.244.1.10", "10.244.2.10", "192.168.77.11"},
		{"IPv6", true, "fd00:10:244:1::100", "fd00:10:96::a", "fd00:10:244:1::10", "fd00:10:244:2::10", "fd00:192:168:77::11"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := sandbox.TestNetns(t, "ct-clean")
			other := sandbox.TestNetns(t, "ct-other")
			j := func(a string, port uint16) string { return netip.AddrPortFrom(netip.MustParseAddr(a), port).String() }
			mk := func(proto uint8, src, dst, reply string) *netlink.ConntrackFlow { return flow(proto, src, dst, reply) }
			flows := func() []*netlink.ConntrackFlow {
				return []*netlink.ConntrackFlow{
					mk(unix.IPPROTO_UDP, j(tc.client, 40000), j(tc.vip, 53), j(tc.dead, 5353)),
					mk(unix.IPPROTO_UDP, j(tc.client, 40001), j(tc.vip, 53), j(tc.live, 5353)),
					mk(unix.IPPROTO_TCP, j(tc.client, 40002), j(tc.vip, 53), j(tc.dead, 5353)),
					mk(unix.IPPROTO_UDP, j(tc.client, 40003), j(tc.np, 30053), j(tc.dead, 5353)),
				}
			}
			createEntries(t, ns.Netlink(), flows()...)
			createEntries(t, other.Netlink(), flows()...)

			prev := state(svc("dns", model.UDP, tc.vip, 53, 30053, nil, j(tc.dead, 5353), j(tc.live, 5353)))
			next := state(svc("dns", model.UDP, tc.vip, 53, 30053, nil, j(tc.live, 5353)))
			m := metrics.New(metrics.IPv4)
			fam := m.Family(metrics.IPv4)
			if tc.ipv6 {
				fam = m.Family(metrics.IPv6)
			}
			c := NewCleaner(CleanerConfig{Netns: ns.Path(), IPv6: tc.ipv6, Metrics: fam})
			// The first sync checks every UDP frontend: nothing is stale
			// while both endpoints serve.
			if n := c.Synced(model.Update{State: &model.State{Services: prev}, Full: true}); n != 0 {
				t.Errorf("first sync deleted %d entries, want 0", n)
			}
			var name model.ServicePortName
			for n := range next {
				name = n
			}
			if n := c.Synced(model.Update{State: &model.State{Services: next}, Changed: model.ChangeSet{name: {}}}); n != 2 {
				t.Errorf("deleted %d entries, want 2", n)
			}
			want := []string{
				describe(flows()[1]),
				describe(flows()[2]),
			}
			slices.Sort(want)
			if got := entries(t, ns.Netlink(), tc.ipv6); !slices.Equal(got, want) {
				t.Errorf("entries left:\n got %q\nwant %q", got, want)
			}
			if got := entries(t, other.Netlink(), tc.ipv6); len(got) != 4 {
				t.Errorf("another namespace's entries changed: %q", got)
			}
			if got := entries(t, ns.Netlink(), !tc.ipv6); len(got) != 0 {
				t.Errorf("the other family's table has entries: %q", got)
			}
			if got := testutil.ToFloat64(fam.ConntrackReconcilerDeletedEntriesTotal); got != 2 {
				t.Errorf("kubeproxy_conntrack_reconciler_deleted_entries_total = %v, want 2", got)
			}
		})
	}
}

// TestCleanerFailureIsAWarning: a namespace that cannot be entered makes
// the deletion fail, which is logged as a warning naming the frontends.
func TestCleanerFailureIsAWarning(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	c := NewCleaner(CleanerConfig{Netns: "/nonexistent/netns", Logger: zap.New(core)})
	if n := c.Delete(Stale{{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53}: {Removed: aps("10.244.1.10:5353")}}); n != 0 {
		t.Errorf("deleted %d in a namespace that does not exist", n)
	}
	warned := logs.FilterLevelExact(zap.WarnLevel).All()
	if len(warned) != 1 || !strings.Contains(fmt.Sprint(warned[0].ContextMap()["frontends"]), "10.96.0.10:53") {
		t.Errorf("logged %v, want one warning naming 10.96.0.10:53", logs.All())
	}
}
