package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxier"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

const ipFamily = "IPv4"

func run(ctx context.Context, o *options, log *zap.Logger) error {
	if o.cleanup {
		return cleanupAll(ctx, o, log)
	}
	if err := o.validate(); err != nil {
		return err
	}
	nodeName, err := nodeName(o.hostnameOverride)
	if err != nil {
		return err
	}
	log = log.With(zap.String("node", nodeName))
	applyOOMScoreAdj(o.oomScoreAdj, log)
	if o.initOnly {
		mode := o.proxyMode
		if mode == modeAuto {
			mode = modeEBPF
			if probeBPF() != nil {
				mode = modeIPTables
			}
		}
		log.Info("--init-only: applying the connection tracking settings, then exiting", zap.String("proxyMode", mode))
		return setupConntrack(realConntrack, o.conntrack, mode, log)
	}
	log.Info("starting", zap.String("proxyMode", o.proxyMode))

	m := metrics.New(ipFamily)
	dp, err := newDataplane(ctx, o, m, log)
	if err != nil {
		return err
	}
	defer dp.close()
	m.SetProxyMode(dp.mode, dp.reason)
	o.noteIgnored(dp.mode, log)
	if dp.mode == modeIPVS && o.ipvsStrictARP {
		if err := applyStrictARP(sysctl.Default, log); err != nil {
			return err
		}
	}
	syncPeriod, minSyncPeriod := o.syncPeriods(dp.mode)
	health, err := healthcheck.NewProxyHealthServer(o.healthzBindAddress, 2*syncPeriod, m, healthcheck.WithLogger(log))
	if err != nil {
		return err
	}

	topology := model.DefaultOptions
	topology.PreferSameNode = o.gates.enabled(gatePreferSameTrafficDistribution, topology.PreferSameNode)
	tr := tracker.New(nodeName, topology)
	if err := startSource(ctx, o, nodeName, tr, m, health, log); err != nil {
		return err
	}

	errc := make(chan error, 2)
	if o.healthzBindAddress != "" {
		go serve(ctx, "healthz", o.healthzBindAddress, health.Handler(), o.bindAddrHardFail, errc, log)
	}
	if o.metricsBindAddress != "" {
		mux := metrics.NewServerMux(m, dp.mode)
		if o.profiling {
			installProfiling(mux)
		}
		go serve(ctx, "metrics", o.metricsBindAddress, mux, o.bindAddrHardFail, errc, log)
	}
	if dp.run != nil {
		go dp.run(ctx)
	}

	svcHealth, err := newServiceHealthServer(ctx, o, nodeName, health, m, log)
	if err != nil {
		return err
	}
	defer svcHealth.Close()
	p := proxier.New(proxier.Config{MinSyncPeriod: minSyncPeriod, SyncPeriod: syncPeriod, IPFamily: ipFamily,
		ServiceHealth: svcHealth}, tr, dp.Dataplane, m, health, log)
	done := make(chan struct{})
	go func() {
		p.Run(ctx)
		close(done)
	}()
	go removeLeftovers(ctx, p, dp, log)
	go func() {
		// After the first sync: the fallbacks' rules have loaded
		// nf_conntrack by then, whose parameters exist only once it is.
		select {
		case <-ctx.Done():
		case <-p.FirstSync():
			setupConntrack(realConntrack, o.conntrack, dp.mode, log) //nolint:errcheck // logged; the node keeps its own values
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-done:
	}
	log.Info("stopping; what the dataplane programmed stays and keeps serving until the next agent adopts it", zap.String("mode", dp.mode))
	return nil
}

// removeLeftovers removes what other proxy modes left on the node once the
// first sync has programmed every Service in this one.
func removeLeftovers(ctx context.Context, p *proxier.Proxier, dp *dataplane, log *zap.Logger) {
	select {
	case <-ctx.Done():
		return
	case <-p.FirstSync():
	}
	if err := dp.removeLeftovers(ctx); err != nil {
		log.Error("removing what other proxy modes left", zap.String("mode", dp.mode), zap.Error(err))
		return
	}
	log.Info("removed what other proxy modes left", zap.String("mode", dp.mode))
}

func nodeName(override string) (string, error) {
	if override != "" {
		return strings.ToLower(strings.TrimSpace(override)), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return strings.ToLower(strings.TrimSpace(h)), nil
}

// serve runs an HTTP server until ctx ends. A failure to bind is retried
// every 5 seconds unless hardFail is set, as kube-proxy does.
func serve(ctx context.Context, name, addr string, h http.Handler, hardFail bool, errc chan<- error, log *zap.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx) //nolint:errcheck // exiting anyway
	}()
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			log.Info("serving", zap.String("server", name), zap.String("address", ln.Addr().String()))
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("server failed", zap.String("server", name), zap.Error(err))
			}
			return
		}
		if hardFail {
			errc <- fmt.Errorf("%s server: %w", name, err)
			return
		}
		log.Error("cannot bind, retrying in 5s", zap.String("server", name), zap.String("address", addr), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}
