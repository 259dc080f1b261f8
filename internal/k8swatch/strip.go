package k8swatch

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// strip is the Node informer's transform: it drops everything the
// translation does not read before the object enters the informer's cache
// (the Service and EndpointSlice informers keep translations instead:
// serviceTransform, sliceTransform). managedFields and the status (images,
// conditions, volumes) are most of a Node.
//
// It mutates in place (client-go allows that since 1.27, objects are fresh
// from the decoder) and is idempotent, as client-go requires. Objects of
// other types, tombstones included, pass through untouched.
func strip(obj any) (any, error) {
	if n, ok := obj.(*v1.Node); ok {
		stripNode(n)
	}
	return obj, nil
}

// stripMeta keeps name, namespace, UID, resource version, generation and
// timestamps, and of the labels and annotations only those listed.
func stripMeta(m *metav1.ObjectMeta, keepLabels, keepAnnotations []string) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	m.GenerateName = ""
	m.Labels = keepOnly(m.Labels, keepLabels)
	m.Annotations = keepOnly(m.Annotations, keepAnnotations)
}

func keepOnly(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}

// nodeLabels are the labels endpoint selection reads.
var nodeLabels = []string{v1.LabelTopologyZone}

// stripNode keeps the spec (pod CIDRs, taints, unschedulable are small and
// may serve local traffic detection and health checks) and of the status
// only the addresses. The status is most of a Node: images, conditions,
// capacity, volumes.
func stripNode(n *v1.Node) {
	stripMeta(&n.ObjectMeta, nodeLabels, nil)
	n.Status = v1.NodeStatus{Addresses: n.Status.Addresses}
}
