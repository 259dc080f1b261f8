package k8swatch

import (
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// cachedSlice is what the EndpointSlice informer keeps of a slice: the
// metadata its bookkeeping needs (name, namespace, resource version) and
// the slice's translation, which the tracker holds anyway. The decoded
// EndpointSlice, whose endpoints are most of the agent's memory at 10,000
// Services, is dropped as soon as it is translated: nothing reads the
// informer's cache but the informer itself (relists compare keys, tombstones
// carry the last object) and the update handler, which needs only the old
// translation.
type cachedSlice struct {
	metav1.ObjectMeta
	// service is the Service the slice's label names; ok false when it has
	// no such label.
	service   model.ServiceName
	serviceOK bool
	// slices are the translations for each family's lane: nil for a slice
	// that is not the lane's (another family's or proxy's, or invalid).
	// Never modified once made.
	slices []*model.EndpointSlice
	// problems are what the translation found, reported by the add and
	// update handlers: once per version of the slice, not again when a
	// relist transforms the same version anew.
	problems []problem
}

// problem is one report of the translator (InvalidFunc's arguments).
type problem struct{ kind, namespace, name, reason string }

// GetObjectKind implements runtime.Object.
func (c *cachedSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object; the translation is shared, as
// it is never modified.
func (c *cachedSlice) DeepCopyObject() runtime.Object {
	cp := *c
	c.ObjectMeta.DeepCopyInto(&cp.ObjectMeta)
	return &cp
}

// cacheSlice translates es into what the informer keeps of it, holding
// back the translator's reports.
func (h *handlers) cacheSlice(es *discoveryv1.EndpointSlice) *cachedSlice {
	c := &cachedSlice{ObjectMeta: metav1.ObjectMeta{
		Name: es.Name, Namespace: es.Namespace, UID: es.UID, ResourceVersion: es.ResourceVersion,
	}}
	c.service, c.serviceOK = EndpointSliceService(es)
	if !SliceProxied(es.Labels) {
		c.slices = make([]*model.EndpointSlice, len(h.lanes))
		return c
	}
	c.slices = translate(h.lanes, func(kind, namespace, name, reason string) {
		c.problems = append(c.problems, problem{kind, namespace, name, reason})
	}, func(tl *Translator) *model.EndpointSlice { return tl.EndpointSlice(es) })
	return c
}

// report passes on the problems found in a translation.
func (h *handlers) report(problems []problem) {
	if h.invalid == nil {
		return
	}
	for _, p := range problems {
		h.invalid(p.kind, p.namespace, p.name, p.reason)
	}
}

// sliceTransform is the EndpointSlice informer's transform: each slice is
// translated as it arrives and only the translation is kept. It is idempotent, as
// client-go requires: what it made passes through, as does anything else.
func (h *handlers) sliceTransform(obj any) (any, error) {
	if es, ok := obj.(*discoveryv1.EndpointSlice); ok {
		return h.cacheSlice(es), nil
	}
	return obj, nil
}

// cached is obj as the informer keeps it. A raw EndpointSlice (the
// handlers' callers in tests, or an informer without the transform) is
// translated now.
func (h *handlers) cached(obj any) (*cachedSlice, bool) {
	switch o := tombstone(obj).(type) {
	case *cachedSlice:
		return o, true
	case *discoveryv1.EndpointSlice:
		return h.cacheSlice(o), true
	}
	return nil, false
}
