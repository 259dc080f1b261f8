package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxier"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

func run(ctx context.Context, o *config.Options, log *zap.Logger) error {
	if o.Cleanup {
		return modes.Cleanup(ctx, o, log)
	}
	if err := modes.Validate(o); err != nil {
		return err
	}
	nodeName, err := k8swatch.NodeName(o.HostnameOverride)
	if err != nil {
		return err
	}
	log = log.With(zap.String("node", nodeName))
	applyOOMScoreAdj(o.OOMScoreAdj, log)
	if o.InitOnly {
		return modes.InitOnly(ctx, o, log)
	}
	log.Info("starting", zap.String("proxyMode", o.ProxyMode), zap.String("setting", o.ProxyModeSetting))

	client, watchClient, host, err := client(o)
	if err != nil {
		return err
	}
	fams, nodeFams := families(o, ctx, client, nodeName, log)
	m := metrics.New(fams[0])
	dp, err := modes.Start(ctx, o, proxymode.Config{Families: fams, NodeFamilies: nodeFams, Metrics: m}, log)
	if err != nil {
		return err
	}
	// Until the sync loops run, a failure undoes what this start
	// attached (never what it adopted from an earlier agent).
	serving := false
	defer func() {
		if serving {
			dp.Close()
		} else {
			dp.Abandon(log)
		}
	}()
	m.SetProxyMode(dp.Mode, dp.Reason)
	o.LogModeSetting(dp.Mode, dp.Reason, log)
	syncPeriod, minSyncPeriod := dp.SyncPeriod, dp.MinSyncPeriod
	health, err := healthcheck.NewProxyHealthServer(o.HealthzBindAddress, 2*syncPeriod, m, healthcheck.WithLogger(log))
	if err != nil {
		return err
	}

	topology := model.DefaultOptions
	topology.PreferSameNode = o.Gates.Enabled(config.GatePreferSameTrafficDistribution, topology.PreferSameNode)
	// One tracker and sync loop per IP family, as kube-proxy runs one
	// proxier per family; one source feeds them all.
	targets := make([]k8swatch.Target, len(dp.Families))
	for i, f := range dp.Families {
		targets[i] = k8swatch.Target{Family: v1.IPFamily(f.IPFamily), Tracker: tracker.New(nodeName, topology, dp.NodePorts(f.IPFamily))}
	}
	// The Node's IPs changing, or the Node going, ends the agent as it
	// ends kube-proxy 1.37: the sync loops stop, what they programmed
	// keeps serving, and the kubelet starts the agent again, which then
	// builds everything from the Node's new state.
	ctx, restart := context.WithCancelCause(ctx)
	defer restart(nil)
	nodeChanged := func(reason string) {
		restart(fmt.Errorf("%w: %s", errNodeChanged, reason))
	}
	var optedOut func([]netip.Addr)
	if dp.OptedOutPods != nil {
		optedOut = optOutApplier(ctx, dp.OptedOutPods, log)
	}
	if err := startSource(ctx, o, watchClient, host, nodeName, targets, m, health, nodeChanged, optedOut, log); err != nil {
		return err
	}

	errc := make(chan error, 3)
	if o.HealthzBindAddress != "" {
		go serve(ctx, "healthz", o.HealthzBindAddress, health.Handler(), o.BindAddrHardFail, errc, log)
	}
	if o.ProbeBindAddress != "" {
		// The kubelet's probes: the same answers as --healthz-bind-address,
		// on a port kube-proxy does not hold.
		go serve(ctx, "probe", o.ProbeBindAddress, health.Handler(), o.BindAddrHardFail, errc, log)
	}
	if o.MetricsBindAddress != "" {
		mux := metrics.NewServerMux(m, dp.Mode)
		if o.Profiling {
			metrics.InstallProfiling(mux)
		}
		go serve(ctx, "metrics", o.MetricsBindAddress, mux, o.BindAddrHardFail, errc, log)
	}
	served := make([]string, len(dp.Families))
	for i, f := range dp.Families {
		served[i] = f.IPFamily
	}
	svcHealth, err := newServiceHealthServers(ctx, o, nodeName, served, health, m, log)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range svcHealth {
			s.Close()
		}
	}()
	applied := api.NewState()
	if o.APISocket != "" {
		// dump's Service names, and the health that `ebpf-proxy probe`
		// (the DaemonSet's probes) reads; without it the node is served
		// all the same, and probes through it fail, which says so.
		if srv, err := api.Serve(o.APISocket, applied, health.Handler(), log); err != nil {
			log.Error("not serving the local API", zap.Error(err))
		} else {
			defer srv.Close()
		}
	}
	var wg sync.WaitGroup
	firstSyncs := make([]<-chan struct{}, len(dp.Families))
	for i, f := range dp.Families {
		cfg := proxier.Config{MinSyncPeriod: minSyncPeriod, SyncPeriod: syncPeriod, IPFamily: f.IPFamily,
			ServiceHealth: svcHealth[i], LocalAddrs: localAddrs, Applied: applied.Family(f.IPFamily)}
		p := proxier.New(cfg, targets[i].Tracker, f.Dataplane, m, health, log)
		firstSyncs[i] = p.FirstSync()
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Run(ctx)
		}()
	}
	serving = true
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	go func() {
		if !allClosed(ctx, firstSyncs) {
			return
		}
		// Every family's Services are programmed: what waits for the
		// agent to be ready (tests, an operator reading the log) waits
		// for this line, not for one family's "first sync done".
		fams := make([]string, len(dp.Families))
		for i, f := range dp.Families {
			fams[i] = f.IPFamily
		}
		log.Info("first sync done in every IP family", zap.Strings("ipFamilies", fams))
		dp.AfterFirstSync(ctx, log)
	}()
	select {
	case err := <-errc:
		return err
	case <-done:
	}
	if err := context.Cause(ctx); errors.Is(err, errNodeChanged) {
		log.Warn("stopping to start again, as kube-proxy does; what the dataplane programmed stays and keeps serving until the next agent adopts it",
			zap.String("mode", dp.Mode), zap.Error(err))
		return err
	}
	log.Info("stopping; what the dataplane programmed stays and keeps serving until the next agent adopts it", zap.String("mode", dp.Mode))
	return nil
}

// errNodeChanged ends the agent when its Node's IPs change or the Node is
// deleted (k8swatch.WatchOptions.NodeChanged).
var errNodeChanged = errors.New("the Node changed")

// serve runs a server until ctx ends; a failure to bind under
// --bind-address-hard-fail ends the agent through errc.
func serve(ctx context.Context, name, addr string, h http.Handler, hardFail bool, errc chan<- error, log *zap.Logger) {
	if err := metrics.Serve(ctx, name, addr, h, hardFail, log); err != nil {
		errc <- err
	}
}

// allClosed waits until every channel is closed (true) or ctx ends (false).
func allClosed(ctx context.Context, chans []<-chan struct{}) bool {
	for _, c := range chans {
		select {
		case <-ctx.Done():
			return false
		case <-c:
		}
	}
	return true
}

// applyOOMScoreAdj sets the agent's oom_score_adj; a refusal is logged, as
// kube-proxy does, not fatal.
func applyOOMScoreAdj(v int32, log *zap.Logger) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(int(v))), 0o644); err != nil {
		log.Info("cannot set oom_score_adj", zap.Int32("oomScoreAdj", v), zap.Error(err))
	}
}
