package ipvs

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
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

// sortedChains is chainsOf in order, for comparing.
func sortedChains(t *testing.T, ctx context.Context, netns string) []string {
	t.Helper()
	c := chainsOf(t, ctx, netns)
	slices.Sort(c)
	return c
}

// syncIPVS starts an IPVS dataplane in the namespace at ns and syncs state;
// the caller closes it.
func syncIPVS(t *testing.T, ctx context.Context, ns string, state model.Update) *Dataplane {
	t.Helper()
	v, err := New(ctx, Config{Netfilter: xtables.Netfilter{Netns: ns, ClusterCIDR: example.ClusterCIDR}})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Sync(state); err != nil {
		v.Close()
		t.Fatal(err)
	}
	return v
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
	syncIPVS(t, ctx, ns, state).Close()

	// Then iptables: its first sync replaces the chains, RemoveLeftovers
	// the rest.
	ipt, err := iptables.New(ctx, iptables.Config{Netfilter: xtables.Netfilter{Netns: ns, ClusterCIDR: example.ClusterCIDR}})
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
	defer syncIPVS(t, ctx, ns, state).Close()
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

// Cleanup's first step, which an agent switching to the BPF dataplane
// takes at once after its first sync, deletes the virtual servers and
// nothing else: the rules, ipsets and dummy interface go in the slower
// steps after. A second call, and a call on a node without our
// virtual servers, find nothing and succeed.
func TestCleanupDeletesVirtualServersFirstAndOnlyThem(t *testing.T) {
	requireIPVS(t)
	node := nodeA(t)
	ns := node.NS.Path()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := removeVirtualServers(ctx, ns); err != nil {
		t.Fatalf("on a node without IPVS objects: %v", err)
	}
	src := example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...)
	h := handle(t, node)
	defer syncIPVS(t, ctx, ns, src.Update()).Close()
	if svcs, err := h.GetServices(); err != nil || len(svcs) == 0 {
		t.Fatalf("IPVS mode programmed no virtual server (%v)", err)
	}
	chainsBefore := sortedChains(t, ctx, ns)
	setsBefore, err := node.NS.Netlink().IpsetListAll()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := removeVirtualServers(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	if svcs, err := h.GetServices(); err != nil || len(svcs) != 0 {
		t.Errorf("%d virtual servers left (%v)", len(svcs), err)
	}
	if l, _ := node.NS.Netlink().LinkByName(DummyName); l == nil {
		t.Errorf("%s was removed too", DummyName)
	}
	if got := sortedChains(t, ctx, ns); !slices.Equal(got, chainsBefore) {
		t.Errorf("chains changed:\nbefore %v\nafter  %v", chainsBefore, got)
	}
	setsAfter, err := node.NS.Netlink().IpsetListAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(setsAfter) != len(setsBefore) {
		t.Errorf("ipsets: %d before, %d after", len(setsBefore), len(setsAfter))
	}
}
