package bpf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// TestNextHopsAreSharedOnlyWhereTheClientsPortCannotChangeTheRoute: a
// node's default routing lets a client's new flows share a next hop; a
// multipath hash over ports, or a routing rule on source ports, of the
// family turns it off for that family alone.
func TestNextHopsAreSharedOnlyWhereTheClientsPortCannotChangeTheRoute(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy map[string]int // fib_multipath_hash_policy by family
		rule   int            // family of a rule on source ports, 0 none
		rt     string         // what /sys/kernel/realtime says, "" absent
		want4  bool
		want6  bool
		why    string
	}{
		{name: "default routing: shared", want4: true, want6: true},
		{name: "IPv4 multipath hashed over ports", policy: map[string]int{"ipv4": 1}, want6: true, why: "chosen by ports"},
		{name: "IPv6 multipath over custom fields", policy: map[string]int{"ipv6": 3}, want4: true, why: "chosen by ports"},
		{name: "IPv4 multipath over addresses: shared", policy: map[string]int{"ipv4": 0, "ipv6": 2}, want4: true, want6: true},
		{name: "an IPv6 rule on source ports", rule: netlink.FAMILY_V6, want4: true, why: "matches source ports"},
		{name: "a PREEMPT_RT kernel: neither family", rt: "1\n", why: "PREEMPT_RT"},
		{name: "a kernel saying it is not PREEMPT_RT: shared", rt: "0\n", want4: true, want6: true},
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
			for fam, v := range tc.policy {
				if err := ns.Do(func() error {
					_, err := sysctl.Default.SetInt("net/"+fam+"/fib_multipath_hash_policy", v)
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
			for _, v6 := range []bool{false, true} {
				want := tc.want4
				if v6 {
					want = tc.want6
				}
				var (
					on  bool
					why string
				)
				if err := ns.Do(func() error {
					var err error
					on, why, err = nexthopSharing(ns.Netlink(), sysctl.Default, v6)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if on != want || (!on && !strings.Contains(why, tc.why)) {
					t.Errorf("IPv6 %v: shared %v (%q), want %v (%q)", v6, on, why, want, tc.why)
				}
			}
		})
	}
}
