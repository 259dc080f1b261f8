package healthcheck

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// ListenFailureEvents returns a recorder that raises kube-proxy's Warning
// event FailedToStartServiceHealthcheck on a Service whose health check
// node port cannot be bound, so that `kubectl describe service` shows it;
// component is the reporting controller. The broadcaster stops with ctx.
func ListenFailureEvents(ctx context.Context, client kubernetes.Interface, component string) ListenFailureRecorder {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	rec := b.NewRecorder(scheme.Scheme, component)
	return func(svc model.ServiceName, _ uint16, msg string) {
		// The reference is kube-proxy's: it has no Service object at hand,
		// only the name, so the UID is the name too.
		ref := &corev1.ObjectReference{Kind: "Service", Namespace: svc.Namespace, Name: svc.Name, UID: types.UID(svc.String())}
		rec.Eventf(ref, nil, corev1.EventTypeWarning, "FailedToStartServiceHealthcheck", "Listen", "%s", msg)
	}
}
