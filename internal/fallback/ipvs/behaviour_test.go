package ipvs

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// factory programs each sandbox node with the IPVS dataplane of
// cfg.IPv6's family, everything inside the node's namespace.
func factory(cfg Config) behaviour.Factory {
	return func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
		c := cfg
		c.Netns = node.NS.Path()
		family, cidr := metrics.IPv4, example.ClusterCIDR
		if c.IPv6 {
			family, cidr = metrics.IPv6, example.ClusterCIDR6
		}
		c.ClusterCIDR = cidr
		m := metrics.New(family)
		c.Metrics = &m.FamilyMetrics
		d, err := New(behaviour.Context(t), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		return d
	}
}

// testFamily is an IP family the IPVS tests run over: the IPv6 one builds
// its Env over the IPv6 twins of the addresses and configures the IPv6
// dataplane.
type testFamily struct {
	name   string
	ipv6   bool
	newEnv func(*testing.T, behaviour.Factory) *behaviour.Env
}

var testFamilies = []testFamily{
	{"IPv4", false, behaviour.NewEnv},
	{"IPv6", true, behaviour.NewEnv6},
}

// addr returns the family's twin of a (an IPv4 address of the example
// cluster).
func (f testFamily) addr(t *testing.T, a netip.Addr) netip.Addr {
	t.Helper()
	if !f.ipv6 {
		return a
	}
	twin := sandbox.IPv6Of(a)
	if !twin.IsValid() {
		t.Fatalf("%s has no IPv6 twin", a)
	}
	return twin
}

// hostIP is the family's address of a sandbox host.
func (f testFamily) hostIP(h *sandbox.Host) netip.Addr {
	if f.ipv6 {
		return h.IP6
	}
	return h.IP
}

// config is c for the family's dataplane in the namespace at ns.
func (f testFamily) config(ns string, c Config) Config {
	c.Netns, c.IPv6, c.ClusterCIDR = ns, f.ipv6, example.ClusterCIDR
	if f.ipv6 {
		c.ClusterCIDR = example.ClusterCIDR6
	}
	return c
}

// source is a Source of node-a's proxy of the family, holding pairs.
func (f testFamily) source(t *testing.T, pairs ...example.Pair) *example.Source {
	if f.ipv6 {
		return example.NewSource6(t, example.Node6(example.NodeA)).Add(pairs...)
	}
	return example.NewSource(t, example.Node(example.NodeA)).Add(pairs...)
}

// example is the example cluster of the family.
func (f testFamily) example() []example.Pair {
	if f.ipv6 {
		return example.Example6()
	}
	return example.Example()
}

// forFamilies runs test once per family, as a subtest.
func forFamilies(t *testing.T, test func(t *testing.T, fam testFamily)) {
	for _, fam := range testFamilies {
		t.Run(fam.name, func(t *testing.T) { test(t, fam) })
	}
}

// TestTrafficFollowsTheModelVerdicts runs the behaviour table against the
// IPv4 dataplane and, over the example cluster's IPv6 twin, against the
// IPv6 one.
func TestTrafficFollowsTheModelVerdicts(t *testing.T) {
	for _, fam := range testFamilies {
		t.Run(fam.name, func(t *testing.T) {
			requireIPVS(t)
			e := fam.newEnv(t, factory(Config{Netfilter: xtables.Netfilter{IPv6: fam.ipv6}}))
			behaviour.Run(t, e, behaviour.Cases())
		})
	}
}

// handle opens an IPVS handle in node's namespace for the test to look.
func handle(t *testing.T, node *sandbox.Node) *libipvs.Handle {
	t.Helper()
	h, err := libipvs.New(node.NS.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// reals returns the real servers of a virtual server and their weights.
func reals(t *testing.T, h *libipvs.Handle, key vsKey) map[netip.AddrPort]int {
	t.Helper()
	dests, err := h.GetDestinations(ipvsService(key, "", 0))
	if err != nil {
		t.Fatalf("list real servers of %s: %v", key, err)
	}
	out := map[netip.AddrPort]int{}
	for _, d := range dests {
		out[destKey(d)] = d.Weight
	}
	return out
}

// eventually polls cond every 50ms for at most bound: the reaper runs on
// its own clock.
func eventually(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, bound)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRemovedEndpointsDrainBeforeTheyAreDeleted(t *testing.T) {
	forFamilies(t, testRemovedEndpointsDrainBeforeTheyAreDeleted)
}

func testRemovedEndpointsDrainBeforeTheyAreDeleted(t *testing.T, fam testFamily) {
	requireIPVS(t)
	const grace = 3 * time.Second
	e := fam.newEnv(t, factory(Config{GracePeriod: grace, ReapInterval: 100 * time.Millisecond, Netfilter: xtables.Netfilter{IPv6: fam.ipv6}}))
	h := handle(t, e.Nodes[example.NodeA])
	web := e.Example[0] // ClusterIP 10.96.0.10:80 on a1, a2, b1
	key := vsKey{Addr: fam.addr(t, netip.MustParseAddr("10.96.0.10")), Proto: model.TCP, Port: 80}
	a1 := netip.AddrPortFrom(fam.addr(t, example.PodA1), example.TCPTarget)
	a2 := netip.AddrPortFrom(fam.addr(t, example.PodA2), example.TCPTarget)
	b1 := netip.AddrPortFrom(fam.addr(t, example.PodB1), example.TCPTarget)

	// A connection held open from pod-a, to whichever endpoint IPVS picks.
	ctx := behaviour.Context(t)
	held, err := e.Clients[behaviour.ClientPodA].Hold(ctx, netip.AddrPortFrom(key.Addr, key.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	var busy netip.AddrPort
	dests, err := h.GetDestinations(ipvsService(key, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dests {
		if d.ActiveConnections > 0 {
			busy = destKey(d)
		}
	}
	if !busy.IsValid() {
		t.Fatalf("IPVS shows no active connection for the held one: %v", reals(t, h, key))
	}
	idle := a1
	if busy == a1 {
		idle = a2
	}
	// Both the busy endpoint and an idle one leave.
	var keep []netip.Addr
	for _, rs := range []netip.AddrPort{a1, a2, b1} {
		if rs != busy && rs != idle {
			keep = append(keep, rs.Addr())
		}
	}
	e.Each(func(s *example.Source) {
		s.SetSlice(example.SliceFor(web.Service, example.EndpointsOn(keep...)...))
	})
	e.Sync(false)

	got := reals(t, h, key)
	if w, ok := got[busy]; !ok || w != 0 {
		t.Errorf("right after the sync the busy endpoint %s has weight %d (present %t), want 0 while it drains", busy, w, ok)
	}
	// The idle one has no connection: the next reap deletes it.
	eventually(t, 5*time.Second, "idle endpoint deleted", func() bool {
		_, ok := reals(t, h, key)[idle]
		return !ok
	})
	// The held connection still carries data, new ones go elsewhere.
	if err := held.Ping(); err != nil {
		t.Errorf("held connection to the draining endpoint broke: %v", err)
	}
	rep, err := e.Clients[behaviour.ClientPodA].TCP(ctx, netip.AddrPortFrom(key.Addr, key.Port), 6)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		switch pod := e.Pods[r.Server]; {
		case r.Err != "":
			t.Errorf("new connection while %s drains failed: %s", busy, r.Err)
		case pod == nil:
			t.Errorf("new connection answered by unknown server %q", r.Server)
		case fam.hostIP(pod.Host) == busy.Addr() || fam.hostIP(pod.Host) == idle.Addr():
			t.Errorf("a new connection reached %s, which left the Service", r.Server)
		}
	}
	if _, ok := reals(t, h, key)[busy]; !ok {
		t.Fatalf("the busy endpoint was deleted while its connection is open")
	}
	// Closed, the connection lingers in TIME_WAIT for IPVS (2 minutes);
	// the grace period bounds the wait.
	held.Close()
	eventually(t, grace+5*time.Second, "draining endpoint deleted after the grace period", func() bool {
		_, ok := reals(t, h, key)[busy]
		return !ok
	})
}

func TestReturningEndpointServesAgainAndRestartKeepsDraining(t *testing.T) {
	forFamilies(t, testReturningEndpointServesAgainAndRestartKeepsDraining)
}

func testReturningEndpointServesAgainAndRestartKeepsDraining(t *testing.T, fam testFamily) {
	requireIPVS(t)
	e := fam.newEnv(t, factory(Config{GracePeriod: time.Hour, ReapInterval: time.Hour, Netfilter: xtables.Netfilter{IPv6: fam.ipv6}}))
	node := e.Nodes[example.NodeA]
	h := handle(t, node)
	web := e.Example[0]
	key := vsKey{Addr: fam.addr(t, netip.MustParseAddr("10.96.0.10")), Proto: model.TCP, Port: 80}
	podA1, podA2, podB1 := fam.addr(t, example.PodA1), fam.addr(t, example.PodA2), fam.addr(t, example.PodB1)
	a1 := netip.AddrPortFrom(podA1, example.TCPTarget)
	// Keep a connection to every endpoint so that none can be reaped.
	setEPs := func(pods ...netip.Addr) {
		e.Each(func(s *example.Source) {
			s.SetSlice(example.SliceFor(web.Service, example.EndpointsOn(pods...)...))
		})
		e.Sync(false)
	}
	setEPs(podA2, podB1)
	if w := reals(t, h, key)[a1]; w != 0 {
		t.Fatalf("removed endpoint has weight %d, want 0", w)
	}
	setEPs(podA1, podA2, podB1)
	if w := reals(t, h, key)[a1]; w != 1 {
		t.Fatalf("returning endpoint has weight %d, want 1", w)
	}

	// a1 drains again, then the agent restarts: the new one must neither
	// revive a1 nor forget to delete it.
	setEPs(podA2, podB1)
	e.Dataplanes[example.NodeA].(*Dataplane).Close()
	restarted, err := New(behaviour.Context(t), fam.config(node.NS.Path(), Config{GracePeriod: time.Hour, ReapInterval: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Close)
	up := fam.source(t, e.Example...)
	up.SetSlice(example.SliceFor(web.Service, example.EndpointsOn(podA2, podB1)...))
	if err := restarted.Sync(up.Update()); err != nil {
		t.Fatal(err)
	}
	// No connection is open to a1, so the new agent's reaper deletes it.
	eventually(t, 5*time.Second, "drained endpoint deleted by the restarted agent", func() bool {
		_, ok := reals(t, h, key)[a1]
		return !ok
	})
	for rs, w := range reals(t, h, key) {
		if w != 1 {
			t.Errorf("after the restart %s has weight %d, want 1", rs, w)
		}
	}
}

func TestSchedulerComesFromConfig(t *testing.T) {
	forFamilies(t, testSchedulerComesFromConfig)
}

func testSchedulerComesFromConfig(t *testing.T, fam testFamily) {
	requireIPVS(t)
	tests := []struct {
		scheduler string
		// check judges the answers of 8 connections from one client to
		// a Service with endpoints a1, a2, b1.
		check func(t *testing.T, perServer map[string]int)
	}{
		{"rr", func(t *testing.T, per map[string]int) {
			// Round robin over 3 endpoints: 8 connections are 3, 3, 2.
			for _, s := range []string{"a1", "a2", "b1"} {
				if per[s] < 2 || per[s] > 3 {
					t.Errorf("round robin gave %s %d of 8 connections: %v", s, per[s], per)
				}
			}
		}},
		{"sh", func(t *testing.T, per map[string]int) {
			if len(per) != 1 {
				t.Errorf("source hashing spread one client over %v", per)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.scheduler, func(t *testing.T) {
			e := fam.newEnv(t, factory(Config{Scheduler: tt.scheduler, Netfilter: xtables.Netfilter{IPv6: fam.ipv6}}))
			h := handle(t, e.Nodes[example.NodeA])
			key := vsKey{Addr: fam.addr(t, netip.MustParseAddr("10.96.0.10")), Proto: model.TCP, Port: 80}
			svc, err := h.GetService(ipvsService(key, "", 0))
			if err != nil {
				t.Fatal(err)
			}
			if svc.SchedName != tt.scheduler {
				t.Errorf("virtual server uses scheduler %q, want %q", svc.SchedName, tt.scheduler)
			}
			rep, err := e.Clients[behaviour.ClientPodA].TCP(behaviour.Context(t), netip.AddrPortFrom(key.Addr, key.Port), 8)
			if err != nil {
				t.Fatal(err)
			}
			per := map[string]int{}
			for _, r := range rep.Results {
				if r.Err != "" {
					t.Fatalf("connection failed: %s", r.Err)
				}
				per[r.Server]++
			}
			tt.check(t, per)
		})
	}
}

func TestCleanupRemovesOnlyOurs(t *testing.T) {
	forFamilies(t, testCleanupRemovesOnlyOurs)
}

func testCleanupRemovesOnlyOurs(t *testing.T, fam testFamily) {
	requireIPVS(t)
	node := nodeA(t)
	h := handle(t, node)
	// Someone else's virtual server on the node's own address.
	foreign := ipvsService(vsKey{Addr: fam.hostIP(node.Host), Proto: model.TCP, Port: 8443}, "rr", 0)
	if err := h.NewService(foreign); err != nil {
		t.Fatal(err)
	}
	d, err := New(behaviour.Context(t), fam.config(node.NS.Path(), Config{}))
	if err != nil {
		t.Fatal(err)
	}
	src := fam.source(t, fam.example()...)
	if err := d.Sync(src.Update()); err != nil {
		t.Fatal(err)
	}
	d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Cleanup(ctx, node.NS.Path()); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	services, err := h.GetServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(services) != 1 || !h.IsServicePresent(foreign) {
		var left []string
		for _, s := range services {
			k, _ := keyOf(s)
			left = append(left, k.String())
		}
		t.Errorf("after cleanup the virtual servers are %v, want only the foreign %s:8443", left, fam.hostIP(node.Host))
	}
	if l, _ := node.NS.Netlink().LinkByName(DummyName); l != nil {
		t.Errorf("%s left after cleanup", DummyName)
	}
	sets, err := node.NS.Netlink().IpsetListAll()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		if strings.HasPrefix(s.SetName, xtables.Prefix) {
			t.Errorf("ipset %s left after cleanup", s.SetName)
		}
	}
	for _, b := range xtables.Usable(ctx, node.NS.Path()) {
		for _, table := range xtables.Tables {
			own, err := xtables.ReadOwned(ctx, &xtables.Runner{Backend: b, Netns: node.NS.Path()}, table, iptables.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			if len(own.Chains) > 0 || len(own.Jumps) > 0 {
				t.Errorf("%s %s: left after cleanup: %v %v", b, table, own.Chains, own.Jumps)
			}
		}
	}
	if err := Cleanup(ctx, node.NS.Path()); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

// A virtual server on one of our Service addresses that is not ours (an
// operator's, on the ClusterIP's dummy address) is removed by the next
// full sync, unless its address is in --ipvs-exclude-cidrs, of either
// family.
func TestExcludedVirtualServersAreKept(t *testing.T) {
	forFamilies(t, testExcludedVirtualServersAreKept)
}

func testExcludedVirtualServersAreKept(t *testing.T, fam testFamily) {
	requireIPVS(t)
	serviceCIDR := netip.MustParsePrefix("10.96.0.0/24")
	if fam.ipv6 {
		serviceCIDR = netip.MustParsePrefix("fd00:10:96::/120")
	}
	for _, tc := range []struct {
		name    string
		exclude []netip.Prefix
		kept    bool
	}{
		{"not excluded: removed", nil, false},
		{"excluded: kept", []netip.Prefix{serviceCIDR}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := nodeA(t)
			h := handle(t, node)
			src := fam.source(t, fam.example()...)
			first, err := New(behaviour.Context(t), fam.config(node.NS.Path(), Config{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Sync(src.Update()); err != nil {
				t.Fatal(err)
			}
			first.Close()
			webIP := fam.addr(t, netip.MustParseAddr("10.96.0.10"))
			operators := ipvsService(vsKey{Addr: webIP, Proto: model.TCP, Port: 9999}, "rr", 0)
			if err := h.NewService(operators); err != nil {
				t.Fatal(err)
			}
			second, err := New(behaviour.Context(t), fam.config(node.NS.Path(), Config{ExcludeCIDRs: tc.exclude}))
			if err != nil {
				t.Fatal(err)
			}
			defer second.Close()
			if err := second.Sync(src.Update()); err != nil {
				t.Fatal(err)
			}
			if got := h.IsServicePresent(operators); got != tc.kept {
				t.Errorf("%s present after a full sync: %v, want %v", netip.AddrPortFrom(webIP, 9999), got, tc.kept)
			}
			ours := ipvsService(vsKey{Addr: webIP, Proto: model.TCP, Port: 80}, "", 0)
			if !h.IsServicePresent(ours) {
				t.Errorf("the Service's own virtual server %s is gone", netip.AddrPortFrom(webIP, 80))
			}
		})
	}
}
