package nfconntrack

import (
	"net"
	"net/netip"
	"reflect"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ip(s string) netip.Addr     { return netip.MustParseAddr(s) }

// svc builds a ServicePort with frontends fr and endpoints eps ("addr:port",
// serving unless prefixed with "-").
func svc(name string, proto model.Protocol, clusterIP string, port, nodePort uint16, extra []string, eps ...string) *model.Service {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{ServiceName: model.ServiceName{Namespace: "ns", Name: name}, Port: "p", Protocol: proto},
		ClusterIP: ip(clusterIP), Port: port, NodePort: nodePort,
	}
	for i, e := range extra {
		if i%2 == 0 {
			sp.ExternalIPs = append(sp.ExternalIPs, ip(e))
		} else {
			sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, ip(e))
		}
	}
	s := &model.Service{Port: sp}
	for _, e := range eps {
		serving := true
		if e[0] == '-' {
			serving, e = false, e[1:]
		}
		a := ap(e)
		s.Endpoints = append(s.Endpoints, model.Endpoint{Addr: a.Addr(), Port: a.Port(), Ready: serving, Serving: serving, Terminating: !serving})
	}
	return s
}

func state(svcs ...*model.Service) map[model.ServicePortName]*model.Service {
	m := map[model.ServicePortName]*model.Service{}
	for _, s := range svcs {
		m[s.Port.Name] = s
	}
	return m
}

func aps(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, ap(s))
	}
	return out
}

func TestDiff(t *testing.T) {
	const (
		dns4 = "10.96.0.10"
		dns6 = "fd00:10:96::a"
	)
	ext4 := []string{"198.19.0.1", "198.19.0.2"} // an ExternalIP and a LoadBalancer IP
	ext6 := []string{"fd00:198:19::1", "fd00:198:19::2"}
	tests := []struct {
		name       string
		prev, next map[model.ServicePortName]*model.Service
		want       Stale
	}{{
		name: "IPv4 endpoint removed: flows to it through every frontend",
		prev: state(svc("dns", model.UDP, dns4, 53, 30053, ext4, "10.244.1.10:5353", "10.244.2.10:5353")),
		next: state(svc("dns", model.UDP, dns4, 53, 30053, ext4, "10.244.2.10:5353")),
		want: Stale{
			{ip(dns4), 53}:         {Serving: aps("10.244.2.10:5353"), Removed: aps("10.244.1.10:5353")},
			{ip("198.19.0.1"), 53}: {Serving: aps("10.244.2.10:5353"), Removed: aps("10.244.1.10:5353")},
			{ip("198.19.0.2"), 53}: {Serving: aps("10.244.2.10:5353"), Removed: aps("10.244.1.10:5353")},
			{Port: 30053}:          {Serving: aps("10.244.2.10:5353"), Removed: aps("10.244.1.10:5353")},
		},
	}, {
		name: "IPv6 endpoint removed",
		prev: state(svc("dns", model.UDP, dns6, 53, 30053, ext6, "[fd00:10:244:1::10]:5353", "[fd00:10:244:2::10]:5353")),
		next: state(svc("dns", model.UDP, dns6, 53, 30053, ext6, "[fd00:10:244:2::10]:5353")),
		want: Stale{
			{ip(dns6), 53}:             {Serving: aps("[fd00:10:244:2::10]:5353"), Removed: aps("[fd00:10:244:1::10]:5353")},
			{ip("fd00:198:19::1"), 53}: {Serving: aps("[fd00:10:244:2::10]:5353"), Removed: aps("[fd00:10:244:1::10]:5353")},
			{ip("fd00:198:19::2"), 53}: {Serving: aps("[fd00:10:244:2::10]:5353"), Removed: aps("[fd00:10:244:1::10]:5353")},
			{Port: 30053}:              {Serving: aps("[fd00:10:244:2::10]:5353"), Removed: aps("[fd00:10:244:1::10]:5353")},
		},
	}, {
		name: "TCP is ignored",
		prev: state(svc("web", model.TCP, dns4, 80, 30080, ext4, "10.244.1.10:8080", "10.244.2.10:8080")),
		next: state(svc("web", model.TCP, dns4, 80, 30080, ext4)),
		want: Stale{},
	}, {
		name: "IPv4 first endpoint gained: every untranslated flow",
		prev: state(svc("dns", model.UDP, dns4, 53, 30053, ext4)),
		next: state(svc("dns", model.UDP, dns4, 53, 30053, ext4, "10.244.1.10:5353")),
		want: Stale{
			{ip(dns4), 53}:         {Serving: aps("10.244.1.10:5353")},
			{ip("198.19.0.1"), 53}: {Serving: aps("10.244.1.10:5353")},
			{ip("198.19.0.2"), 53}: {Serving: aps("10.244.1.10:5353")},
			{Port: 30053}:          {Serving: aps("10.244.1.10:5353")},
		},
	}, {
		name: "IPv6 Service new with endpoints (blackholed before it was programmed)",
		prev: state(),
		next: state(svc("dns", model.UDP, dns6, 53, 0, nil, "[fd00:10:244:1::10]:5353")),
		want: Stale{{ip(dns6), 53}: {Serving: aps("[fd00:10:244:1::10]:5353")}},
	}, {
		name: "an endpoint added next to others changes nothing",
		prev: state(svc("dns", model.UDP, dns4, 53, 0, nil, "10.244.1.10:5353")),
		next: state(svc("dns", model.UDP, dns4, 53, 0, nil, "10.244.1.10:5353", "10.244.2.10:5353")),
		want: Stale{},
	}, {
		name: "a terminating endpoint still serving keeps its flows; one no longer serving loses them",
		prev: state(svc("dns", model.UDP, dns4, 53, 0, nil, "10.244.1.10:5353", "10.244.1.11:5353", "10.244.2.10:5353")),
		next: func() map[model.ServicePortName]*model.Service {
			s := svc("dns", model.UDP, dns4, 53, 0, nil, "10.244.1.10:5353", "-10.244.1.11:5353", "10.244.2.10:5353")
			s.Endpoints[0].Ready, s.Endpoints[0].Terminating = false, true // serving, terminating
			return state(s)
		}(),
		want: Stale{{ip(dns4), 53}: {Serving: aps("10.244.1.10:5353", "10.244.2.10:5353"), Removed: aps("10.244.1.11:5353")}},
	}, {
		name: "last endpoint removed: flows to it only",
		prev: state(svc("dns", model.UDP, dns4, 53, 0, nil, "10.244.1.10:5353")),
		next: state(svc("dns", model.UDP, dns4, 53, 0, nil)),
		want: Stale{{ip(dns4), 53}: {Removed: aps("10.244.1.10:5353")}},
	}, {
		name: "Service deleted",
		prev: state(svc("dns", model.UDP, dns4, 53, 30053, nil, "10.244.1.10:5353")),
		next: state(),
		want: Stale{
			{ip(dns4), 53}: {Removed: aps("10.244.1.10:5353")},
			{Port: 30053}:  {Removed: aps("10.244.1.10:5353")},
		},
	}, {
		name: "target port changed: the old port is removed",
		prev: state(svc("dns", model.UDP, dns4, 53, 0, nil, "10.244.1.10:5353")),
		next: state(svc("dns", model.UDP, dns4, 53, 0, nil, "10.244.1.10:5354")),
		want: Stale{{ip(dns4), 53}: {Serving: aps("10.244.1.10:5354"), Removed: aps("10.244.1.10:5353")}},
	}, {
		name: "ExternalIP dropped, NodePort changed: old frontends lose their flows, the new NodePort is gained",
		prev: state(svc("dns", model.UDP, dns4, 53, 30053, []string{"198.19.0.1"}, "10.244.1.10:5353")),
		next: state(svc("dns", model.UDP, dns4, 53, 30054, nil, "10.244.1.10:5353")),
		want: Stale{
			{ip("198.19.0.1"), 53}: {Removed: aps("10.244.1.10:5353")},
			{Port: 30053}:          {Removed: aps("10.244.1.10:5353")},
			{Port: 30054}:          {Serving: aps("10.244.1.10:5353")},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var names []model.ServicePortName
			for n := range tt.prev {
				names = append(names, n)
			}
			for n := range tt.next {
				if tt.prev[n] == nil {
					names = append(names, n)
				}
			}
			got := Diff(tt.prev, tt.next, names)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Diff:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

// TestDiffLooksOnlyAtNames: a partial sync's unchanged ServicePorts, and
// ServicePorts whose Service is the same object, are not compared.
func TestDiffLooksOnlyAtNames(t *testing.T) {
	a := svc("a", model.UDP, "10.96.0.10", 53, 0, nil, "10.244.1.10:5353")
	b := svc("b", model.UDP, "10.96.0.11", 53, 0, nil, "10.244.1.11:5353")
	prev := state(a, b)
	next := state(svc("a", model.UDP, "10.96.0.10", 53, 0, nil), svc("b", model.UDP, "10.96.0.11", 53, 0, nil))
	got := Diff(prev, next, []model.ServicePortName{b.Port.Name})
	want := Stale{{ip("10.96.0.11"), 53}: {Removed: aps("10.244.1.11:5353")}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Diff of b only: got %v, want %v", got, want)
	}
	if got := Diff(prev, prev, []model.ServicePortName{a.Port.Name, b.Port.Name}); len(got) != 0 {
		t.Errorf("Diff of unchanged Services: %v, want nothing", got)
	}
}

func flow(proto uint8, src, dst, replySrc string) *netlink.ConntrackFlow {
	s, d, r := ap(src), ap(dst), ap(replySrc)
	f := &netlink.ConntrackFlow{}
	f.Forward = netlink.IPTuple{Protocol: proto, SrcIP: net.IP(s.Addr().AsSlice()), SrcPort: s.Port(), DstIP: net.IP(d.Addr().AsSlice()), DstPort: d.Port()}
	f.Reverse = netlink.IPTuple{Protocol: proto, SrcIP: net.IP(r.Addr().AsSlice()), SrcPort: r.Port(), DstIP: net.IP(s.Addr().AsSlice()), DstPort: s.Port()}
	return f
}

// TestFilter checks which flows of a table the deletion matches.
func TestFilter(t *testing.T) {
	f := newFilter(Stale{
		{ip("10.96.0.10"), 53}:    {Serving: aps("10.244.2.10:5353"), Removed: aps("10.244.1.10:5353")},
		{Port: 30053}:             {Serving: aps("10.244.2.10:5353"), Removed: aps("10.244.1.10:5353")},
		{ip("10.96.0.11"), 53}:    {Removed: aps("10.244.1.11:5353")},
		{ip("fd00:10:96::a"), 53}: {Serving: aps("[fd00:10:244:1::10]:5353")},
	})
	const udp, tcp = unix.IPPROTO_UDP, unix.IPPROTO_TCP
	for _, tc := range []struct {
		name string
		flow *netlink.ConntrackFlow
		want bool
	}{
		{"to the removed endpoint", flow(udp, "10.244.1.100:40000", "10.96.0.10:53", "10.244.1.10:5353"), true},
		{"to the serving endpoint", flow(udp, "10.244.1.100:40001", "10.96.0.10:53", "10.244.2.10:5353"), false},
		{"untranslated, the frontend has an endpoint", flow(udp, "10.244.1.100:40002", "10.96.0.10:53", "10.96.0.10:53"), true},
		{"TCP to the removed endpoint", flow(tcp, "10.244.1.100:40003", "10.96.0.10:53", "10.244.1.10:5353"), false},
		{"another port of the Service address", flow(udp, "10.244.1.100:40004", "10.96.0.10:54", "10.244.1.10:5353"), false},
		{"NodePort on a node address to the removed endpoint", flow(udp, "198.18.0.10:40005", "192.168.77.11:30053", "10.244.1.10:5353"), true},
		{"NodePort to the serving endpoint", flow(udp, "198.18.0.10:40006", "192.168.77.11:30053", "10.244.2.10:5353"), false},
		{"no endpoint left: the removed one's flow", flow(udp, "10.244.1.100:40007", "10.96.0.11:53", "10.244.1.11:5353"), true},
		{"no endpoint left: an untranslated flow stays", flow(udp, "10.244.1.100:40008", "10.96.0.11:53", "10.96.0.11:53"), false},
		{"IPv6 untranslated, first endpoint gained", flow(udp, "[fd00:10:244:1::100]:40009", "[fd00:10:96::a]:53", "[fd00:10:96::a]:53"), true},
		{"IPv6 to the serving endpoint", flow(udp, "[fd00:10:244:1::100]:40010", "[fd00:10:96::a]:53", "[fd00:10:244:1::10]:5353"), false},
		{"unrelated", flow(udp, "10.244.1.100:40011", "1.1.1.1:53", "1.1.1.1:53"), false},
	} {
		if got := f.MatchConntrackFlow(tc.flow); got != tc.want {
			t.Errorf("%s: match = %t, want %t", tc.name, got, tc.want)
		}
	}
}

// TestCleanerRemembersWhatWasApplied: the first update compares with
// nothing, later partial ones with what was applied, a full one with
// everything applied (a ServicePort gone from it is deleted).
func TestCleanerRemembersWhatWasApplied(t *testing.T) {
	c := NewCleaner(CleanerConfig{})
	a := svc("a", model.UDP, "10.96.0.10", 53, 0, nil, "10.244.1.10:5353")
	b := svc("b", model.UDP, "10.96.0.11", 53, 0, nil, "10.244.1.11:5353")
	st := &model.State{Services: state(a, b)}
	if got := c.staleOf(model.Update{State: st, Changed: model.ChangeSet{}}); len(got) != 2 {
		t.Errorf("first update: %v, want both frontends checked", got)
	}
	a2 := svc("a", model.UDP, "10.96.0.10", 53, 0, nil)
	st = &model.State{Services: state(a2, b)}
	got := c.staleOf(model.Update{State: st, Changed: model.ChangeSet{a.Port.Name: {}}})
	if want := (Stale{{ip("10.96.0.10"), 53}: {Removed: aps("10.244.1.10:5353")}}); !reflect.DeepEqual(got, want) {
		t.Errorf("partial update: %v, want %v", got, want)
	}
	st = &model.State{Services: state(a2)}
	got = c.staleOf(model.Update{State: st, Full: true})
	if want := (Stale{{ip("10.96.0.11"), 53}: {Removed: aps("10.244.1.11:5353")}}); !reflect.DeepEqual(got, want) {
		t.Errorf("full update without b: %v, want %v", got, want)
	}
	if got := c.staleOf(model.Update{State: st, Full: true}); len(got) != 0 {
		t.Errorf("the same full update again: %v, want nothing", got)
	}
}
