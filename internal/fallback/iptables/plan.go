package iptables

import (
	"hash/maphash"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// appliedService is what the kernel holds of one ServicePort: enough to
// remove it again (its chains, its rules in shared chains) and to count.
type appliedService struct {
	chains []string
	shared [numShared][]string
	rules  map[string]int // per table
	// fingerprint summarises every rule, so that a reconciling full sync
	// can tell which Services changed without keeping their rules.
	fingerprint uint64
}

// planner turns a model update into one iptables-restore transaction and
// remembers what was applied. It does no I/O, so tests can read the
// transactions it writes.
type planner struct {
	r renderer
	// dropInvalid adds the INVALID drop rule to EBPFPROXY-FORWARD; off
	// when nf_conntrack_tcp_be_liberal is set, as upstream.
	dropInvalid bool

	// kernel holds, per table, the chains with our prefix that the kernel
	// has, as far as we know.
	kernel map[string]map[string]bool
	// strayJumps are rules in other chains than the built-in ones that
	// jump to ours, found when the kernel was last read; a full sync
	// removes them.
	strayJumps []xtables.Hook
	services   map[model.ServicePortName]*appliedService
	// total is the number of rules we own per table.
	total map[string]int
}

func newPlanner(cfg *Config) *planner {
	return &planner{
		r:           renderer{cfg: cfg, comments: true},
		dropInvalid: true,
		kernel:      map[string]map[string]bool{"filter": {}, "nat": {}, "mangle": {}},
		services:    map[model.ServicePortName]*appliedService{},
		total:       map[string]int{},
	}
}

// plan is one transaction and the state it leads to.
type plan struct {
	tx   xtables.Transaction
	full bool
	// services replaces the applied services after a full sync, or
	// updates them after a partial one (nil deletes).
	services map[model.ServicePortName]*appliedService
	// kernel replaces the known chains after a full sync; after a partial
	// one addChains and delChains update them.
	kernel               map[string]map[string]bool
	addChains, delChains []string
	static               map[string]int
}

var fingerprintSeed = maphash.MakeSeed()

func applied(rs *serviceRules) *appliedService {
	a := &appliedService{shared: rs.shared, rules: map[string]int{}, fingerprint: fingerprint(rs)}
	for _, c := range rs.chains {
		a.chains = append(a.chains, c.name)
		a.rules["nat"] += len(c.rules)
	}
	for i := range numShared {
		a.rules[sharedChains[i].table] += len(rs.shared[i])
	}
	return a
}

func fingerprint(rs *serviceRules) uint64 {
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	for _, c := range rs.chains {
		h.WriteString(c.name)
		h.WriteByte(0)
		for _, r := range c.rules {
			h.WriteString(r)
			h.WriteByte(0)
		}
		h.WriteByte(1)
	}
	for i := range numShared {
		for _, r := range rs.shared[i] {
			h.WriteString(r)
			h.WriteByte(0)
		}
		h.WriteByte(2)
	}
	return h.Sum64()
}

// full rewrites everything: every shared and per-Service chain is declared
// (and so flushed) and filled, our chains that nothing wants any more are
// deleted, and hooks adds what keeps the built-in chains jumping to ours.
func (p *planner) full(state *model.State, hooks func(*xtables.Transaction) error) (*plan, error) {
	pl := &plan{
		full:     true,
		services: make(map[model.ServicePortName]*appliedService, len(state.Services)),
		kernel:   map[string]map[string]bool{"filter": {}, "nat": {}, "mangle": {}},
		static:   map[string]int{},
	}
	tx := &pl.tx
	for _, table := range xtables.Tables {
		for _, c := range sharedChainNames[table] {
			tx.Table(table).Chain(c)
			pl.kernel[table][c] = true
		}
	}
	if err := hooks(tx); err != nil {
		return nil, err
	}
	for _, j := range p.strayJumps {
		tx.Table(j.Table).Delete(j.Chain, j.Spec)
	}
	static := p.r.staticRules(p.dropInvalid)
	for _, s := range static {
		pl.static[s.table]++
		if s.table == "nat" && s.chain == chainServices {
			continue // after the Services, below
		}
		tx.Table(s.table).Append(s.chain, s.spec)
	}
	nat := tx.Table("nat")
	for _, name := range model.SortedNames(state.Services) {
		rs := p.r.service(state.Services[name])
		for i := range numShared {
			for _, spec := range rs.shared[i] {
				tx.Table(sharedChains[i].table).Append(sharedChains[i].chain, spec)
			}
		}
		for _, c := range rs.chains {
			nat.Chain(c.name)
			pl.kernel["nat"][c.name] = true
			for _, spec := range c.rules {
				nat.Append(c.name, spec)
			}
		}
		pl.services[name] = applied(&rs)
	}
	for _, s := range static {
		if s.table == "nat" && s.chain == chainServices {
			nat.Append(s.chain, s.spec)
		}
	}
	for _, table := range xtables.Tables {
		var stale []string
		for c := range p.kernel[table] {
			if !pl.kernel[table][c] {
				stale = append(stale, c)
			}
		}
		slices.Sort(stale)
		for _, c := range stale {
			tx.Table(table).Chain(c)
			tx.Table(table).DeleteChain(c)
		}
	}
	return pl, nil
}

// partial rewrites only the chains of the ServicePorts in up.Changed and
// edits their rules in the shared chains: -D for rules that went away, -I
// (top of nat EBPFPROXY-SERVICES, so that the NodePort jump stays last) or
// -A for new ones.
func (p *planner) partial(up model.Update) *plan {
	names := model.SortedNames(up.Changed)
	rendered := make([]*serviceRules, len(names))
	for i, name := range names {
		if svc := up.State.Services[name]; svc != nil {
			rs := p.r.service(svc)
			rendered[i] = &rs
		}
	}
	return p.rewrite(names, rendered)
}

// reconcile renders every ServicePort and rewrites, as partial does, only
// those whose rules differ from what was applied, and removes those that
// are gone: a full sync that writes only the difference. It trusts that
// the kernel still holds what was applied; Sync checks that first.
func (p *planner) reconcile(state *model.State) *plan {
	var names []model.ServicePortName
	var rendered []*serviceRules
	for _, name := range model.SortedNames(state.Services) {
		rs := p.r.service(state.Services[name])
		if old := p.services[name]; old != nil && old.fingerprint == fingerprint(&rs) {
			continue
		}
		names = append(names, name)
		rendered = append(rendered, &rs)
	}
	for _, name := range model.SortedNames(p.services) {
		if state.Services[name] == nil {
			names = append(names, name)
			rendered = append(rendered, nil)
		}
	}
	return p.rewrite(names, rendered)
}

// rewrite replaces what names[i] has in the kernel by rendered[i] (nil
// removes it).
func (p *planner) rewrite(names []model.ServicePortName, rendered []*serviceRules) *plan {
	pl := &plan{services: map[model.ServicePortName]*appliedService{}}
	tx := &pl.tx
	nat := tx.Table("nat")
	for i, name := range names {
		old := p.services[name]
		if old == nil {
			old = &appliedService{}
		}
		rs := rendered[i]
		if rs == nil {
			rs = &serviceRules{}
		}
		keep := map[string]bool{}
		for _, c := range rs.chains {
			keep[c.name] = true
			nat.Chain(c.name)
			pl.addChains = append(pl.addChains, c.name)
		}
		for _, c := range old.chains {
			if !keep[c] {
				nat.Chain(c)
				nat.DeleteChain(c)
				pl.delChains = append(pl.delChains, c)
			}
		}
		for i := range numShared {
			t := tx.Table(sharedChains[i].table)
			removed, added := diff(old.shared[i], rs.shared[i])
			for _, spec := range removed {
				t.Delete(sharedChains[i].chain, spec)
			}
			for _, spec := range added {
				if i == natServices {
					t.Insert(sharedChains[i].chain, spec)
				} else {
					t.Append(sharedChains[i].chain, spec)
				}
			}
		}
		for _, c := range rs.chains {
			for _, spec := range c.rules {
				nat.Append(c.name, spec)
			}
		}
		if rendered[i] != nil {
			pl.services[name] = applied(rs)
		} else {
			pl.services[name] = nil
		}
	}
	return pl
}

// diff returns the rules of a that are not in b and those of b that are not
// in a, counting duplicates.
func diff(a, b []string) (onlyA, onlyB []string) {
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		if count[s] > 0 {
			count[s]--
		} else {
			onlyB = append(onlyB, s)
		}
	}
	for _, s := range a {
		if count[s] > 0 {
			count[s]--
			onlyA = append(onlyA, s)
		}
	}
	return onlyA, onlyB
}

// commit records that pl was applied.
func (p *planner) commit(pl *plan) {
	if pl.full {
		p.services = pl.services
		p.kernel = pl.kernel
		p.strayJumps = nil
		p.total = map[string]int{}
		for table, n := range pl.static {
			p.total[table] += n
		}
		for _, a := range p.services {
			for table, n := range a.rules {
				p.total[table] += n
			}
		}
		return
	}
	for _, c := range pl.delChains {
		delete(p.kernel["nat"], c)
	}
	for _, c := range pl.addChains {
		p.kernel["nat"][c] = true
	}
	for name, a := range pl.services {
		if old := p.services[name]; old != nil {
			for table, n := range old.rules {
				p.total[table] -= n
			}
		}
		if a == nil {
			delete(p.services, name)
			continue
		}
		p.services[name] = a
		for table, n := range a.rules {
			p.total[table] += n
		}
	}
}
