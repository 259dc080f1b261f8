package maps

import (
	"fmt"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// hold keeps in the backends map every endpoint that owner's EndpointSlices
// still list, also those no frontend may choose (terminating, not ready):
// their established flows must keep working until the endpoint is removed
// (the TC program resets a TCP flow whose backend left the map, and the
// agent ends sockets connected to a backend Removed reports). A held backend
// is in no slot and no membership entry, so no new flow chooses it. It is
// planned after owner's frontends, so that a backend that moves from a slot
// to being only held keeps its id; svc nil releases what owner held.
func (a *applied) hold(p *plan, owner model.ServicePortName, svc *model.Service, node string) error {
	var want []uint32
	if svc != nil {
		want = make([]uint32, 0, len(svc.Endpoints))
		for _, ep := range svc.Endpoints {
			if !a.fam.holds(ep.Addr) {
				continue
			}
			b := Backend{Addr: ep.Addr, Port: ep.Port, Proto: owner.Protocol}
			// The flags a slot gives it: an endpoint that turns
			// terminating is marked so, and a slot naming it later
			// rewrites nothing.
			var f uint8
			if ep.Terminating {
				f |= BackendFlagTerminating
			}
			if node != "" && ep.NodeName == node {
				f |= BackendFlagLocal
			}
			ab, err := a.backends.ensure(p, b, f)
			if err != nil {
				a.releaseHeld(want)
				return fmt.Errorf("backend %s: %w", b, err)
			}
			ab.refs++
			want = append(want, ab.id)
		}
	}
	a.releaseHeld(a.held[owner])
	if len(want) == 0 {
		delete(a.held, owner)
		return nil
	}
	a.held[owner] = want
	return nil
}

// releaseHeld drops one reference to each backend of ids.
func (a *applied) releaseHeld(ids []uint32) {
	for _, id := range ids {
		a.backends.unrefID(id)
	}
}
