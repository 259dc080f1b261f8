package tracker

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// A Service's only slice is used as it is exactly when it is what merging
// would build; otherwise merging builds a new list.
func TestMergeUsesAListAsItIsOnlyWhenItIsTheMergedOne(t *testing.T) {
	sp := &model.ServicePort{Name: model.ServicePortName{Port: "http", Protocol: model.TCP}}
	ep := func(ip string, port uint16, ready bool) model.Endpoint {
		return model.Endpoint{Addr: netip.MustParseAddr(ip), Port: port, Ready: ready, Serving: ready, Terminating: !ready}
	}
	http := model.EndpointPort{Name: "http", Port: 8080, Protocol: model.TCP}
	tests := []struct {
		name   string
		slices sliceSet
		asIs   bool
	}{
		{"one slice of one port", sliceSet{{Name: "a", Ports: []model.EndpointPort{http},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, true), ep("10.0.0.2", 8080, true)}}}, true},
		{"an address twice", sliceSet{{Name: "a", Ports: []model.EndpointPort{http},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, false), ep("10.0.0.1", 8080, true)}}}, false},
		{"another port name", sliceSet{{Name: "a", Ports: []model.EndpointPort{{Name: "dns", Port: 8080, Protocol: model.TCP}},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, true)}}}, false},
		{"two ports", sliceSet{{Name: "a", Ports: []model.EndpointPort{http, {Name: "dns", Port: 53, Protocol: model.UDP}},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 0, true)}}}, false},
		{"two slices", sliceSet{
			{Name: "a", Ports: []model.EndpointPort{http}, Endpoints: []model.Endpoint{ep("10.0.0.2", 8080, true)}},
			{Name: "b", Ports: []model.EndpointPort{http}, Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, true)}}}, false},
		{"unsorted", sliceSet{{Name: "a", Ports: []model.EndpointPort{http},
			Endpoints: []model.Endpoint{ep("10.0.0.2", 8080, true), ep("10.0.0.1", 8080, true)}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mergeEndpoints(sp, tt.slices, "node-a")
			want := mergeAll(sp, tt.slices, "node-a")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("merged %v, want %v", got, want)
			}
			_, shared := asIs(sp, tt.slices)
			if shared != tt.asIs {
				t.Errorf("used as is: %t, want %t", shared, tt.asIs)
			}
			if shared && cap(got) != len(got) {
				t.Errorf("a shared list can be appended into (cap %d, len %d)", cap(got), len(got))
			}
		})
	}
}

// A Service's slices stay in name order as they are added, replaced and
// removed, which is the order merging visits them in.
func TestSliceSetKeepsNameOrder(t *testing.T) {
	mk := func(name string, n int) *model.EndpointSlice {
		return &model.EndpointSlice{Name: name, Endpoints: make([]model.Endpoint, n)}
	}
	names := func(ss sliceSet) (out []string) {
		for _, s := range ss {
			out = append(out, s.Name)
		}
		return out
	}
	var ss sliceSet
	for _, n := range []string{"web-c", "web-a", "web-b"} {
		ss = ss.put(mk(n, 1))
	}
	if got := names(ss); !reflect.DeepEqual(got, []string{"web-a", "web-b", "web-c"}) {
		t.Fatalf("after adding: %v", got)
	}
	ss = ss.put(mk("web-b", 5))
	if got := names(ss); len(ss) != 3 || len(ss[1].Endpoints) != 5 || !reflect.DeepEqual(got, []string{"web-a", "web-b", "web-c"}) {
		t.Fatalf("after replacing web-b: %v (%d endpoints)", got, len(ss[1].Endpoints))
	}
	ss = ss.remove("web-a").remove("web-x")
	if got := names(ss); !reflect.DeepEqual(got, []string{"web-b", "web-c"}) {
		t.Fatalf("after removing web-a and an unknown slice: %v", got)
	}
	if ss = ss.remove("web-b").remove("web-c"); len(ss) != 0 {
		t.Fatalf("after removing all: %v", names(ss))
	}
}
