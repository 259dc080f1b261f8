package main

import (
	"context"
	"net/netip"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nodeaddrs"
)

// newServiceHealthServer builds the health check node port server of every
// proxy mode: the sync loop feeds it whatever the dataplane, and it listens
// where --nodeport-addresses says, as kube-proxy's does.
func newServiceHealthServer(ctx context.Context, o *options, nodeName string, health healthcheck.HealthReporter, m *metrics.Metrics, log *zap.Logger) (*healthcheck.ServiceHealthServer, error) {
	npa, err := nodeaddrs.Parse(o.nodePortAddresses, false)
	if err != nil {
		return nil, err
	}
	events, err := healthCheckEvents(ctx, o)
	if err != nil {
		return nil, err
	}
	log = log.Named("servicehealth")
	return healthcheck.NewServiceHealthServer(healthcheck.ServiceHealthConfig{
		NodeName: nodeName,
		ListenAddrs: func(nodeAddrs []netip.Addr) []netip.Addr {
			var primary netip.Addr
			if len(nodeAddrs) > 0 {
				primary = nodeAddrs[0]
			}
			addrs, err := npa.ListenAddrs(primary, nodeaddrs.InterfaceAddrs)
			if err != nil {
				log.Error("cannot match --nodeport-addresses to the node's addresses; health check node ports listen on all of them",
					zap.Stringer("nodePortAddresses", npa), zap.Error(err))
			}
			return addrs
		},
		Proxier:         health,
		Metrics:         m,
		Logger:          log,
		OnListenFailure: events,
	})
}
