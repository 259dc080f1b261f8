package builders

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateNamespace creates the namespace name through the API; one that
// exists already is no error (a test's earlier run, or a second
// testbed of the same test).
func CreateNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}

// CreateService creates svc and then its EndpointSlices through the API,
// in its namespace, as a controller would have them appear, and returns
// the Service as the API server stored it (its ClusterIP allocated).
func CreateService(ctx context.Context, cs kubernetes.Interface, svc *v1.Service, slices ...*discoveryv1.EndpointSlice) (*v1.Service, error) {
	created, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	for _, es := range slices {
		ns := es.Namespace
		if ns == "" {
			ns = svc.Namespace
		}
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create endpointslice %s of %s/%s: %w", es.Name, svc.Namespace, svc.Name, err)
		}
	}
	return created, nil
}
