package main

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/conntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxier"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

func run(ctx context.Context, o *config.Options, log *zap.Logger) error {
	if o.Cleanup {
		return proxymode.Cleanup(ctx, o.BPFFSPath, log)
	}
	if err := o.Validate(); err != nil {
		return err
	}
	nodeName, err := k8swatch.NodeName(o.HostnameOverride)
	if err != nil {
		return err
	}
	log = log.With(zap.String("node", nodeName))
	applyOOMScoreAdj(o.OOMScoreAdj, log)
	if o.InitOnly {
		mode := proxymode.Guess(o.ProxyMode)
		log.Info("--init-only: applying the connection tracking settings, then exiting", zap.String("proxyMode", mode))
		return conntrack.Setup(conntrack.Node, o.Conntrack, mode != proxymode.EBPF, log)
	}
	log.Info("starting", zap.String("proxyMode", o.ProxyMode), zap.String("setting", o.ProxyModeSetting))

	client, watchClient, host, err := client(o)
	if err != nil {
		return err
	}
	fams, nodeFams := families(o, ctx, client, nodeName, log)
	m := metrics.New(fams[0])
	cfg := proxyModeConfig(o, m, fams)
	cfg.NodeFamilies = nodeFams
	dp, err := proxymode.Start(ctx, cfg, log)
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
	o.NoteIgnored(dp.Mode, log)
	if dp.Mode == proxymode.IPVS && o.IPVSStrictARP {
		if err := ipvs.ApplyStrictARP(sysctl.Default, log); err != nil {
			return err
		}
	}
	syncPeriod, minSyncPeriod := o.SyncPeriods(dp.Mode)
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
		targets[i] = k8swatch.Target{Family: v1.IPFamily(f.IPFamily), Tracker: tracker.New(nodeName, topology, o.NodePortsFor(dp.Mode, f.IPFamily))}
	}
	if err := startSource(ctx, o, watchClient, host, nodeName, targets, m, health, log); err != nil {
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
			ServiceHealth: svcHealth[i], LocalAddrs: proxymode.LocalAddrs, Applied: applied.Family(f.IPFamily)}
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
	go removeLeftovers(ctx, firstSyncs, dp, log)
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
		// After the first syncs: the fallbacks' rules have loaded
		// nf_conntrack by then, whose parameters exist only once it is.
		conntrack.Setup(conntrack.Node, o.Conntrack, dp.Mode != proxymode.EBPF, log) //nolint:errcheck // logged; the node keeps its own values
	}()
	select {
	case err := <-errc:
		return err
	case <-done:
	}
	log.Info("stopping; what the dataplane programmed stays and keeps serving until the next agent adopts it", zap.String("mode", dp.Mode))
	return nil
}

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

// removeLeftovers removes what other proxy modes left on the node once the
// first sync of every family has programmed every Service in this one.
func removeLeftovers(ctx context.Context, firstSyncs []<-chan struct{}, dp *proxymode.Started, log *zap.Logger) {
	if !allClosed(ctx, firstSyncs) {
		return
	}
	if err := dp.RemoveLeftovers(ctx); err != nil {
		log.Error("removing what other proxy modes left", zap.String("mode", dp.Mode), zap.Error(err))
		return
	}
	log.Info("removed what other proxy modes left", zap.String("mode", dp.Mode))
}

// proxyModeConfig is what the dataplanes take from the flags, for the IP
// families fams (primary first).
func proxyModeConfig(o *config.Options, m *metrics.Metrics, fams []string) proxymode.Config {
	local, localErr := localDetector(o)
	var exclude []netip.Prefix
	for _, c := range o.IPVSExcludeCIDRs {
		if p, err := netip.ParsePrefix(strings.TrimSpace(c)); err == nil {
			exclude = append(exclude, p.Masked())
		}
	}
	return proxymode.Config{
		Mode: o.ProxyMode, Metrics: m, Families: fams,
		FallbackUnsupported: localErr,
		BPF: bpf.Config{
			CgroupPath: o.CgroupPath, BPFFSPath: o.BPFFSPath, Sizes: o.MapSizes, TerminateSockets: o.TerminateSockets,
			Devices: o.Devices, TCAttach: o.TCAttach, XDP: o.XDP, ConntrackSize: o.ConntrackSize,
			SNATPorts: o.SNATPorts, SNATPortRangeForce: o.SNATPortRangeForce, Metrics: m,
		},
		NFTables: nftables.Config{
			ClusterCIDR: o.ClusterPrefixes[metrics.IPv4], LocalDetector: local, MasqueradeAll: o.MasqueradeAll,
			MasqueradeBit: int(o.MasqueradeBit), Metrics: m.Family(metrics.IPv4),
		},
		NFTables6: nftables.Config{
			ClusterCIDR: o.ClusterPrefixes[metrics.IPv6], LocalDetector: local, MasqueradeAll: o.MasqueradeAll,
			MasqueradeBit: int(o.MasqueradeBit), Metrics: m.Family(metrics.IPv6),
		},
		IPTables: iptables.Config{
			ClusterCIDR: o.ClusterPrefixes[metrics.IPv4], LocalDetector: local, MasqueradeAll: o.MasqueradeAll,
			MasqueradeBit: int(o.MasqueradeBit), Metrics: m.Family(metrics.IPv4),
		},
		IPTables6: iptables.Config{
			ClusterCIDR: o.ClusterPrefixes[metrics.IPv6], LocalDetector: local, MasqueradeAll: o.MasqueradeAll,
			MasqueradeBit: int(o.MasqueradeBit), Metrics: m.Family(metrics.IPv6),
		},
		IPVS: ipvs.Config{
			Scheduler: o.IPVSScheduler, ClusterCIDR: o.ClusterPrefixes[metrics.IPv4], LocalDetector: local, ExcludeCIDRs: exclude,
			MasqueradeAll: o.MasqueradeAll, MasqueradeBit: int(o.MasqueradeBit),
			TCPTimeout: o.IPVSTCPTimeout, TCPFinTimeout: o.IPVSTCPFinTimeout, UDPTimeout: o.IPVSUDPTimeout,
			Metrics: m.Family(metrics.IPv4),
		},
		IPVS6: ipvs.Config{
			Scheduler: o.IPVSScheduler, ClusterCIDR: o.ClusterPrefixes[metrics.IPv6], LocalDetector: local, ExcludeCIDRs: exclude,
			MasqueradeAll: o.MasqueradeAll, MasqueradeBit: int(o.MasqueradeBit),
			TCPTimeout: o.IPVSTCPTimeout, TCPFinTimeout: o.IPVSTCPFinTimeout, UDPTimeout: o.IPVSUDPTimeout,
			Metrics: m.Family(metrics.IPv6),
		},
	}
}

// localDetector is --detect-local-mode for the fallback dataplanes. The
// zero detector with ClusterCIDR (or its default) lets them use
// --cluster-cidr.
func localDetector(o *config.Options) (xtables.LocalDetector, error) {
	switch o.DetectLocalMode {
	case config.DetectLocalBridgeInterface:
		return xtables.LocalDetector{Bridge: o.PodBridgeInterface}, nil
	case config.DetectLocalInterfaceNamePrefix:
		return xtables.LocalDetector{InterfacePrefix: o.PodInterfacePrefix}, nil
	case config.DetectLocalNodeCIDR:
		return xtables.LocalDetector{}, fmt.Errorf("--detect-local-mode=NodeCIDR is not supported in nftables, iptables and ipvs mode: use ClusterCIDR with --cluster-cidr, BridgeInterface or InterfaceNamePrefix")
	}
	return xtables.LocalDetector{}, nil
}

// applyOOMScoreAdj sets the agent's oom_score_adj; a refusal is logged, as
// kube-proxy does, not fatal.
func applyOOMScoreAdj(v int32, log *zap.Logger) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(int(v))), 0o644); err != nil {
		log.Info("cannot set oom_score_adj", zap.Int32("oomScoreAdj", v), zap.Error(err))
	}
}
