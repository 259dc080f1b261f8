package k8swatch

import (
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// bulkyMeta is metadata as a real cluster fills it in: managed fields and a
// last-applied annotation bigger than the object itself.
func bulkyMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = []metav1.ManagedFieldsEntry{{
		Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply,
		FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:ports":{}}}`),
	}}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = strings.Repeat("x", 4096)
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels["app"] = "web"
	m.OwnerReferences = []metav1.OwnerReference{{Kind: "Service", Name: "web", UID: "u1"}}
	m.Finalizers = []string{"example.com/f"}
	m.GenerateName = "web-"
}

// TestStrip checks that the informers' transform keeps everything the
// translation reads (the translation of the stripped object is unchanged)
// and drops the bulk, and that it is idempotent as client-go requires.
func TestStrip(t *testing.T) {
	tests := []struct {
		name string
		obj  runtime.Object
		// gone are checks that must hold after stripping.
		gone func(obj runtime.Object) []string
	}{
		{
			name: "Node",
			obj: func() runtime.Object {
				n := builders.Node("node-a", builders.NodeZone("zone-a"), builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.77.10"}))
				bulkyMeta(&n.ObjectMeta)
				n.Spec.PodCIDRs = []string{"10.244.1.0/24"}
				n.Status.Images = []v1.ContainerImage{{Names: []string{strings.Repeat("i", 1000)}}}
				n.Status.Capacity = v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}
				return n
			}(),
			gone: func(obj runtime.Object) []string {
				n := obj.(*v1.Node)
				var bad []string
				if n.ManagedFields != nil || n.Annotations != nil || len(n.Labels) != 1 {
					bad = append(bad, "metadata kept")
				}
				if n.Status.Images != nil || n.Status.Capacity != nil {
					bad = append(bad, "status kept")
				}
				if len(n.Spec.PodCIDRs) != 1 {
					bad = append(bad, "spec lost")
				}
				return bad
			},
		},
	}
	translate := func(obj runtime.Object) any {
		if n, ok := obj.(*v1.Node); ok {
			tl := Translator{}
			return tl.Node(n)
		}
		return nil
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := translate(tc.obj)
			stripped, err := strip(tc.obj.DeepCopyObject())
			if err != nil {
				t.Fatal(err)
			}
			s := stripped.(runtime.Object)
			if after := translate(s); !reflect.DeepEqual(before, after) {
				t.Errorf("translation changed by stripping:\n  before %+v\n  after  %+v", before, after)
			}
			if bad := tc.gone(s); len(bad) > 0 {
				t.Errorf("not stripped: %v", bad)
			}
			again, _ := strip(s.DeepCopyObject())
			if !reflect.DeepEqual(again, s) {
				t.Errorf("strip is not idempotent")
			}
		})
	}

	t.Run("other objects and tombstones pass untouched", func(t *testing.T) {
		svc := builders.Service("ns", "web", func(s *v1.Service) { bulkyMeta(&s.ObjectMeta) })
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
		bulkyMeta(&pod.ObjectMeta)
		for _, want := range []any{cacheTombstone("ns/web", svc), pod} {
			var in any
			switch w := want.(type) {
			case cache.DeletedFinalStateUnknown:
				in = cacheTombstone(w.Key, w.Obj.(*v1.Service).DeepCopy())
			case *v1.Pod:
				in = w.DeepCopy()
			}
			got, err := strip(in)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("strip(%T) changed it: %v", in, err)
			}
		}
	})
}
