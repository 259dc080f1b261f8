package nftables

import (
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// planner turns a model update into one knftables transaction and
// remembers what was applied. It does no I/O, so tests can read the
// transactions it writes.
type planner struct {
	r renderer
	// dropInvalid adds the INVALID drop rule to filter-forward; off when
	// nf_conntrack_tcp_be_liberal is set, as upstream.
	dropInvalid bool
	// kernelChains and kernelSets are the per-Service chains and sets the
	// kernel holds, as far as we know: a full sync deletes those nothing
	// wants.
	kernelChains, kernelSets map[string]bool
	services                 map[model.ServicePortName]*serviceObjs
}

func newPlanner(cfg *Config) *planner {
	return &planner{
		r:            renderer{cfg: cfg},
		dropInvalid:  true,
		kernelChains: map[string]bool{},
		kernelSets:   map[string]bool{},
		services:     map[model.ServicePortName]*serviceObjs{},
	}
}

// learn records the chains and sets the kernel's table holds, of which
// the per-Service ones are kept: the shared ones are rewritten by every
// full sync anyway.
func (p *planner) learn(chains, sets map[string]bool) {
	for _, bc := range baseChains {
		delete(chains, bc.name)
	}
	for _, c := range regularChains {
		delete(chains, c)
	}
	delete(sets, setNodePortIPs)
	p.kernelChains, p.kernelSets = chains, sets
}

// plan is one transaction and the state it leads to.
type plan struct {
	tx   *knftables.Transaction
	full bool
	// services replaces the applied services after a full sync, or
	// updates them after a partial one (nil deletes).
	services map[model.ServicePortName]*serviceObjs
	// chains and sets replace the known per-Service ones after a full
	// sync; after a partial one add* and del* update them.
	chains, sets                           map[string]bool
	addChains, delChains, addSets, delSets []string
}

func (p *planner) newPlan(tx *knftables.Transaction, full bool) *plan {
	return &plan{tx: tx, full: full, services: map[model.ServicePortName]*serviceObjs{}}
}

func (p *planner) addrType() string { return p.r.cfg.family().addrType }

func (p *planner) mapObj(m mapID) *knftables.Map {
	typ := p.addrType() + " . inet_proto . inet_service : verdict"
	if verdictMaps[m].nodePort {
		typ = "inet_proto . inet_service : verdict"
	}
	return &knftables.Map{Name: verdictMaps[m].name, Type: typ, Comment: knftables.PtrTo(verdictMaps[m].comment)}
}

func elementObj(m mapID, e element) *knftables.Element {
	return &knftables.Element{Map: verdictMaps[m].name, Key: e.key, Value: []string{e.value}}
}

func (p *planner) setObj(s affinitySet) *knftables.Set {
	return &knftables.Set{Name: s.name, Type: p.addrType(), Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Timeout: knftables.PtrTo(time.Duration(s.timeout) * time.Second)}
}

// full flushes and rewrites the whole table and deletes the per-Service
// chains and sets nothing wants any more. Affinity sets are not flushed,
// so that clients keep their endpoints across a full sync.
func (p *planner) full(tx *knftables.Transaction, state *model.State) *plan {
	pl := p.newPlan(tx, true)
	pl.chains, pl.sets = map[string]bool{}, map[string]bool{}
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("rules for ebpf-proxy")})
	for _, bc := range baseChains {
		c := &knftables.Chain{Name: bc.name, Type: knftables.PtrTo(knftables.BaseChainType(bc.typ)),
			Hook: knftables.PtrTo(knftables.BaseChainHook(bc.hook)), Priority: knftables.PtrTo(knftables.BaseChainPriority(bc.priority))}
		tx.Add(c)
		tx.Flush(&knftables.Chain{Name: bc.name})
	}
	for _, name := range regularChains {
		tx.Add(&knftables.Chain{Name: name})
		tx.Flush(&knftables.Chain{Name: name})
	}
	for m := range numMaps {
		tx.Add(p.mapObj(m))
		tx.Flush(&knftables.Map{Name: verdictMaps[m].name})
	}
	tx.Add(&knftables.Set{Name: setNodePortIPs, Type: p.addrType(), Comment: knftables.PtrTo("node addresses that accept NodePorts")})
	tx.Flush(&knftables.Set{Name: setNodePortIPs})
	if !p.r.nodePorts.All {
		for _, a := range p.r.nodePorts.External() {
			tx.Add(&knftables.Element{Set: setNodePortIPs, Key: []string{a.String()}})
		}
	}
	for _, c := range p.r.staticRules(p.dropInvalid) {
		for _, rule := range c.rules {
			tx.Add(&knftables.Rule{Chain: c.name, Rule: rule})
		}
	}
	// Every chain of ours is flushed before any is deleted: a stale one
	// may still be the target of a rule or an element.
	stale := map[string]bool{}
	for c := range p.kernelChains {
		stale[c] = true
	}
	for _, name := range model.SortedNames(state.Services) {
		objs := p.r.service(state.Services[name])
		for _, c := range objs.chains {
			tx.Add(&knftables.Chain{Name: c.name})
			tx.Flush(&knftables.Chain{Name: c.name})
			pl.chains[c.name] = true
			delete(stale, c.name)
		}
		for _, s := range objs.sets {
			tx.Add(p.setObj(s))
			pl.sets[s.name] = true
		}
		for _, c := range objs.chains {
			for _, rule := range c.rules {
				tx.Add(&knftables.Rule{Chain: c.name, Rule: rule})
			}
		}
		for m := range numMaps {
			for _, e := range objs.elements[m] {
				tx.Add(elementObj(m, e))
			}
		}
		pl.services[name] = &objs
	}
	staleChains := sortedKeys(stale)
	for _, c := range staleChains {
		tx.Flush(&knftables.Chain{Name: c})
	}
	for _, c := range staleChains {
		tx.Delete(&knftables.Chain{Name: c})
	}
	for _, s := range sortedKeys(p.kernelSets) {
		if !pl.sets[s] {
			tx.Delete(&knftables.Set{Name: s})
		}
	}
	return pl
}

// partial rewrites only what the ServicePorts in up.Changed have in the
// table and changed: their map elements, their chains whose rules differ
// (flushed and written again; an endpoint that stays keeps its chain
// untouched), their affinity sets.
func (p *planner) partial(tx *knftables.Transaction, up model.Update) *plan {
	pl := p.newPlan(tx, false)
	names := model.SortedNames(up.Changed)
	rendered := make([]*serviceObjs, len(names))
	olds := make([]*serviceObjs, len(names))
	for i, name := range names {
		if svc := up.State.Services[name]; svc != nil {
			objs := p.r.service(svc)
			rendered[i] = &objs
		} else {
			rendered[i] = &serviceObjs{}
		}
		olds[i] = p.services[name]
		if olds[i] == nil {
			olds[i] = &serviceObjs{}
		}
	}
	// 1. Elements that go away or change, so that nothing points to a
	// chain about to be deleted.
	for i := range names {
		for m := range numMaps {
			gone, _ := diffElements(olds[i].elements[m], rendered[i].elements[m])
			for _, e := range gone {
				tx.Delete(elementObj(m, e))
			}
		}
	}
	// 2. The chains: created or flushed; the old ones that stay unwanted
	// flushed too, as they may jump to each other.
	var deleted []string
	unchanged := map[string]bool{}
	for i := range names {
		oldRules := map[string]string{}
		for _, c := range olds[i].chains {
			oldRules[c.name] = strings.Join(c.rules, "\n")
		}
		keep := map[string]bool{}
		for _, c := range rendered[i].chains {
			keep[c.name] = true
			if r, ok := oldRules[c.name]; ok && r == strings.Join(c.rules, "\n") {
				unchanged[c.name] = true
				continue
			}
			tx.Add(&knftables.Chain{Name: c.name})
			tx.Flush(&knftables.Chain{Name: c.name})
			pl.addChains = append(pl.addChains, c.name)
		}
		for _, c := range olds[i].chains {
			if !keep[c.name] {
				tx.Flush(&knftables.Chain{Name: c.name})
				deleted = append(deleted, c.name)
			}
		}
	}
	// 3. Sets, rules and new elements.
	for i, name := range names {
		keep := map[string]bool{}
		for _, s := range rendered[i].sets {
			keep[s.name] = true
			tx.Add(p.setObj(s))
			pl.addSets = append(pl.addSets, s.name)
		}
		for _, c := range rendered[i].chains {
			if unchanged[c.name] {
				continue
			}
			for _, rule := range c.rules {
				tx.Add(&knftables.Rule{Chain: c.name, Rule: rule})
			}
		}
		for m := range numMaps {
			_, added := diffElements(olds[i].elements[m], rendered[i].elements[m])
			for _, e := range added {
				tx.Add(elementObj(m, e))
			}
		}
		for _, s := range olds[i].sets {
			if !keep[s.name] {
				pl.delSets = append(pl.delSets, s.name)
			}
		}
		if up.State.Services[name] != nil {
			pl.services[name] = rendered[i]
		} else {
			pl.services[name] = nil
		}
	}
	// 4. What nothing refers to any more.
	for _, c := range deleted {
		tx.Delete(&knftables.Chain{Name: c})
	}
	for _, s := range pl.delSets {
		tx.Delete(&knftables.Set{Name: s})
	}
	pl.delChains = deleted
	return pl
}

// diffElements returns the elements of a not in b and those of b not in a.
func diffElements(a, b []element) (onlyA, onlyB []element) {
	inA, inB := map[string]bool{}, map[string]bool{}
	for _, e := range a {
		inA[e.id()] = true
	}
	for _, e := range b {
		inB[e.id()] = true
		if !inA[e.id()] {
			onlyB = append(onlyB, e)
		}
	}
	for _, e := range a {
		if !inB[e.id()] {
			onlyA = append(onlyA, e)
		}
	}
	return onlyA, onlyB
}

// commit records that pl was applied.
func (p *planner) commit(pl *plan) {
	if pl.full {
		p.services = pl.services
		p.kernelChains = pl.chains
		p.kernelSets = pl.sets
		return
	}
	for _, c := range pl.delChains {
		delete(p.kernelChains, c)
	}
	for _, c := range pl.addChains {
		p.kernelChains[c] = true
	}
	for _, s := range pl.delSets {
		delete(p.kernelSets, s)
	}
	for _, s := range pl.addSets {
		p.kernelSets[s] = true
	}
	for name, objs := range pl.services {
		if objs == nil {
			delete(p.services, name)
		} else {
			p.services[name] = objs
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
