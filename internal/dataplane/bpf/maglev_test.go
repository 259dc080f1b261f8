package bpf_test

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// maglevState is a state of one family with a Maglev NodePort Service
// whose endpoints are eps.
func maglevState(node netip.Addr, vip string, eps ...string) *model.State {
	st := &model.State{Services: map[model.ServicePortName]*model.Service{}}
	st.Node = model.Node{Name: "node1", Addrs: []netip.Addr{node}, NodePorts: model.NodePortAddresses{All: true, Addrs: []netip.Addr{node}}}
	sp := builders.ModelServicePort("default", "mg", model.TCP, netip.MustParseAddr(vip), 80, func(sp *model.ServicePort) {
		sp.NodePort = upgradeNodePort
		sp.LBAlgorithm = model.LBMaglev
	})
	var mes []model.Endpoint
	for _, e := range eps {
		mes = append(mes, builders.ModelEndpoint(netip.MustParseAddrPort(e), "node1"))
	}
	st.Services[sp.Name] = builders.ModelService(sp, mes, &st.Node)
	return st
}

// TestMaglevTablesOfBothFamilies: the dataplane writes the Maglev table of
// an IPv4 ServicePort to lb4_maglev_v1 and that of an IPv6 ServicePort,
// through IPv6(), to lb6_maglev_v1, each in the table size the maps were
// loaded with; a restarted dataplane keeps both tables as they are, and an
// endpoint change rewrites its family's table alone.
func TestMaglevTablesOfBothFamilies(t *testing.T) {
	u := newUpgradeNode(t)
	families := []struct {
		name   string
		tables string
		state  func(eps ...string) *model.State
		eps    []string
		of     func(d dataplaneWithIPv6) dataplane.Dataplane
	}{
		{"IPv4", bpfobj.TcMapLb4MaglevV1,
			func(eps ...string) *model.State { return maglevState(u.node.IP, "10.96.0.40", eps...) },
			[]string{"10.244.1.10:8080", "10.244.1.11:8080", "10.244.1.12:8080"},
			func(d dataplaneWithIPv6) dataplane.Dataplane { return d }},
		{"IPv6", bpfobj.TcMapLb6MaglevV1,
			func(eps ...string) *model.State {
				return maglevState(netip.MustParseAddr("fd00:77::11"), "fd00:96::40", eps...)
			},
			[]string{"[fd00:244:1::10]:8080", "[fd00:244:1::11]:8080", "[fd00:244:1::12]:8080"},
			func(d dataplaneWithIPv6) dataplane.Dataplane { return d.IPv6() }},
	}
	// tables returns the inner map of every ServicePort's table, by id.
	tables := func(t *testing.T, name string) map[uint32]ebpf.MapID {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(u.pin(name), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		out := map[uint32]ebpf.MapID{}
		var (
			k  uint32
			id ebpf.MapID
		)
		it := m.Iterate()
		for it.Next(&k, &id) {
			out[k] = id
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	syncAll := func(t *testing.T, d dataplaneWithIPv6, shrink string) {
		t.Helper()
		for _, fam := range families {
			eps := fam.eps
			if fam.name == shrink {
				eps = eps[:2]
			}
			if err := fam.of(d).Sync(model.Update{State: fam.state(eps...), Full: true}); err != nil {
				t.Fatalf("%s: %v", fam.name, err)
			}
		}
	}

	d, _ := u.start(t, loader.DefaultMapSizes, 1024, zap.NewNop())
	syncAll(t, d, "")
	first := map[string]map[uint32]ebpf.MapID{}
	for _, fam := range families {
		first[fam.name] = tables(t, fam.tables)
		if len(first[fam.name]) != 1 {
			t.Fatalf("%s: %d tables in %s, want one", fam.name, len(first[fam.name]), fam.tables)
		}
		for _, id := range first[fam.name] {
			inner, err := ebpf.NewMapFromID(id)
			if err != nil {
				t.Fatal(err)
			}
			backends := map[uint32]int{}
			for i := range inner.MaxEntries() {
				var b uint32
				if err := inner.Lookup(i, &b); err != nil {
					t.Fatal(err)
				}
				backends[b]++
			}
			if inner.MaxEntries() != loader.DefaultMapSizes.MaglevTable || len(backends) != 3 || backends[0] != 0 {
				t.Errorf("%s: table of %d entries naming backends %v, want %d entries naming three", fam.name, inner.MaxEntries(), backends, loader.DefaultMapSizes.MaglevTable)
			}
			inner.Close()
		}
	}
	d.Close()

	d, _ = u.start(t, loader.DefaultMapSizes, 1024, zap.NewNop())
	defer d.Close()
	syncAll(t, d, "")
	for _, fam := range families {
		if got := tables(t, fam.tables); !maps.Equal(got, first[fam.name]) {
			t.Errorf("%s: tables %v after a restart, want those before it, %v, untouched", fam.name, got, first[fam.name])
		}
	}
	for _, shrink := range families {
		t.Run("an endpoint fewer of "+shrink.name, func(t *testing.T) {
			syncAll(t, d, shrink.name)
			for _, fam := range families {
				got := tables(t, fam.tables)
				if changed := !maps.Equal(got, first[fam.name]); changed != (fam.name == shrink.name) {
					t.Errorf("%s: tables %v, before %v: changed %v, want %v", fam.name, got, first[fam.name], changed, fam.name == shrink.name)
				}
				if len(got) != 1 {
					t.Errorf("%s: %d tables, want one", fam.name, len(got))
				}
			}
			syncAll(t, d, "")
			for _, fam := range families {
				first[fam.name] = tables(t, fam.tables)
			}
		})
	}
}

// dataplaneWithIPv6 is the BPF dataplane as the test uses it.
type dataplaneWithIPv6 interface {
	dataplane.Dataplane
	IPv6() dataplane.Dataplane
}
