package builders

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeOption changes a Node built by Node.
type NodeOption = func(*v1.Node)

// Node returns the Node name without addresses or labels; then opts change
// it in order. Nil options are skipped.
func Node(name string, opts ...NodeOption) *v1.Node {
	n := &v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}
	for _, o := range opts {
		if o != nil {
			o(n)
		}
	}
	return n
}

// NodeZone sets the node's topology.kubernetes.io/zone label ("" for
// none).
func NodeZone(zone string) NodeOption {
	return func(n *v1.Node) {
		if zone == "" {
			return
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[v1.LabelTopologyZone] = zone
	}
}

// NodeAddresses sets the node's status addresses.
func NodeAddresses(addrs ...v1.NodeAddress) NodeOption {
	return func(n *v1.Node) { n.Status.Addresses = append([]v1.NodeAddress(nil), addrs...) }
}
