package nftables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/golden"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func listTable(t *testing.T, ns, family string) string {
	t.Helper()
	out, err := runNFT(context.Background(), ns, "", "list", "table", family, TableName)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// kernelNames lists the per-Service chains and sets of the table.
func kernelNames(t *testing.T, d *Dataplane) (chains, sets []string) {
	t.Helper()
	if err := d.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	return sortedKeys(d.plan.kernelChains), sortedKeys(d.plan.kernelSets)
}

// The IPv4 and IPv6 dataplanes of a node share its namespace, each in its
// own table: syncs of one leave the other's table as it was. Partial syncs
// leave the kernel with the chains and sets a full sync writes; a new
// agent's first sync deletes what the old one left and nothing wants; and
// Cleanup removes both tables, and only reads where none is left.
func TestKernelTablesOfBothFamilies(t *testing.T) {
	ns := sandbox.TestNetns(t, "nft-kernel").Path()
	ctx := t.Context()
	if err := Available(ctx, ns); err != nil {
		t.Fatalf("nftables must work in a network namespace of this host: %v", err)
	}
	ex, ex6 := example.Example(), example.Example6()
	src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
	src6 := example.NewSource6(t, example.Node6(example.NodeA)).Add(ex6...)
	d4, err := New(ctx, Config{Netfilter: xtables.Netfilter{Netns: ns, ClusterCIDR: example.ClusterCIDR}})
	if err != nil {
		t.Fatal(err)
	}
	d6, err := New(ctx, Config{Netfilter: xtables.Netfilter{Netns: ns, IPv6: true, ClusterCIDR: example.ClusterCIDR6}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d6.Sync(src6.Update()); err != nil {
		t.Fatal(err)
	}
	ip6Before := listTable(t, ns, "ip6")
	if err := d4.Sync(src.Update()); err != nil {
		t.Fatal(err)
	}
	// A partial sync: web loses a2, empty gets an endpoint, hairpin and
	// sticky go away.
	src.SetSlice(builders.SliceFor(ex[0].Service, example.EndpointsOn(example.PodA1, example.PodB1)...))
	src.SetSlice(builders.SliceFor(ex[6].Service, example.EndpointsOn(example.PodB1)...))
	for _, gone := range []example.Pair{ex[4], ex[8]} {
		src.DeleteService(gone.Service)
		src.DeleteSlice(gone.Slice)
	}
	up := src.Update()
	if up.Full || len(up.Changed) == 0 {
		t.Fatalf("want a partial update, got full=%t with %d changes", up.Full, len(up.Changed))
	}
	if err := d4.Sync(up); err != nil {
		t.Fatal(err)
	}
	if got := listTable(t, ns, "ip6"); got != ip6Before {
		t.Errorf("syncs of the IPv4 dataplane changed the IPv6 table:\n%s", golden.LineDiff(ip6Before, got))
	}
	gotChains, gotSets := kernelNames(t, d4)
	want := newPlanner(&d4.cfg)
	want.r = d4.plan.r
	wantPlan := want.full(d4.nft.NewTransaction(), up.State)
	if !slices.Equal(gotChains, sortedKeys(wantPlan.chains)) || !slices.Equal(gotSets, sortedKeys(wantPlan.sets)) {
		t.Errorf("after the partial sync the kernel holds chains %v and sets %v,\nwant %v and %v", gotChains, gotSets,
			sortedKeys(wantPlan.chains), sortedKeys(wantPlan.sets))
	}
	if table := listTable(t, ns, "ip"); strings.Contains(table, "sticky") || strings.Contains(table, "hairpin") {
		t.Errorf("deleted Services left objects behind:\n%s", table)
	}

	// A new agent with fewer Services: its first sync deletes the rest.
	restarted, err := New(ctx, Config{Netfilter: xtables.Netfilter{Netns: ns, ClusterCIDR: example.ClusterCIDR}})
	if err != nil {
		t.Fatal(err)
	}
	fresh := example.NewSource(t, example.Node(example.NodeA)).Add(ex[0])
	up = fresh.Update()
	if err := restarted.Sync(up); err != nil {
		t.Fatal(err)
	}
	gotChains, gotSets = kernelNames(t, restarted)
	for _, c := range gotChains {
		if !strings.Contains(c, "default/web/") {
			t.Errorf("chain %s of a Service the new agent does not know survived its first sync", c)
		}
	}
	if len(gotChains) == 0 || len(gotSets) != 0 {
		t.Errorf("after the new agent's first sync: chains %v, sets %v; want web's chains and no set", gotChains, gotSets)
	}

	if err := Cleanup(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if left, err := Present(ctx, ns); err != nil || len(left) > 0 {
		t.Fatalf("after Cleanup: %v %v", left, err)
	}
	if err := Cleanup(ctx, ns); err != nil {
		t.Fatalf("a second Cleanup: %v", err)
	}
}

// Partial syncs change the traffic as they say: endpoints leave and
// arrive, a Service without endpoints gets one, and a sticky Service
// keeps its clients after a full sync (the affinity sets survive it).
func TestPartialSyncsChangeTheTraffic(t *testing.T) {
	e := behaviour.NewEnv(t, factory(false))
	web := behaviour.Case{Name: "web after a2 left", From: behaviour.ClientPodA, To: netipAP("10.96.0.10", 80)}
	empty := behaviour.Case{Name: "empty with b1", From: behaviour.ClientPodA, To: netipAP("10.96.0.16", 80)}
	sticky := behaviour.Case{Name: "sticky", From: behaviour.ClientPodA, To: netipAP("10.96.0.14", 80)}
	e.Check(t, sticky, behaviour.Want{Verdict: model.Forward, Servers: []string{"a1", "a2", "b1"}, Source: behaviour.Preserved, Sticky: true})
	first := stickyServer(t, e, sticky)

	e.Each(func(src *example.Source) {
		src.SetSlice(builders.SliceFor(e.Example[0].Service, example.EndpointsOn(example.PodA1, example.PodB1)...))
		src.SetSlice(builders.SliceFor(e.Example[6].Service, example.EndpointsOn(example.PodB1)...))
	})
	e.Sync(false)
	e.Check(t, web, behaviour.Want{Verdict: model.Forward, Servers: []string{"a1", "b1"}, Source: behaviour.Preserved})
	e.Check(t, empty, behaviour.Want{Verdict: model.Forward, Servers: []string{"b1"}, Source: behaviour.Preserved})

	e.Sync(true)
	if again := stickyServer(t, e, sticky); again != first {
		t.Errorf("ClientIP affinity: before the full sync %s, after it %s", first, again)
	}
}

func netipAP(ip string, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(ip), port)
}

// stickyServer returns the one server a client with affinity reaches.
func stickyServer(t *testing.T, e *behaviour.Env, tc behaviour.Case) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := e.Clients[tc.From].TCP(ctx, tc.To, 5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var last string
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Fatalf("%s -> %s: %s", tc.From, tc.To, r.Err)
		}
		seen[r.Server] = true
		last = r.Server
	}
	if len(seen) != 1 {
		t.Fatalf("%s -> %s: reached %v, want one server", tc.From, tc.To, seen)
	}
	return last
}

// When someone deletes our table, the next partial sync fails (counted in
// kubeproxy_sync_proxy_rules_nftables_sync_failures_total, the table
// untouched by half a transaction) and the one after it writes everything
// again.
func TestSyncAfterTheTableWasDeletedRewritesIt(t *testing.T) {
	ns := sandbox.TestNetns(t, "nft-recover").Path()
	ctx := t.Context()
	ex := example.Example()
	src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
	m := metrics.New(metrics.IPv4)
	d, err := New(ctx, Config{Netfilter: xtables.Netfilter{Netns: ns, ClusterCIDR: example.ClusterCIDR, Metrics: &m.FamilyMetrics}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(src.Update()); err != nil {
		t.Fatal(err)
	}
	want := listTable(t, ns, "ip")
	if _, err := runNFT(ctx, ns, "", "delete", "table", "ip", TableName); err != nil {
		t.Fatal(err)
	}
	// empty gets an endpoint.
	slice := builders.SliceFor(ex[6].Service, example.EndpointsOn(example.PodB1)...)
	src.SetSlice(slice)
	up := src.Update()
	if err := d.Sync(up); err == nil {
		t.Fatalf("a partial sync into a deleted table succeeded")
	}
	if got := testutil.ToFloat64(m.NFTablesSyncFailuresTotal); got != 1 {
		t.Errorf("nftables sync failures %v, want 1", got)
	}
	if present, _ := Present(ctx, ns); len(present) != 0 {
		t.Errorf("the failed transaction left tables %v", present)
	}
	// The retry of the same update.
	if err := d.Sync(up); err != nil {
		t.Fatal(err)
	}
	// and loses it again.
	src.DeleteSlice(slice)
	if err := d.Sync(src.Update()); err != nil {
		t.Fatal(err)
	}
	if got := listTable(t, ns, "ip"); got != want {
		t.Errorf("after the recovery the table differs from the first sync's:\n%s", golden.LineDiff(want, got))
	}
}

// --detect-local-mode=BridgeInterface and InterfaceNamePrefix: the kernel
// takes the rules that tell pod traffic by its input interface, in the two
// places the detector is used (the masquerade of ClusterIP traffic from
// outside the pods, the short-circuit of pod traffic to an
// externalTrafficPolicy=Local frontend), and no rule matches the cluster
// CIDR given too.
func TestLocalTrafficDetectorsByInterface(t *testing.T) {
	for _, tc := range []struct {
		name      string
		d         xtables.LocalDetector
		pod, rest string
	}{
		{"bridge", xtables.LocalDetector{Bridge: "cni0"}, `iifname "cni0" goto service-`, `iifname != "cni0" jump mark-for-masquerade`},
		{"interface prefix", xtables.LocalDetector{InterfacePrefix: "veth"}, `iifname "veth*" goto service-`, `iifname != "veth*" jump mark-for-masquerade`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := sandbox.TestNetns(t, "nft-local").Path()
			src := example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...)
			d, err := New(t.Context(), Config{Netfilter: xtables.Netfilter{Netns: ns, ClusterCIDR: example.ClusterCIDR, LocalDetector: tc.d}})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Sync(src.Update()); err != nil {
				t.Fatal(err)
			}
			table := listTable(t, ns, "ip")
			for _, want := range []string{tc.pod, tc.rest} {
				if !strings.Contains(table, want) {
					t.Errorf("no rule with %q in\n%s", want, table)
				}
			}
			if strings.Contains(table, example.ClusterCIDR.String()) {
				t.Errorf("a rule matches the cluster CIDR besides the interface:\n%s", table)
			}
		})
	}
}
