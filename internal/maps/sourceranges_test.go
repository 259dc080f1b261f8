package maps

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// TestSourceRangeCheckWanted follows the questions the agent asks around a
// sync: whether the egress check must be attached before it, and whether it
// may go after it.
func TestSourceRangeCheckWanted(t *testing.T) {
	st := buildState(web, dns)
	webSPN := spn("default", "web", model.TCP)
	dnsSPN := spn("kube-system", "dns", model.UDP)
	setRanges := func(lbIPs []string, ranges ...string) {
		sp := *st.Services[webSPN].Port
		sp.LoadBalancerIPs, sp.LoadBalancerSourceRanges = nil, nil
		for _, a := range lbIPs {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, netip.MustParseAddr(a))
		}
		for _, r := range ranges {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
		}
		svc := *st.Services[webSPN]
		svc.Port = &sp
		st.Services[webSPN] = &svc
	}
	f := newFakes(0, 0, 0)
	w := newWriter(t, f.m)
	lb := []string{"198.19.0.8"}
	for _, step := range []struct {
		name      string
		set       func()
		up        func() model.Update
		wantCheck bool // before the sync
		wantKeep  bool // after it
	}{
		{"no ranges anywhere", func() {}, func() model.Update { return full(st) }, false, false},
		{"ranges without a LoadBalancer IP", func() { setRanges(nil, "203.0.113.0/24") }, func() model.Update { return partial(st, webSPN) }, false, false},
		{"ranges on a LoadBalancer IP", func() { setRanges(lb, "203.0.113.0/24") }, func() model.Update { return partial(st, webSPN) }, true, true},
		{"another Service changes", func() {}, func() model.Update { return partial(st, dnsSPN) }, false, true},
		{"a full sync sees the ranges", func() {}, func() model.Update { return full(st) }, true, true},
		{"only IPv6 ranges", func() { setRanges(lb, "2001:db8::/32") }, func() model.Update { return partial(st, webSPN) }, false, false},
		{"ranges again", func() { setRanges(lb, "203.0.113.0/24") }, func() model.Update { return partial(st, webSPN) }, true, true},
		{"the Service deleted", func() { delete(st.Services, webSPN) }, func() model.Update { return partial(st, webSPN) }, false, false},
	} {
		step.set()
		up := step.up()
		if got := WantsSourceRangeCheck(up); got != step.wantCheck {
			t.Errorf("%s: WantsSourceRangeCheck = %v, want %v", step.name, got, step.wantCheck)
		}
		if err := w.Sync(up); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := w.HasSourceRanges(); got != step.wantKeep {
			t.Errorf("%s: HasSourceRanges = %v, want %v", step.name, got, step.wantKeep)
		}
	}
}
