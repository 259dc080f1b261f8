package cluster

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node describes a Node object for CreateNode. There is no kubelet: the object
// only tells the proxies under test their node's name, addresses, zone and
// pod CIDRs.
type Node struct {
	// Name is the object's name; proxies run with it as
	// --hostname-override.
	Name string
	// InternalIPs become status.addresses of type InternalIP (one per
	// family). Upstream kube-proxy takes its node IPs from them and exits if
	// they change after it started, so create the Node before starting a
	// proxy and leave its addresses alone.
	InternalIPs []string
	// Labels are added to kubernetes.io/hostname and kubernetes.io/os, which
	// a kubelet would set; set topology.kubernetes.io/zone here for
	// topology-aware routing.
	Labels map[string]string
	// PodCIDRs become spec.podCIDRs (needed by detectLocalMode NodeCIDR).
	PodCIDRs []string
}

// ZoneLabel is the label that topology-aware routing reads a node's zone
// from.
const ZoneLabel = corev1.LabelTopologyZone

// CreateNode creates a Node object with status.addresses and a Ready
// condition, and returns it as stored by the API server.
func (c *Cluster) CreateNode(ctx context.Context, n Node) (*corev1.Node, error) {
	if n.Name == "" {
		return nil, fmt.Errorf("create node: empty name")
	}
	addrs := []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: n.Name}}
	for _, ip := range n.InternalIPs {
		if _, err := netip.ParseAddr(ip); err != nil {
			return nil, fmt.Errorf("create node %s: internal IP: %w", n.Name, err)
		}
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	labels := map[string]string{corev1.LabelHostname: n.Name, corev1.LabelOSStable: "linux"}
	for k, v := range n.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels},
		Spec:       corev1.NodeSpec{PodCIDRs: n.PodCIDRs},
		Status: corev1.NodeStatus{
			Addresses: addrs,
			Conditions: []corev1.NodeCondition{{
				Type:               corev1.NodeReady,
				Status:             corev1.ConditionTrue,
				Reason:             "E2EHarness",
				Message:            "created by the ebpf-proxy end-to-end harness; there is no kubelet",
				LastHeartbeatTime:  metav1.Now(),
				LastTransitionTime: metav1.Now(),
			}},
		},
	}
	if len(n.PodCIDRs) > 0 {
		node.Spec.PodCIDR = n.PodCIDRs[0]
	}
	nodes := c.Clientset().CoreV1().Nodes()
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", n.Name, err)
	}
	// The Node registry keeps the status given on create; should a future
	// version drop it as other resources do, write it through the status
	// subresource rather than hand proxies a node without addresses.
	if len(created.Status.Addresses) != len(addrs) {
		created.Status = node.Status
		if created, err = nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("set status of node %s: %w", n.Name, err)
		}
	}
	return created, nil
}
