package k8swatch

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// cachedService is what the Service informer keeps of a Service, as
// cachedSlice is for an EndpointSlice: the metadata its bookkeeping needs
// and the Service's translation for each lane, which the tracker holds
// anyway. A decoded Service is several times the size of its translation,
// and the handlers need nothing else: an update compares translations, a
// delete needs the name.
type cachedService struct {
	metav1.ObjectMeta
	// ports are the translations for each family's lane: nil for a
	// Service that is not the lane's (or not proxied). Never modified once
	// made.
	ports [][]*model.ServicePort
	// problems are what the translation found, reported by the add and
	// update handlers, once per version of the Service.
	problems []problem
}

// GetObjectKind implements runtime.Object.
func (c *cachedService) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object; the translation is shared, as
// it is never modified.
func (c *cachedService) DeepCopyObject() runtime.Object {
	cp := *c
	c.ObjectMeta.DeepCopyInto(&cp.ObjectMeta)
	return &cp
}

// cacheService translates svc into what the informer keeps of it, holding
// back the translator's reports.
func (h *handlers) cacheService(svc *v1.Service) *cachedService {
	c := &cachedService{ObjectMeta: metav1.ObjectMeta{
		Name: svc.Name, Namespace: svc.Namespace, UID: svc.UID, ResourceVersion: svc.ResourceVersion,
	}}
	c.ports = h.servicePorts(func(kind, namespace, name, reason string) {
		c.problems = append(c.problems, problem{kind, namespace, name, reason})
	}, svc)
	return c
}

// serviceTransform is the Service informer's transform: each Service is
// translated as it arrives and only the translation is kept. Idempotent:
// what it made passes through, as does anything else.
func (h *handlers) serviceTransform(obj any) (any, error) {
	if svc, ok := obj.(*v1.Service); ok {
		return h.cacheService(svc), nil
	}
	return obj, nil
}

// cachedSvc is obj as the informer keeps it; a raw Service (the handlers'
// callers in tests) is translated now.
func (h *handlers) cachedSvc(obj any) (*cachedService, bool) {
	switch o := tombstone(obj).(type) {
	case *cachedService:
		return o, true
	case *v1.Service:
		return h.cacheService(o), true
	}
	return nil, false
}

func (c *cachedService) name() model.ServiceName {
	return model.ServiceName{Namespace: c.Namespace, Name: c.Name}
}
