package main

import (
	"context"

	"fmt"

	"go.uber.org/zap"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// eventsComponent is the reporting controller of the events the agent
// records; kube-proxy's are "kube-proxy".
const eventsComponent = "ebpf-proxy"

// healthCheckEvents returns a recorder that raises kube-proxy's Warning
// event FailedToStartServiceHealthcheck on a Service whose health check
// node port cannot be bound, so that `kubectl describe service` shows it.
// Without an API server (--manifests) it returns nil: there is nothing to
// record on. The broadcaster stops with ctx.
func healthCheckEvents(ctx context.Context, o *config.Options, log *zap.Logger) (healthcheck.ListenFailureRecorder, error) {
	if o.Manifests != "" {
		return nil, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags(o.Master, o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("API server client configuration for events: %w", err)
	}
	cfg.UserAgent = eventsComponent
	client, err := kubeapi.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client for events: %w", err)
	}
	return healthcheck.ListenFailureEvents(ctx, client.Events, eventsComponent, log), nil
}

// newServiceHealthServers builds the health check node port servers of
// every proxy mode, one per IP family in fams (kube-proxy runs one per
// family proxier): the family's sync loop feeds it whatever the dataplane,
// and it listens where --nodeport-addresses says (the State's NodePort
// addresses of that family), as kube-proxy's does.
func newServiceHealthServers(ctx context.Context, o *config.Options, nodeName string, fams []string, health healthcheck.HealthReporter, m *metrics.Metrics, log *zap.Logger) ([]*healthcheck.ServiceHealthServer, error) {
	events, err := healthCheckEvents(ctx, o, log.Named("events"))
	if err != nil {
		return nil, err
	}
	var out []*healthcheck.ServiceHealthServer
	for _, f := range fams {
		s, err := healthcheck.NewServiceHealthServer(healthcheck.ServiceHealthConfig{
			NodeName:        nodeName,
			Proxier:         health,
			Metrics:         m,
			Logger:          log.Named("servicehealth").With(zap.String("ipFamily", f)),
			OnListenFailure: events,
			IPv6:            f == metrics.IPv6,
		})
		if err != nil {
			for _, s := range out {
				s.Close()
			}
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
