package example

import (
	"net/netip"
	"testing"
)

// NodeASource returns a Source of node-a's proxy of one family holding the
// example cluster of that family (Example, or Example6 when ipv6), and the
// pairs it holds.
func NodeASource(tb testing.TB, ipv6 bool) (*Source, []Pair) {
	if ipv6 {
		ex := Example6()
		return NewSource6(tb, Node6(NodeA)).Add(ex...), ex
	}
	ex := Example()
	return NewSource(tb, Node(NodeA)).Add(ex...), ex
}

// Churn records in src the change the dataplanes' golden tests make to the
// example cluster ex (Example or Example6) between their full and their
// partial sync: web loses a2, empty gets its first endpoint (b1), hairpin
// goes away.
func Churn(src *Source, ex []Pair) {
	web, empty, hairpin := ex[0], ex[6], ex[8]
	a1, b1 := PodA1, PodB1
	if netip.MustParseAddr(web.Service.Spec.ClusterIP).Is6() {
		a1, b1 = PodA1v6, PodB1v6
	}
	src.SetSlice(SliceFor(web.Service, EndpointsOn(a1, b1)...))
	src.SetSlice(SliceFor(empty.Service, EndpointsOn(b1)...))
	src.DeleteService(hairpin.Service)
	src.DeleteSlice(hairpin.Slice)
}
