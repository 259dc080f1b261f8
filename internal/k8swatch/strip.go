package k8swatch

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// strip is the Service and Node informers' transform: it drops everything
// the translation does not read before the object enters the informer's
// cache, so that the cache of 10,000 Services holds only what the proxy uses
// (the EndpointSlice informer keeps translations: sliceTransform).
// managedFields and last-applied-configuration annotations alone are often
// larger than the rest of an object.
//
// It mutates in place (client-go allows that since 1.27, objects are fresh
// from the decoder) and is idempotent, as client-go requires. Objects of
// other types, tombstones included, pass through untouched.
func strip(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		stripService(o)
	case *v1.Node:
		stripNode(o)
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

// The filter labels are kept although the API server selects on them: they
// let the handlers check the selection themselves (Proxied).
var (
	serviceLabels = []string{LabelServiceProxyName, LabelHeadless}
	// serviceAnnotations are ebpf-proxy's own settings of a Service.
	serviceAnnotations = []string{AnnotationLBAlgorithm}
	// nodeLabels are the labels endpoint selection reads.
	nodeLabels = []string{v1.LabelTopologyZone}
)

func stripService(s *v1.Service) {
	stripMeta(&s.ObjectMeta, serviceLabels, serviceAnnotations)
	// Endpoints come from EndpointSlices: the selector and target ports
	// matter only to the EndpointSlice controller.
	s.Spec.Selector = nil
	s.Spec.ExternalName = ""
	s.Spec.LoadBalancerIP = ""
	s.Spec.LoadBalancerClass = nil
	s.Spec.AllocateLoadBalancerNodePorts = nil
	s.Spec.IPFamilyPolicy = nil
	for i := range s.Spec.Ports {
		s.Spec.Ports[i].TargetPort = intstr.IntOrString{}
		s.Spec.Ports[i].AppProtocol = nil
	}
	s.Status.Conditions = nil
	for i := range s.Status.LoadBalancer.Ingress {
		ing := &s.Status.LoadBalancer.Ingress[i]
		ing.Hostname = ""
		ing.Ports = nil
	}
}

// stripNode keeps the spec (pod CIDRs, taints, unschedulable are small and
// may serve local traffic detection and health checks) and of the status
// only the addresses. The status is most of a Node: images, conditions,
// capacity, volumes.
func stripNode(n *v1.Node) {
	stripMeta(&n.ObjectMeta, nodeLabels, nil)
	n.Status = v1.NodeStatus{Addresses: n.Status.Addresses}
}
