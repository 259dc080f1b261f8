package k8swatch

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// TestSliceInformerKeepsOnlyTheTranslation: the EndpointSlice informer's
// transform keeps a slice's name, version and translation, not the decoded
// object; it is idempotent; and a slice's problems are reported once per
// version, when the handlers see it, not again when a relist transforms
// the same version anew.
func TestSliceInformerKeepsOnlyTheTranslation(t *testing.T) {
	var r reports
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	h := &handlers{lanes: []lane{{tr: tr}}, nodeName: "node-a", invalid: r.fn}
	h.addNode(builders.Node("node-a", builders.NodeZone("zone-a")))
	h.addService(builders.Service("ns", "web"))

	version := func(rv string, badPort bool) *discoveryv1.EndpointSlice {
		return builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")},
			func(es *discoveryv1.EndpointSlice) {
				es.ResourceVersion = rv
				if badPort {
					es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: es.Ports[0].Name})
				}
			})
	}
	transform := func(es *discoveryv1.EndpointSlice) *cachedSlice {
		t.Helper()
		obj, err := h.sliceTransform(es)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := obj.(*cachedSlice)
		if !ok {
			t.Fatalf("transform made %T", obj)
		}
		if again, _ := h.sliceTransform(c); again != any(c) {
			t.Error("transform of its own result changed it")
		}
		return c
	}

	v1 := transform(version("1", true))
	if v1.Name != "web-1" || v1.Namespace != "ns" || v1.ResourceVersion != "1" || !v1.serviceOK || v1.service.Name != "web" || v1.slices[0] == nil {
		t.Fatalf("cached %+v", v1)
	}
	checkReports(t, r.take(), nil) // not yet: the handler reports
	h.addSlice(v1)
	checkReports(t, r.take(), []string{"port \"http\" has no port number"})
	checkLines(t, "after add", describe(tr.Apply().State), []string{webLine})

	// A relist delivers the same version, transformed anew.
	h.updateSlice(v1, transform(version("1", true)))
	checkReports(t, r.take(), nil)

	// A new version with the same problem is reported again.
	v2 := transform(version("2", true))
	h.updateSlice(v1, v2)
	checkReports(t, r.take(), []string{"port \"http\" has no port number"})

	h.deleteSlice(v2)
	checkLines(t, "after delete", describe(tr.Apply().State), []string{"ns/web:http/TCP 10.96.0.10:80 eps=[] internal=REJECT[]"})
}
