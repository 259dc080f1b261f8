package main

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"

	"go.uber.org/zap"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// client returns the API server client, the informers' client and the
// API server's address; nils with --manifests. The informers' client waits
// for an API server that cannot be reached (k8swatch.Redial), so that they
// resume as soon as it is back; the other fails at once, for the reads at
// start-up that have a fallback.
func client(o *config.Options) (*kubeapi.Client, *kubeapi.Client, string, error) {
	if o.Manifests != "" {
		return nil, nil, "", nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags(o.Master, o.Kubeconfig)
	if err != nil {
		return nil, nil, "", fmt.Errorf("API server client configuration: %w", err)
	}
	cfg.ContentType = o.KubeAPIContentType
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS = o.KubeAPIQPS
	cfg.Burst = int(o.KubeAPIBurst)
	cfg.UserAgent = "ebpf-proxy"
	client, err := kubeapi.NewClient(cfg)
	if err != nil {
		return nil, nil, "", fmt.Errorf("API server client: %w", err)
	}
	watchCfg := rest.CopyConfig(cfg)
	watchCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return k8swatch.Redial(rt, k8swatch.RedialInterval) })
	watch, err := kubeapi.NewClient(watchCfg)
	if err != nil {
		return nil, nil, "", fmt.Errorf("API server client: %w", err)
	}
	return client, watch, cfg.Host, nil
}

// startSource starts the source of Services and EndpointSlices for the
// trackers of targets: the manifests directory when --manifests is set,
// else the API server through client, which tells nodeChanged when the
// agent must start again (k8swatch.WatchOptions.NodeChanged). With
// optedOut set, the same source also tells it the addresses of the node's
// pods opted out of the socket hooks (k8swatch.SocketLBAnnotation).
func startSource(ctx context.Context, o *config.Options, client *kubeapi.Client, host, nodeName string, targets []k8swatch.Target, m *metrics.Metrics, health *healthcheck.ProxyHealthServer, nodeChanged func(reason string), optedOut func([]netip.Addr), log *zap.Logger) error {
	invalid := func(kind, namespace, name, reason string) {
		m.InvalidObjectsTotal.WithLabelValues(kind, k8swatch.InvalidReason(reason)).Inc()
		log.Warn("ignoring invalid input", zap.String("kind", kind), zap.String("namespace", namespace),
			zap.String("name", name), zap.String("reason", reason))
	}
	if o.Manifests != "" {
		// Standalone: there is no Node object to be ineligible.
		health.SetNode(&healthcheck.NodeStatus{})
		src, err := k8swatch.NewManifests(o.Manifests, nodeName, targets, k8swatch.ManifestOptions{Invalid: invalid, LBAlgorithm: o.LB, OptedOut: optedOut})
		if err != nil {
			return err
		}
		if err := src.Reload(); err != nil {
			return fmt.Errorf("read manifests: %w", err)
		}
		go func() {
			if err := src.Run(ctx); err != nil {
				log.Error("manifests source stopped", zap.Error(err))
			}
		}()
		log.Info("reading Services and EndpointSlices from a directory", zap.String("manifests", o.Manifests))
		return nil
	}

	if optedOut != nil {
		go func() {
			err := k8swatch.WatchOptOut(ctx, k8swatch.APISource(client), nodeName, optedOut,
				k8swatch.OptOutOptions{ResyncPeriod: o.ConfigSyncPeriod, Invalid: invalid, Forbidden: func(resource string, err error) {
					log.Warn("the "+k8swatch.SocketLBAnnotation+" annotation is not read: the agent's identity may not list "+resource+
						" (deploy/rbac.yaml grants it); every pod's sockets are translated at connect()", zap.Error(err))
				}})
			if err != nil {
				log.Error("the opt-out of pods from the socket hooks is not watched", zap.Error(err))
			}
		}()
	}
	go func() {
		err := k8swatch.Watch(ctx, k8swatch.APISource(client), nodeName, targets, k8swatch.WatchOptions{
			LBAlgorithm:  o.LB,
			ResyncPeriod: o.ConfigSyncPeriod,
			NodeIP:       o.NodeIP,
			Invalid:      invalid,
			NodeStatus: func(known, deleting bool, taints []string) {
				if !known {
					health.SetNode(nil)
					return
				}
				health.SetNode(&healthcheck.NodeStatus{Deleting: deleting, TaintKeys: taints})
			},
			NodeChanged: nodeChanged,
		})
		if err != nil {
			log.Error("API server source stopped", zap.Error(err))
		}
	}()
	log.Info("watching the API server", zap.String("host", host))
	return nil
}
