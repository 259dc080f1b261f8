package maps

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// planLines renders a plan as one line per write, in the order apply
// writes them. Deletions of what lost its last user are planned in map
// order; they are sorted within their class.
func planLines(p *plan) []string {
	var out []string
	add := func(sorted bool, lines []string) {
		if sorted {
			slices.Sort(lines)
		}
		out = append(out, lines...)
	}
	var ls []string
	for _, k := range p.rangePuts {
		ls = append(ls, "put source-range "+describeRangeKey(k))
	}
	add(false, ls)
	ls = nil
	for i, id := range p.backendPuts.keys {
		v := p.backendPuts.values[i]
		ls = append(ls, fmt.Sprintf("put backend %d %s%s", id, v.b, backendFlagString(v.flags)))
	}
	add(false, ls)
	ls = nil
	for i, id := range p.revNatPuts.keys {
		v := p.revNatPuts.values[i]
		ls = append(ls, fmt.Sprintf("put revnat %d %s", id, v))
	}
	add(false, ls)
	ls = nil
	for _, k := range p.memberPuts.keys {
		ls = append(ls, fmt.Sprintf("put member svc=%d backend=%d", k.SvcId, k.BackendId))
	}
	add(false, ls)
	ls = nil
	for _, t := range p.maglevSets {
		ls = append(ls, fmt.Sprintf("set maglev svc=%d backends=%v", t.svcID, t.ids))
	}
	add(false, ls)
	ls = nil
	for i, k := range p.servicePuts.keys {
		ls = append(ls, "put "+describeServiceEntry(k, p.servicePuts.values[i]))
	}
	add(false, ls)
	ls = nil
	for _, k := range p.serviceDels {
		ls = append(ls, "delete "+describeServiceEntry(k, ServiceValue{}))
	}
	add(false, ls)
	ls = nil
	for _, id := range p.maglevDels {
		ls = append(ls, fmt.Sprintf("delete maglev svc=%d", id))
	}
	add(false, ls)
	ls = nil
	for _, k := range p.memberDels {
		ls = append(ls, fmt.Sprintf("delete member svc=%d backend=%d", k.SvcId, k.BackendId))
	}
	add(true, ls)
	ls = nil
	for i, id := range p.backendDels {
		ls = append(ls, fmt.Sprintf("delete backend %d %s", id, p.removed[i]))
	}
	add(true, ls)
	ls = nil
	for _, id := range p.revNatDels {
		ls = append(ls, fmt.Sprintf("delete revnat %d", id))
	}
	add(true, ls)
	ls = nil
	for _, k := range p.rangeDels {
		ls = append(ls, "delete source-range "+describeRangeKey(k))
	}
	add(false, ls)
	return out
}

// describeServiceEntry is a service entry as the dump shows it; a
// deletion has only its key.
func describeServiceEntry(k serviceKey, v ServiceValue) string {
	fe := k.fe
	switch {
	case k.slot != 0 && v == ServiceValue{}:
		return fmt.Sprintf("service %s slot=%d", fe, k.slot)
	case k.slot != 0:
		return fmt.Sprintf("service %s slot=%d backend=%d", fe, k.slot, v.BackendId)
	case v == ServiceValue{}:
		return fmt.Sprintf("service %s master", fe)
	}
	return fmt.Sprintf("service %s count=%d revnat=%d svc=%d flags=%s", fe, v.Count, v.RevNatId, v.SvcId, serviceFlagString(v.Flags))
}

// planStep is one sync of a sequence and the plan it must make.
type planStep struct {
	name string
	up   func() model.Update
	want []string
	// removed are the backends the plan takes out, as Writer.Removed
	// reports them (sorted).
	removed []string
}

// runPlanSteps plans each step against the state the steps before it left,
// as a Writer whose writes all succeed.
func runPlanSteps(t *testing.T, a *applied, steps []planStep) {
	t.Helper()
	for _, step := range steps {
		var p plan
		up := step.up()
		a.planSync(&p, up, up.Full)
		if len(p.errs) > 0 {
			t.Fatalf("%s: %v", step.name, p.errs)
		}
		if got := planLines(&p); !slices.Equal(got, step.want) {
			t.Errorf("%s: plan\n\t%s\nwant\n\t%s", step.name, strings.Join(got, "\n\t"), strings.Join(step.want, "\n\t"))
		}
		var removed []string
		for _, b := range p.removed {
			removed = append(removed, b.String())
		}
		slices.Sort(removed)
		if !slices.Equal(removed, step.removed) {
			t.Errorf("%s: removed %v, want %v", step.name, removed, step.removed)
		}
	}
}

func newTestApplied() *applied {
	a := newApplied(ipv4, Limits{Backends: 1000, RevNat: 1000}, true, FakeMaglevSize)
	return &a
}

func webWithEndpoints(ready []string, terminating ...string) svcSpec {
	s := web
	s.eps, s.terminate = ready, terminating
	return s
}

func TestPlanWritesMakeBeforeBreak(t *testing.T) {
	name := spn("default", "web", model.TCP)
	runPlanSteps(t, newTestApplied(), []planStep{{
		name: "first sync: backends, reverse NAT and memberships first, then the slots, the master entry last",
		up:   func() model.Update { return full(buildState(web)) },
		want: []string{
			"put backend 1 10.244.1.3:8080/TCP",
			"put backend 2 10.244.2.3:8080/TCP",
			"put backend 3 10.244.3.3:8080/TCP",
			"put revnat 1 10.96.0.20:80",
			"put member svc=1 backend=1",
			"put member svc=1 backend=2",
			"put member svc=1 backend=3",
			"put service 10.96.0.20:80/TCP slot=1 backend=1",
			"put service 10.96.0.20:80/TCP slot=2 backend=2",
			"put service 10.96.0.20:80/TCP slot=3 backend=3",
			"put service 10.96.0.20:80/TCP count=3 revnat=1 svc=1 flags=cluster-ip",
		},
	}, {
		name: "nothing changed: nothing to write",
		up:   func() model.Update { return full(buildState(web)) },
	}, {
		name: "endpoint removed: the last backend moves into its slot, the master entry shrinks, and only then its slot, membership and backend go",
		up: func() model.Update {
			return partial(buildState(webWithEndpoints([]string{"10.244.1.3:8080", "10.244.3.3:8080"})), name)
		},
		want: []string{
			"put service 10.96.0.20:80/TCP slot=2 backend=3",
			"put service 10.96.0.20:80/TCP count=2 revnat=1 svc=1 flags=cluster-ip",
			"delete service 10.96.0.20:80/TCP slot=3",
			"delete member svc=1 backend=2",
			"delete backend 2 10.244.2.3:8080/TCP",
		},
		removed: []string{"10.244.2.3:8080/TCP"},
	}, {
		name: "endpoint added: it gets the lowest free id, and no other backend is renumbered",
		up: func() model.Update {
			return partial(buildState(webWithEndpoints([]string{"10.244.1.3:8080", "10.244.3.3:8080", "10.244.4.3:8080"})), name)
		},
		want: []string{
			"put backend 2 10.244.4.3:8080/TCP",
			"put member svc=1 backend=2",
			"put service 10.96.0.20:80/TCP slot=3 backend=2",
			"put service 10.96.0.20:80/TCP count=3 revnat=1 svc=1 flags=cluster-ip",
		},
	}, {
		name: "endpoint terminating: it leaves its slot and membership but stays a backend, marked",
		up: func() model.Update {
			return partial(buildState(webWithEndpoints([]string{"10.244.3.3:8080", "10.244.4.3:8080"}, "10.244.1.3:8080")), name)
		},
		want: []string{
			"put backend 1 10.244.1.3:8080/TCP terminating",
			"put service 10.96.0.20:80/TCP slot=1 backend=2",
			"put service 10.96.0.20:80/TCP count=2 revnat=1 svc=1 flags=cluster-ip",
			"delete service 10.96.0.20:80/TCP slot=3",
			"delete member svc=1 backend=1",
		},
	}, {
		name: "Service deleted: its master entry goes before its slots, then what only it used",
		up:   func() model.Update { return partial(buildState(), name) },
		want: []string{
			"delete service 10.96.0.20:80/TCP master",
			"delete service 10.96.0.20:80/TCP slot=1",
			"delete service 10.96.0.20:80/TCP slot=2",
			"delete member svc=1 backend=2",
			"delete member svc=1 backend=3",
			"delete backend 1 10.244.1.3:8080/TCP",
			"delete backend 2 10.244.4.3:8080/TCP",
			"delete backend 3 10.244.3.3:8080/TCP",
			"delete revnat 1",
		},
		removed: []string{"10.244.1.3:8080/TCP", "10.244.3.3:8080/TCP", "10.244.4.3:8080/TCP"},
	}})
}

func TestPlanKeepsASharedBackendUntilNoServiceUsesIt(t *testing.T) {
	alias := dns
	alias.name, alias.clusterIP = "dns-alias", "10.96.0.11"
	one := []string{"10.244.1.2:5353"}
	dnsOne, aliasOne := dns, alias
	dnsOne.eps, aliasOne.eps = one, one
	runPlanSteps(t, newTestApplied(), []planStep{{
		name: "two Services, the same two endpoints: one backend each, two memberships each",
		up:   func() model.Update { return full(buildState(dns, alias)) },
		want: []string{
			"put backend 1 10.244.1.2:5353/UDP",
			"put backend 2 10.244.2.2:5353/UDP",
			"put revnat 1 10.96.0.10:53",
			"put revnat 2 10.96.0.11:53",
			"put member svc=1 backend=1",
			"put member svc=1 backend=2",
			"put member svc=2 backend=1",
			"put member svc=2 backend=2",
			"put service 10.96.0.10:53/UDP slot=1 backend=1",
			"put service 10.96.0.10:53/UDP slot=2 backend=2",
			"put service 10.96.0.10:53/UDP count=2 revnat=1 svc=1 flags=cluster-ip",
			"put service 10.96.0.11:53/UDP slot=1 backend=1",
			"put service 10.96.0.11:53/UDP slot=2 backend=2",
			"put service 10.96.0.11:53/UDP count=2 revnat=2 svc=2 flags=cluster-ip",
		},
	}, {
		name: "one Service drops an endpoint: the other still uses its backend, which stays",
		up:   func() model.Update { return partial(buildState(dnsOne, alias), spn("kube-system", "dns", model.UDP)) },
		want: []string{
			"put service 10.96.0.10:53/UDP count=1 revnat=1 svc=1 flags=cluster-ip",
			"delete service 10.96.0.10:53/UDP slot=2",
			"delete member svc=1 backend=2",
		},
	}, {
		name: "the other drops it too: now the backend goes",
		up: func() model.Update {
			return partial(buildState(dnsOne, aliasOne), spn("kube-system", "dns-alias", model.UDP))
		},
		want: []string{
			"put service 10.96.0.11:53/UDP count=1 revnat=2 svc=2 flags=cluster-ip",
			"delete service 10.96.0.11:53/UDP slot=2",
			"delete member svc=2 backend=2",
			"delete backend 2 10.244.2.2:5353/UDP",
		},
		removed: []string{"10.244.2.2:5353/UDP"},
	}})
}

func TestPlanOfExternalFrontends(t *testing.T) {
	name := spn("default", "web", model.TCP)
	// web with a NodePort on the node's address, policy external.
	withNodePort := func(policy model.TrafficPolicy, ranges ...string) model.Update {
		st := buildState(web)
		st.Node.Addrs = []netip.Addr{netip.MustParseAddr("192.168.77.11")}
		st.Node.NodePorts = model.NodePortAddresses{All: true, Addrs: st.Node.Addrs}
		svc := st.Services[name]
		sp := *svc.Port
		sp.NodePort = 30080
		sp.ExternalPolicy = policy
		if len(ranges) > 0 {
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.19.0.8")}
			for _, r := range ranges {
				sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
		}
		st.Services[name] = &model.Service{Port: &sp, Endpoints: svc.Endpoints, Selection: model.Categorize(&sp, svc.Endpoints, &st.Node, model.DefaultOptions)}
		return partial(st, name)
	}
	a := newTestApplied()
	var p plan
	a.planSync(&p, full(buildState(web)), true)
	runPlanSteps(t, a, []planStep{{
		name: "a NodePort: its own reverse NAT, the ServicePort's id and backends",
		up:   func() model.Update { return withNodePort(model.PolicyCluster) },
		want: []string{
			"put revnat 2 192.168.77.11:30080",
			"put service 192.168.77.11:30080/TCP slot=1 backend=1",
			"put service 192.168.77.11:30080/TCP slot=2 backend=2",
			"put service 192.168.77.11:30080/TCP slot=3 backend=3",
			"put service 192.168.77.11:30080/TCP count=3 revnat=2 svc=1 flags=node-port",
		},
	}, {
		name: "externalTrafficPolicy=Local: the internal entry is written before the master that announces it",
		up:   func() model.Update { return withNodePort(model.PolicyLocal) },
		want: []string{
			"put service 192.168.77.11:30080/TCP (internal) slot=1 backend=1",
			"put service 192.168.77.11:30080/TCP (internal) slot=2 backend=2",
			"put service 192.168.77.11:30080/TCP (internal) slot=3 backend=3",
			"put service 192.168.77.11:30080/TCP (internal) count=3 revnat=2 svc=1 flags=node-port",
			"put service 192.168.77.11:30080/TCP count=0 revnat=2 svc=1 flags=node-port,two-scopes,drop,external-local",
			"delete service 192.168.77.11:30080/TCP slot=1",
			"delete service 192.168.77.11:30080/TCP slot=2",
			"delete service 192.168.77.11:30080/TCP slot=3",
		},
	}, {
		name: "back to Cluster: the internal entry goes after the master stops announcing it",
		up:   func() model.Update { return withNodePort(model.PolicyCluster) },
		want: []string{
			"put service 192.168.77.11:30080/TCP slot=1 backend=1",
			"put service 192.168.77.11:30080/TCP slot=2 backend=2",
			"put service 192.168.77.11:30080/TCP slot=3 backend=3",
			"put service 192.168.77.11:30080/TCP count=3 revnat=2 svc=1 flags=node-port",
			"delete service 192.168.77.11:30080/TCP (internal) master",
			"delete service 192.168.77.11:30080/TCP (internal) slot=1",
			"delete service 192.168.77.11:30080/TCP (internal) slot=2",
			"delete service 192.168.77.11:30080/TCP (internal) slot=3",
		},
	}, {
		name: "source ranges holding the node: written before the LoadBalancer IP that uses them",
		up:   func() model.Update { return withNodePort(model.PolicyCluster, "192.168.77.0/24") },
		want: []string{
			"put source-range svc=1 192.168.77.0/24",
			"put source-range svc=1 198.19.0.8/32",
			"put source-range svc=1 node",
			"put revnat 3 198.19.0.8:80",
			"put service 198.19.0.8:80/TCP slot=1 backend=1",
			"put service 198.19.0.8:80/TCP slot=2 backend=2",
			"put service 198.19.0.8:80/TCP slot=3 backend=3",
			"put service 198.19.0.8:80/TCP count=3 revnat=3 svc=1 flags=load-balancer,source-ranges",
		},
	}, {
		name: "source ranges without the node: what admitted the node goes after the frontends",
		up:   func() model.Update { return withNodePort(model.PolicyCluster, "203.0.113.0/24") },
		want: []string{
			"put source-range svc=1 203.0.113.0/24",
			"delete source-range svc=1 192.168.77.0/24",
			"delete source-range svc=1 198.19.0.8/32",
			"delete source-range svc=1 node",
		},
	}})
}

func TestPlanMaglevTables(t *testing.T) {
	three := []string{"10.244.1.3:8080", "10.244.2.3:8080", "10.244.3.3:8080"}
	runPlanSteps(t, newTestApplied(), []planStep{{
		name: "a table is set after the backends it names and before the frontends",
		up:   func() model.Update { return full(maglevWeb(buildState(webWith(three...)))) },
		want: []string{
			"put backend 1 10.244.1.3:8080/TCP",
			"put backend 2 10.244.2.3:8080/TCP",
			"put backend 3 10.244.3.3:8080/TCP",
			"put revnat 1 10.96.0.20:80",
			"put revnat 2 192.168.77.10:30080",
			"put member svc=1 backend=1",
			"put member svc=1 backend=2",
			"put member svc=1 backend=3",
			"set maglev svc=1 backends=[1 2 3]",
			"put service 10.96.0.20:80/TCP slot=1 backend=1",
			"put service 10.96.0.20:80/TCP slot=2 backend=2",
			"put service 10.96.0.20:80/TCP slot=3 backend=3",
			"put service 10.96.0.20:80/TCP count=3 revnat=1 svc=1 flags=cluster-ip",
			"put service 192.168.77.10:30080/TCP slot=1 backend=1",
			"put service 192.168.77.10:30080/TCP slot=2 backend=2",
			"put service 192.168.77.10:30080/TCP slot=3 backend=3",
			"put service 192.168.77.10:30080/TCP count=3 revnat=2 svc=1 flags=node-port,maglev",
		},
	}, {
		name: "an endpoint removed: the new table is set before its backend goes",
		up:   func() model.Update { return partial(maglevWeb(buildState(webWith(three[1:]...))), webName) },
		want: []string{
			"set maglev svc=1 backends=[2 3]",
			"put service 10.96.0.20:80/TCP slot=1 backend=3",
			"put service 10.96.0.20:80/TCP count=2 revnat=1 svc=1 flags=cluster-ip",
			"put service 192.168.77.10:30080/TCP slot=1 backend=3",
			"put service 192.168.77.10:30080/TCP count=2 revnat=2 svc=1 flags=node-port,maglev",
			"delete service 10.96.0.20:80/TCP slot=3",
			"delete service 192.168.77.10:30080/TCP slot=3",
			"delete member svc=1 backend=1",
			"delete backend 1 10.244.1.3:8080/TCP",
		},
		removed: []string{"10.244.1.3:8080/TCP"},
	}, {
		name: "Maglev turned off: the frontend stops looking the table up before it goes",
		up:   func() model.Update { return partial(randomWeb(buildState(webWith(three[1:]...))), webName) },
		want: []string{
			"put service 192.168.77.10:30080/TCP count=2 revnat=2 svc=1 flags=node-port",
			"delete maglev svc=1",
		},
	}, {
		name: "Maglev again: the table is set before the frontend looks it up",
		up:   func() model.Update { return partial(maglevWeb(buildState(webWith(three[1:]...))), webName) },
		want: []string{
			"set maglev svc=1 backends=[2 3]",
			"put service 192.168.77.10:30080/TCP count=2 revnat=2 svc=1 flags=node-port,maglev",
		},
	}, {
		name: "the Service deleted: its table goes after its frontends",
		up:   func() model.Update { return partial(buildState(), webName) },
		want: []string{
			"delete service 10.96.0.20:80/TCP master",
			"delete service 10.96.0.20:80/TCP slot=1",
			"delete service 10.96.0.20:80/TCP slot=2",
			"delete service 192.168.77.10:30080/TCP master",
			"delete service 192.168.77.10:30080/TCP slot=1",
			"delete service 192.168.77.10:30080/TCP slot=2",
			"delete maglev svc=1",
			"delete member svc=1 backend=2",
			"delete member svc=1 backend=3",
			"delete backend 2 10.244.2.3:8080/TCP",
			"delete backend 3 10.244.3.3:8080/TCP",
			"delete revnat 1",
			"delete revnat 2",
		},
		removed: []string{"10.244.2.3:8080/TCP", "10.244.3.3:8080/TCP"},
	}})
}

// TestPlanAfterRestartKeepsIDs: a Writer restored from the maps plans
// nothing for the state they hold, and new entries take ids the restored
// ones leave free.
func TestPlanAfterRestartKeepsIDs(t *testing.T) {
	f := newFakes(0, 0, 0)
	if err := newWriter(t, f.m).Sync(full(buildState(web, dns))); err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, f.m)
	runPlanSteps(t, &w.applied, []planStep{{
		name: "the state the maps hold: nothing to write",
		up:   func() model.Update { return full(buildState(web, dns)) },
	}, {
		name: "an endpoint added: the next free id, the restored ServicePort id",
		up: func() model.Update {
			return partial(buildState(webWithEndpoints(append(slices.Clone(web.eps), "10.244.4.3:8080")), dns), spn("default", "web", model.TCP))
		},
		want: []string{
			"put backend 6 10.244.4.3:8080/TCP",
			"put member svc=1 backend=6",
			"put service 10.96.0.20:80/TCP slot=4 backend=6",
			"put service 10.96.0.20:80/TCP count=4 revnat=1 svc=1 flags=cluster-ip",
		},
	}})
}

// TestPlanLetsGoOfALargeSync: a plan keeps its memory for the next sync,
// unless it was large (a first sync of thousands of Services), whose memory
// would otherwise stay with the agent for good.
func TestPlanLetsGoOfALargeSync(t *testing.T) {
	var p plan
	fill := func(n int) {
		for i := range n {
			p.putBackend(uint32(i+1), Backend{Addr: netip.MustParseAddr("10.244.0.1"), Port: uint16(i)}, 0)
		}
	}
	fill(10)
	p.reset()
	if len(p.backendPuts.keys) != 0 || cap(p.backendPuts.keys) == 0 {
		t.Errorf("a small plan: %d entries and capacity %d after reset, want 0 and its memory kept", len(p.backendPuts.keys), cap(p.backendPuts.keys))
	}
	fill(planKeepEntries + 1)
	p.reset()
	if cap(p.backendPuts.keys) != 0 || cap(p.backendPuts.values) != 0 {
		t.Errorf("a plan of %d entries kept capacity %d after reset", planKeepEntries+1, cap(p.backendPuts.keys))
	}
}

// TestPlanOfAFailedFrontendLeavesNoBackends: a frontend that cannot be
// planned (no reverse-NAT id left) after its backends got ids hands them to
// the sync's garbage collection: nothing else holds them, and neither the
// maps nor the ids keep them.
func TestPlanOfAFailedFrontendLeavesNoBackends(t *testing.T) {
	a := newApplied(ipv4, Limits{Backends: 10, RevNat: 1}, false, 0)
	var p plan
	owner := spn("default", "web", model.TCP)
	fe := func(ip string) Frontend {
		return Frontend{Addr: netip.MustParseAddr(ip), Port: 80, Proto: model.TCP}
	}
	bs := []Backend{{Addr: netip.MustParseAddr("10.244.1.3"), Port: 8080, Proto: model.TCP},
		{Addr: netip.MustParseAddr("10.244.2.3"), Port: 8080, Proto: model.TCP}}
	if err := a.upsert(&p, desiredFrontend{fe: fe("10.96.0.20"), owner: owner, backends: bs[:1], bflags: []uint8{0}}); err != nil {
		t.Fatal(err)
	}
	err := a.upsert(&p, desiredFrontend{fe: fe("10.96.0.21"), owner: owner, backends: bs, bflags: []uint8{0, 0}})
	if err == nil || !strings.Contains(err.Error(), "reverse NAT") {
		t.Fatalf("upsert: %v, want a reverse-NAT error", err)
	}
	a.collectGarbage(&p)
	if _, ok := a.backends.byKey[keyOf(bs[1])]; ok || len(p.backendDels) != 1 || a.backends.ids.n != 1 {
		t.Errorf("after the failure: backend %s known %v, %d deletions planned, %d ids in use; want it gone, 1, 1",
			bs[1], ok, len(p.backendDels), a.backends.ids.n)
	}
	if ab := a.backends.byKey[keyOf(bs[0])]; ab == nil || ab.refs != 1 {
		t.Errorf("the first frontend's backend: %+v, want one reference", ab)
	}
}

// planSync adds to p the writes that bring the maps from the applied state
// to the desired state of up, and records them as applied. With full every
// ServicePort is planned and every entry no ServicePort wants is deleted;
// otherwise only the ServicePorts in up.Changed are: one plan for the whole
// sync, which the tests read, where Writer.Sync writes it in chunks.
func (a *applied) planSync(p *plan, up model.Update, full bool) {
	r := a.beginSync(p, up, full)
	for _, owner := range r.owners {
		a.planOwner(p, &r, owner)
	}
	a.finishSync(p, &r)
}
