package dump

import (
	"net/netip"
	"strconv"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// ServiceRef names the ServicePort an entry of the views belongs to: by
// the agent's names when it answered, always by the maps' id.
//
//	{"namespace": "default", "name": "web", "port": "http", "serviceID": 2}
type ServiceRef struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Port      string `json:"port,omitempty"`
	// ServiceID is the maps' id of the ServicePort, per family; 0 when
	// the services map no longer has it.
	ServiceID uint32 `json:"serviceID"`
}

// String is namespace/name:port ("default/web:http", "default/web" for an
// unnamed port), or svc=ID when the agent did not name it.
func (s ServiceRef) String() string {
	if s.Name == "" {
		return "svc=" + strconv.FormatUint(uint64(s.ServiceID), 10)
	}
	n := s.Namespace + "/" + s.Name
	if s.Port != "" {
		n += ":" + s.Port
	}
	return n
}

// namer puts names on the ids of one family's maps: the ServicePorts by
// their frontends (services map) joined with the agent's names on address,
// port and protocol, as Join does; backends by id.
type namer struct {
	byFrontend map[feKey]*api.ServicePort
	fams       map[string]*famNames
}

type famNames struct {
	svc       map[uint32]*api.ServicePort
	frontends map[uint32][]maps.FrontendEntry
	backends  map[uint32]netip.AddrPort
}

func newNamer(fams []Family, names *api.Services) *namer {
	n := &namer{byFrontend: map[feKey]*api.ServicePort{}, fams: map[string]*famNames{}}
	if names != nil {
		for i := range names.Services {
			sp := &names.Services[i]
			for _, fe := range sp.Frontends {
				n.byFrontend[feKey{fe.Address, fe.Port, sp.Protocol}] = sp
			}
		}
	}
	for _, fam := range fams {
		f := &famNames{svc: map[uint32]*api.ServicePort{}, frontends: map[uint32][]maps.FrontendEntry{},
			backends: map[uint32]netip.AddrPort{}}
		for _, e := range fam.Frontends {
			if sp := n.byFrontend[feKey{e.Frontend.Addr, e.Frontend.Port, e.Frontend.Proto.String()}]; sp != nil {
				f.svc[e.SvcID] = sp
			}
			f.frontends[e.SvcID] = append(f.frontends[e.SvcID], e)
			for _, b := range e.Backends {
				if !b.Missing {
					f.backends[b.ID] = netip.AddrPortFrom(b.Addr, b.Port)
				}
			}
		}
		n.fams[fam.Name] = f
	}
	return n
}

func (n *namer) fam(family string) *famNames {
	if f := n.fams[family]; f != nil {
		return f
	}
	return &famNames{}
}

func ref(sp *api.ServicePort, id uint32) ServiceRef {
	r := ServiceRef{ServiceID: id}
	if sp != nil {
		r.Namespace, r.Name, r.Port = sp.Namespace, sp.Name, sp.Port
	}
	return r
}

// byID names the ServicePort id of family.
func (n *namer) byID(family string, id uint32) ServiceRef { return ref(n.fam(family).svc[id], id) }

// protocolOf is the protocol of the ServicePort id, "" when the services
// map lacks it.
func (n *namer) protocolOf(family string, id uint32) string {
	if fes := n.fam(family).frontends[id]; len(fes) > 0 {
		return fes[0].Frontend.Proto.String()
	}
	return ""
}

// frontendsOf lists the frontends of the ServicePort id, "address:port",
// each once (an internal entry beside an external one is one frontend).
func (n *namer) frontendsOf(family string, id uint32, only uint16) []netip.AddrPort {
	out := []netip.AddrPort{}
	seen := map[netip.AddrPort]bool{}
	for _, e := range n.fam(family).frontends[id] {
		ap := netip.AddrPortFrom(e.Frontend.Addr, e.Frontend.Port)
		if seen[ap] || (only != 0 && e.Flags&only == 0) {
			continue
		}
		seen[ap] = true
		out = append(out, ap)
	}
	return out
}

// matches reports whether the ServicePort passes o's --service and
// --protocol.
func (o Options) matches(s ServiceRef, protocol string) bool {
	if o.Service.Name != "" && (s.Namespace != o.Service.Namespace || s.Name != o.Service.Name) {
		return false
	}
	return o.Protocol == 0 || protocol == o.Protocol.String()
}

// hasAddress reports whether --address is unset or one of aps is on it.
func (o Options) hasAddress(aps ...netip.AddrPort) bool {
	if !o.Address.IsValid() {
		return true
	}
	for _, ap := range aps {
		if ap.Addr().Unmap() == o.Address {
			return true
		}
	}
	return false
}
