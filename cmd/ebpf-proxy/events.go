package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"

	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// eventsComponent is the reporting controller of the events the agent
// records; kube-proxy's are "kube-proxy".
const eventsComponent = "ebpf-proxy"

// healthCheckEvents returns a recorder that raises kube-proxy's Warning
// event FailedToStartServiceHealthcheck on a Service whose health check
// node port cannot be bound, so that `kubectl describe service` shows it.
// Without an API server (--manifests) it returns nil: there is nothing to
// record on. The broadcaster stops with ctx.
func healthCheckEvents(ctx context.Context, o *options) (healthcheck.ListenFailureRecorder, error) {
	if o.manifests != "" {
		return nil, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("API server client configuration for events: %w", err)
	}
	cfg.UserAgent = eventsComponent
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client for events: %w", err)
	}
	return listenFailureEvents(ctx, client), nil
}

func listenFailureEvents(ctx context.Context, client kubernetes.Interface) healthcheck.ListenFailureRecorder {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	rec := b.NewRecorder(scheme.Scheme, eventsComponent)
	return func(svc model.ServiceName, _ uint16, msg string) {
		// The reference is kube-proxy's: it has no Service object at hand,
		// only the name, so the UID is the name too.
		ref := &corev1.ObjectReference{Kind: "Service", Namespace: svc.Namespace, Name: svc.Name, UID: types.UID(svc.String())}
		rec.Eventf(ref, nil, corev1.EventTypeWarning, "FailedToStartServiceHealthcheck", "Listen", "%s", msg)
	}
}
