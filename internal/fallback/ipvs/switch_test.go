package ipvs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
)

// chainsOf lists our chains and the jumps to them in every table, with
// every back end.
func chainsOf(t *testing.T, ctx context.Context, netns string) []string {
	t.Helper()
	var out []string
	for _, b := range xtables.Usable(ctx, netns) {
		for _, table := range xtables.Tables {
			own, err := xtables.ReadOwned(ctx, &xtables.Runner{Backend: b, Netns: netns}, table, xtables.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			for c := range own.Chains {
				out = append(out, b.String()+" "+table+" "+c)
			}
			for _, j := range own.Jumps {
				out = append(out, b.String()+" "+table+" "+j.Chain+" -> "+xtables.Target(j.Spec))
			}
		}
	}
	return out
}

// A restart in the other mode leaves nothing of the earlier mode: no chain,
// no jump, no virtual server, no ipset, no dummy interface. Into iptables
// mode the agent calls RemoveLeftovers after the first sync; into IPVS mode
// the first sync suffices.
func TestSwitchingModesLeavesNothingOfTheOther(t *testing.T) {
	requireIPVS(t)
	node := nodeA(t)
	ns := node.NS.Path()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src := example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...)
	state := src.Update()
	h := handle(t, node)

	// IPVS first.
	v, err := New(ctx, Config{Netns: ns, ClusterCIDR: example.ClusterCIDR})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Sync(state); err != nil {
		t.Fatal(err)
	}
	v.Close()

	// Then iptables: its first sync replaces the chains, RemoveLeftovers
	// the rest.
	ipt, err := iptables.New(ctx, iptables.Config{Netns: ns, ClusterCIDR: example.ClusterCIDR})
	if err != nil {
		t.Fatal(err)
	}
	if err := ipt.Sync(state); err != nil {
		t.Fatal(err)
	}
	if err := RemoveLeftovers(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if svcs, err := h.GetServices(); err != nil || len(svcs) != 0 {
		t.Errorf("after switching to iptables: %d virtual servers left (%v)", len(svcs), err)
	}
	if l, _ := node.NS.Netlink().LinkByName(DummyName); l != nil {
		t.Errorf("after switching to iptables: %s left", DummyName)
	}
	for _, c := range chainsOf(t, ctx, ns) {
		// The iptables mode uses no mangle chain; IPVS's only one.
		if strings.Contains(c, " mangle ") {
			t.Errorf("after switching to iptables: IPVS chain left: %s", c)
		}
	}
	sets, err := node.NS.Netlink().IpsetListAll()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		if strings.HasPrefix(s.SetName, xtables.Prefix) {
			t.Errorf("after switching to iptables: ipset %s left", s.SetName)
		}
	}

	// And back to IPVS: its first sync removes the iptables mode's
	// per-Service chains.
	v, err = New(ctx, Config{Netns: ns, ClusterCIDR: example.ClusterCIDR})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Sync(state); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for table, cs := range chains {
		for _, c := range cs {
			want[table+" "+c] = true
		}
	}
	for _, c := range chainsOf(t, ctx, ns) {
		_, rest, _ := strings.Cut(c, " ")
		if strings.Contains(rest, " -> ") {
			continue // a hook
		}
		if !want[rest] {
			t.Errorf("after switching back to IPVS: chain %s is not the IPVS mode's", c)
		}
	}
	if svcs, err := h.GetServices(); err != nil || len(svcs) == 0 {
		t.Errorf("IPVS mode programmed no virtual server (%v)", err)
	}
}
