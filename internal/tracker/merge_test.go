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
		slices map[string]*model.EndpointSlice
		asIs   bool
	}{
		{"one slice of one port", map[string]*model.EndpointSlice{"a": {Ports: []model.EndpointPort{http},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, true), ep("10.0.0.2", 8080, true)}}}, true},
		{"an address twice", map[string]*model.EndpointSlice{"a": {Ports: []model.EndpointPort{http},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, false), ep("10.0.0.1", 8080, true)}}}, false},
		{"another port name", map[string]*model.EndpointSlice{"a": {Ports: []model.EndpointPort{{Name: "dns", Port: 8080, Protocol: model.TCP}},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, true)}}}, false},
		{"two ports", map[string]*model.EndpointSlice{"a": {Ports: []model.EndpointPort{http, {Name: "dns", Port: 53, Protocol: model.UDP}},
			Endpoints: []model.Endpoint{ep("10.0.0.1", 0, true)}}}, false},
		{"two slices", map[string]*model.EndpointSlice{
			"a": {Ports: []model.EndpointPort{http}, Endpoints: []model.Endpoint{ep("10.0.0.2", 8080, true)}},
			"b": {Ports: []model.EndpointPort{http}, Endpoints: []model.Endpoint{ep("10.0.0.1", 8080, true)}}}, false},
		{"unsorted", map[string]*model.EndpointSlice{"a": {Ports: []model.EndpointPort{http},
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
