package bpf

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestNextHopsAreSharedOnlyWhereTheClientCannotChangeTheRoute: a node's
// default routing lets every client's new flows share a next hop; a
// multipath hash over ports, or a routing rule on source ports, of the
// family turns sharing off for that family alone, and what makes the
// route depend on the client's address (a rule on source addresses, a
// multipath route, one through a nexthop group, an IPv6 route by source)
// keeps it to a client's own flows.
func TestNextHopsAreSharedOnlyWhereTheClientCannotChangeTheRoute(t *testing.T) {
	const (
		off    = loader.NexthopShareOff
		client = loader.NexthopShareClient
		all    = loader.NexthopShareAll
	)
	nexthopGroup := [][]string{
		{"nexthop", "add", "id", "1", "via", "10.1.0.2", "dev", "va"},
		{"nexthop", "add", "id", "2", "via", "10.1.0.3", "dev", "va"},
		{"nexthop", "add", "id", "10", "group", "1/2"},
		{"route", "add", "10.9.0.0/24", "nhid", "10"},
	}
	for _, tc := range []struct {
		name    string
		sysctls map[string]int // by name under net/
		rule    int            // family of a rule on source ports, 0 none
		rt      string         // what /sys/kernel/realtime says, "" absent
		ip      [][]string     // ip commands in the namespace, after its link va (10.1.0.1/24, 2001:db8::1/64)
		want4   loader.NexthopShare
		want6   loader.NexthopShare
		why     string
	}{
		{name: "default routing: every client's", want4: all, want6: all},
		{name: "IPv4 multipath hashed over ports", sysctls: map[string]int{"ipv4/fib_multipath_hash_policy": 1}, want4: off, want6: all, why: "chosen by ports"},
		{name: "IPv6 multipath over custom fields", sysctls: map[string]int{"ipv6/fib_multipath_hash_policy": 3}, want4: all, want6: off, why: "chosen by ports"},
		{name: "multipath policies over addresses, no multipath route", sysctls: map[string]int{"ipv4/fib_multipath_hash_policy": 0, "ipv6/fib_multipath_hash_policy": 2}, want4: all, want6: all},
		{name: "an IPv6 rule on source ports", rule: netlink.FAMILY_V6, want4: all, want6: off, why: "matches source ports"},
		{name: "a PREEMPT_RT kernel: neither family", rt: "1\n", want4: off, want6: off, why: "PREEMPT_RT"},
		{name: "a kernel saying it is not PREEMPT_RT", rt: "0\n", want4: all, want6: all},
		{name: "an IPv4 rule on source addresses", ip: [][]string{{"rule", "add", "from", "10.2.0.0/16", "table", "100", "priority", "100"}},
			want4: client, want6: all, why: "matches source addresses"},
		{name: "an IPv6 multipath route", ip: [][]string{{"-6", "route", "add", "2001:db8:9::/64", "table", "100",
			"nexthop", "via", "2001:db8::2", "dev", "va", "nexthop", "via", "2001:db8::3", "dev", "va"}},
			want4: all, want6: client, why: "2001:db8:9::/64 (table 100) is multipath"},
		{name: "an IPv6 route by source", ip: [][]string{{"-6", "route", "add", "2001:db8:1::/64", "from", "2001:db8:2::/64", "via", "2001:db8::2", "dev", "va"}},
			want4: all, want6: client, why: "2001:db8:1::/64 (table 254) is by source"},
		{name: "an IPv4 route through a nexthop group", ip: nexthopGroup, want4: client, want6: all, why: "10.9.0.0/24 (table 254) is multipath"},
		{name: "an IPv4 route through a nexthop group, dumped without its nexthops", ip: nexthopGroup,
			sysctls: map[string]int{"ipv4/nexthop_compat_mode": 0}, want4: client, want6: all, why: "10.9.0.0/24 (table 254) is through nexthop group 10"},
		{name: "an IPv4 route through a single nexthop object", ip: [][]string{
			{"nexthop", "add", "id", "1", "via", "10.1.0.2", "dev", "va"},
			{"route", "add", "10.9.0.0/24", "nhid", "1"},
		}, want4: all, want6: all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := sandbox.TestNetns(t, "nh")
			realtimeFile = filepath.Join(t.TempDir(), "realtime")
			t.Cleanup(func() { realtimeFile = "/sys/kernel/realtime" })
			if tc.rt != "" {
				if err := os.WriteFile(realtimeFile, []byte(tc.rt), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for name, v := range tc.sysctls {
				if err := ns.Do(func() error {
					_, err := sysctl.Default.SetInt("net/"+name, v)
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.rule != 0 {
				r := netlink.NewRule()
				r.Family, r.Priority, r.Table = tc.rule, 100, 200
				r.Sport = netlink.NewRulePortRange(40000, 41000)
				if err := ns.Netlink().RuleAdd(r); err != nil {
					t.Fatal(err)
				}
			}
			if len(tc.ip) > 0 {
				ipIn(t, ns, []string{"link", "add", "name", "va", "type", "veth", "peer", "name", "vb"},
					[]string{"link", "set", "dev", "va", "up"}, []string{"link", "set", "dev", "vb", "up"},
					[]string{"addr", "add", "10.1.0.1/24", "dev", "va"},
					[]string{"-6", "addr", "add", "2001:db8::1/64", "dev", "va", "nodad"})
				ipIn(t, ns, tc.ip...)
			}
			for _, v6 := range []bool{false, true} {
				want := tc.want4
				if v6 {
					want = tc.want6
				}
				var (
					share loader.NexthopShare
					why   string
				)
				if err := ns.Do(func() error {
					var err error
					share, why, err = nexthopSharing(ns.Netlink(), sysctl.Default, v6)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if share != want || (share != all && !strings.Contains(why, tc.why)) || (share == all && why != "") {
					t.Errorf("IPv6 %v: sharing %s (%q), want %s (%q)", v6, share, why, want, tc.why)
				}
			}
		})
	}
}

// ipIn runs ip commands in ns.
func ipIn(t *testing.T, ns *sandbox.Netns, cmds ...[]string) {
	t.Helper()
	for _, c := range cmds {
		if out, err := exec.Command("ip", append([]string{"-n", ns.Name()}, c...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
}
