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
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxier"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sockterm"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

const ipFamily = "IPv4"

func run(ctx context.Context, o *options, log *zap.Logger) error {
	if o.cleanup {
		if err := errors.Join(loader.Cleanup(o.bpffsPath), loader.CleanupTC()); err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
		log.Info("removed every pinned program and map", zap.String("bpffsPath", o.bpffsPath))
		return nil
	}
	if err := o.validate(); err != nil {
		return err
	}
	nodeName, err := nodeName(o.hostnameOverride)
	if err != nil {
		return err
	}
	cgroupPath := o.cgroupPath
	if cgroupPath == "" {
		if cgroupPath, err = defaultCgroupPath(); err != nil {
			return fmt.Errorf("find the cgroup v2 root: %w", err)
		}
	}
	log = log.With(zap.String("node", nodeName))
	log.Info("starting", zap.String("mode", o.proxyMode), zap.String("cgroupPath", cgroupPath), zap.String("bpffsPath", o.bpffsPath))

	// Loading replaces running programs in place; a failure here leaves the
	// programs of an earlier agent attached and serving.
	l, err := loader.Load(loader.Config{BPFFSPath: o.bpffsPath, CgroupPath: cgroupPath, Sizes: o.mapSizes})
	if err != nil {
		return fmt.Errorf("load BPF programs: %w", err)
	}
	defer l.Close()
	if !l.Features.SetRetval {
		log.Warn("kernel lacks bpf_set_retval in cgroup programs: connections to Services without endpoints fail with EPERM instead of ECONNREFUSED")
	}
	w, err := maps.NewWriter(maps.KernelMaps(&l.Objects.SockMaps), maps.Limits{Backends: l.Sizes.Backends, RevNat: l.Sizes.RevNat})
	if err != nil {
		return fmt.Errorf("restore state from pinned maps: %w", err)
	}
	tc, err := newTCAttacher(o, log)
	if err != nil {
		return err
	}
	defer tc.close()
	fe, be := w.Counts()
	log.Info("BPF programs attached", zap.Int("restoredFrontends", fe), zap.Int("restoredBackends", be))

	m := metrics.New(ipFamily)
	m.SetProxyMode(o.proxyMode)
	m.Registry().MustRegister(newBPFCollector(l, w))
	health, err := healthcheck.NewProxyHealthServer(o.healthzBindAddress, 2*o.syncPeriod, m, healthcheck.WithLogger(log))
	if err != nil {
		return err
	}

	tr := tracker.New(nodeName, model.DefaultOptions)
	if err := startSource(ctx, o, nodeName, tr, m, health, log); err != nil {
		return err
	}

	errc := make(chan error, 2)
	if o.healthzBindAddress != "" {
		go serve(ctx, "healthz", o.healthzBindAddress, health.Handler(), o.bindAddrHardFail, errc, log)
	}
	if o.metricsBindAddress != "" {
		go serve(ctx, "metrics", o.metricsBindAddress, metrics.NewServerMux(m, o.proxyMode), o.bindAddrHardFail, errc, log)
	}

	var term *sockterm.Terminator
	if o.terminateSockets {
		if term, err = sockterm.New(sockterm.Config{Translated: maps.SockTranslated(l.Objects.Sock4RevnatV1), Logger: log.Named("sockterm")}); err != nil {
			return err
		}
	}
	dp := newBPFDataplane(w, term, m.Registry(), log)
	dp.prepare = tc.prepare
	if term != nil {
		go dp.run(ctx)
	}

	p := proxier.New(proxier.Config{MinSyncPeriod: o.minSyncPeriod, SyncPeriod: o.syncPeriod, IPFamily: ipFamily}, tr, dp, m, health, log)
	done := make(chan struct{})
	go func() {
		p.Run(ctx)
		close(done)
	}()
	select {
	case err := <-errc:
		return err
	case <-done:
	}
	log.Info("stopping; BPF programs stay attached and keep serving until the next agent adopts them")
	return nil
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
