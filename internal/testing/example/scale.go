package example

import (
	"fmt"
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// Scale builds large states for benchmarks directly in the model (the
// translator and tracker have their own benchmarks): n ClusterIP Services
// of one TCP port, each with eps ready endpoints spread over 100 nodes, one
// of them node-a. Addresses: ClusterIPs from 10.96.0.0/16, endpoints from
// 10.128.0.0/9, all distinct.
type Scale struct {
	State *model.State
	Names []model.ServicePortName
	eps   int
	turn  int
}

// NewScale returns the state of n Services with eps endpoints each.
func NewScale(n, eps int) *Scale {
	s := &Scale{State: &model.State{Node: Node(NodeA), Services: make(map[model.ServicePortName]*model.Service, n)}, eps: eps}
	for i := range n {
		name := model.ServicePortName{ServiceName: model.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%05d", i)}, Port: "http", Protocol: model.TCP}
		s.Names = append(s.Names, name)
		s.State.Services[name] = s.service(i, 0)
	}
	return s
}

// service builds Service i; variant shifts its last endpoint's address so
// that successive variants differ in exactly one endpoint.
func (s *Scale) service(i, variant int) *model.Service {
	sp := &model.ServicePort{
		Name:      s.Names[i],
		ClusterIP: nthAddr(netip.MustParseAddr("10.96.0.0"), 1+i),
		Port:      80,
	}
	eps := make([]model.Endpoint, s.eps)
	for j := range eps {
		k := i*s.eps + j
		if j == s.eps-1 {
			k += variant * 1 << 20 // far beyond every other endpoint's address
		}
		eps[j] = builders.ModelEndpoint(netip.AddrPortFrom(nthAddr(netip.MustParseAddr("10.128.0.0"), k), 8080), fmt.Sprintf("node-%d", k%100))
	}
	if s.eps > 0 {
		eps[0].NodeName = NodeA
	}
	return builders.ModelService(sp, eps, &s.State.Node)
}

// Full returns a full update of the current state.
func (s *Scale) Full() model.Update {
	return model.Update{State: s.State, Full: true}
}

// ChangeOneEndpoint replaces one endpoint of one Service (a different
// Service each call) and returns the partial update for it.
func (s *Scale) ChangeOneEndpoint() model.Update {
	s.turn++
	i := s.turn % len(s.Names)
	s.State.Services[s.Names[i]] = s.service(i, s.turn%2+1)
	return model.Update{State: s.State, Changed: model.ChangeSet{s.Names[i]: {}}}
}

func nthAddr(base netip.Addr, n int) netip.Addr {
	a := base.As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
