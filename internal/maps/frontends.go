package maps

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Frontend is one address a Service is reached on, as keyed in the services
// map (without the slot).
type Frontend struct {
	Addr  netip.Addr
	Port  uint16
	Proto model.Protocol
	Scope uint8
}

func (f Frontend) String() string {
	s := fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.Addr, f.Port), f.Proto)
	if f.Scope == ScopeInternal {
		s += " (internal)"
	}
	return s
}

func (f Frontend) key(slot uint16) ServiceKey {
	return ServiceKey{Address: be32(f.Addr), Dport: be16(f.Port), Slot: slot, Proto: uint8(f.Proto), Scope: f.Scope}
}

func (f Frontend) compare(o Frontend) int {
	if c := f.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(f.Port, o.Port); c != 0 {
		return c
	}
	if c := cmp.Compare(f.Proto, o.Proto); c != 0 {
		return c
	}
	return cmp.Compare(f.Scope, o.Scope)
}

// Backend identifies a backend: the same pod address and port serving two
// Services is one backend.
type Backend struct {
	Addr  netip.Addr
	Port  uint16
	Proto model.Protocol
}

func (b Backend) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(b.Addr, b.Port), b.Proto)
}

// desiredFrontend is what one frontend must hold after a sync.
type desiredFrontend struct {
	fe       Frontend
	owner    model.ServicePortName
	flags    uint16
	affinity uint32
	backends []Backend
	bflags   []uint8
}

// frontendsOf renders the frontends of one ServicePort. Endpoint selection
// is the model's: this only maps verdicts onto entries.
//
// The socket programs serve the ClusterIP; NodePort, ExternalIP and
// LoadBalancer frontends come with the TC programs.
func frontendsOf(svc *model.Service) []desiredFrontend {
	sp := svc.Port
	if !sp.ClusterIP.Is4() {
		return nil
	}
	d := desiredFrontend{
		fe:       Frontend{Addr: sp.ClusterIP, Port: sp.Port, Proto: sp.Name.Protocol, Scope: ScopeExternal},
		owner:    sp.Name,
		flags:    FlagClusterIP,
		affinity: uint32(sp.AffinityTimeout.Seconds()),
	}
	action, eps := svc.Internal()
	switch action {
	case model.Reject:
		d.flags |= FlagReject
	case model.Drop:
		d.flags |= FlagDrop
	default:
		for _, ep := range eps {
			if !ep.Addr.Is4() {
				continue
			}
			d.backends = append(d.backends, Backend{Addr: ep.Addr, Port: ep.Port, Proto: sp.Name.Protocol})
			var f uint8
			if ep.Terminating {
				f |= BackendFlagTerminating
			}
			d.bflags = append(d.bflags, f)
		}
	}
	return []desiredFrontend{d}
}

func sortFrontends(ds []desiredFrontend) {
	slices.SortFunc(ds, func(a, b desiredFrontend) int { return a.fe.compare(b.fe) })
}
