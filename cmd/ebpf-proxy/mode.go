package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxier"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sockterm"
)

// Proxy modes (--proxy-mode); /proxyMode serves the one in use.
const (
	modeAuto     = "auto"
	modeEBPF     = "ebpf"
	modeIPTables = iptables.Name
	modeIPVS     = ipvs.Name
)

// Why a mode was chosen: the reason label of ebpfproxy_proxy_mode and the
// "reason" key of the log line. A fixed set of words; the log line's
// "detail" carries the errors behind them.
const (
	reasonConfigured     = "configured"      // --proxy-mode named the mode
	reasonBPFSupported   = "bpf-supported"   // auto: the probes passed and the programs loaded
	reasonBPFUnsupported = "bpf-unsupported" // auto: the kernel lacks a BPF feature the programs need
	reasonBPFLoadFailed  = "bpf-load-failed" // auto: the probes passed but loading or attaching failed
	// Appended to the above when auto falls through to iptables.
	reasonIPVSUnavailable = ",ipvs-unavailable" // the ip_vs module does not load
	reasonIPVSFailed      = ",ipvs-failed"      // IPVS is there but the dataplane could not start
)

// testBPFFailureEnv makes the BPF dataplane fail at start-up, for the
// tests of the fallback (test/modes), since no test can make a real kernel
// lack a BPF feature or reject a program on demand. "probe" makes the
// feature probe fail, "load" makes loading fail after the probe passed (as
// a verifier rejection would). Nothing but tests sets it.
const testBPFFailureEnv = "EBPF_PROXY_TEST_BPF_FAILURE"

// errForced is the failure testBPFFailureEnv asks for.
var errForced = errors.New("forced by " + testBPFFailureEnv)

// dataplane is the chosen dataplane and what comes with it.
type dataplane struct {
	proxier.Dataplane
	// mode is the proxy mode, reason why it was chosen.
	mode, reason string
	// removeLeftovers removes what the other modes left on the node; it
	// runs once, after the first sync, so that the node is never without
	// Services between two modes (make before break).
	removeLeftovers func(ctx context.Context) error
	// run, if set, is work the dataplane does in the background.
	run func(ctx context.Context)
	// close releases handles; what is programmed stays and keeps serving.
	close func()
}

// newDataplane starts the dataplane --proxy-mode asks for. Under auto it
// tries ebpf, then ipvs, then iptables, and a dataplane that fails to
// start makes way for the next; a named mode that fails is an error.
func newDataplane(ctx context.Context, o *options, m *metrics.Metrics, log *zap.Logger) (*dataplane, error) {
	switch o.proxyMode {
	case modeEBPF:
		if err := probeBPF(); err != nil {
			return nil, err
		}
		return startBPF(o, m, log, reasonConfigured)
	case modeIPTables:
		return startIPTables(ctx, o, m, log, reasonConfigured)
	case modeIPVS:
		return startIPVS(ctx, o, m, log, reasonConfigured)
	case modeAuto:
	default:
		return nil, fmt.Errorf("unknown --proxy-mode %q", o.proxyMode)
	}

	var reason string
	var details []zap.Field
	if err := probeBPF(); err != nil {
		reason = reasonBPFUnsupported
		details = append(details, zap.NamedError("bpf", err))
	} else {
		dp, err := startBPF(o, m, log, reasonBPFSupported)
		if err == nil {
			logChoice(log, dp, details)
			return dp, nil
		}
		reason = reasonBPFLoadFailed
		details = append(details, zap.NamedError("bpf", err))
	}
	if err := ipvs.Available(""); err != nil {
		reason += reasonIPVSUnavailable
		details = append(details, zap.NamedError("ipvs", err))
	} else {
		dp, err := startIPVS(ctx, o, m, log, reason)
		if err == nil {
			logChoice(log, dp, details)
			return dp, nil
		}
		reason += reasonIPVSFailed
		details = append(details, zap.NamedError("ipvs", err))
	}
	dp, err := startIPTables(ctx, o, m, log, reason)
	if err != nil {
		return nil, fmt.Errorf("no proxy mode can run here: iptables: %w", err)
	}
	logChoice(log, dp, details)
	return dp, nil
}

func logChoice(log *zap.Logger, dp *dataplane, details []zap.Field) {
	fields := append([]zap.Field{zap.String("mode", dp.mode), zap.String("reason", dp.reason)}, details...)
	if dp.mode == modeEBPF {
		log.Info("proxy mode chosen", fields...)
		return
	}
	log.Warn("proxy mode chosen: the BPF dataplane cannot run on this node", fields...)
}

// probeBPF checks, with real probe programs, that the kernel can run the
// socket load balancer. cgroup v2 is checked where the programs attach
// (startBPF), since the agent mounts it when the node has none mounted.
func probeBPF() error {
	if os.Getenv(testBPFFailureEnv) == "probe" {
		return fmt.Errorf("%w: %w", loader.ErrUnsupported, errForced)
	}
	_, err := loader.Probe()
	return err
}

// startBPF loads and attaches the BPF programs, adopting those an earlier
// agent pinned, and restores the maps' state.
func startBPF(o *options, m *metrics.Metrics, log *zap.Logger, reason string) (*dataplane, error) {
	cgroupPath := o.cgroupPath
	if cgroupPath == "" {
		var err error
		if cgroupPath, err = defaultCgroupPath(); err != nil {
			return nil, fmt.Errorf("find the cgroup v2 root: %w", err)
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(cgroupPath, &fs); err != nil {
		return nil, fmt.Errorf("cgroup path %s: %w", cgroupPath, err)
	} else if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("%w: cgroup path %s is not on a cgroup v2 filesystem", loader.ErrUnsupported, cgroupPath)
	}
	if os.Getenv(testBPFFailureEnv) == "load" {
		return nil, fmt.Errorf("load BPF programs: %w", errForced)
	}
	// Loading replaces running programs in place; a failure here leaves the
	// programs of an earlier agent attached and serving.
	// The agent runs in the node's network namespace (hostNetwork).
	nodeNetns, err := loader.NetnsCookie()
	if err != nil {
		return nil, err
	}
	l, err := loader.Load(loader.Config{BPFFSPath: o.bpffsPath, CgroupPath: cgroupPath, Sizes: o.mapSizes, NodeNetnsCookie: nodeNetns})
	if err != nil {
		return nil, fmt.Errorf("load BPF programs: %w", err)
	}
	km := maps.KernelMaps(&l.Objects.SockMaps)
	km.Maglev = maps.KernelMaglev(l.Maglev.Tables, l.Maglev.Fingerprints, l.Maglev.Table)
	w, err := maps.NewWriter(km, maps.Limits{Backends: l.Sizes.Backends, RevNat: l.Sizes.RevNat})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("restore state from pinned maps: %w", err)
	}
	var term *sockterm.Terminator
	if o.terminateSockets {
		if term, err = sockterm.New(sockterm.Config{Translated: maps.SockTranslated(l.Objects.Sock4RevnatV1), Logger: log.Named("sockterm")}); err != nil {
			l.Close()
			return nil, err
		}
	}
	if !l.Features.SetRetval {
		log.Warn("kernel lacks bpf_set_retval in cgroup programs: connections to Services without endpoints fail with EPERM instead of ECONNREFUSED")
	}
	tc, err := newTCAttacher(o, m, log)
	if err != nil {
		l.Close()
		return nil, err
	}
	fe, be := w.Counts()
	log.Info("BPF programs attached", zap.String("cgroupPath", cgroupPath), zap.String("bpffsPath", o.bpffsPath),
		zap.Int("restoredFrontends", fe), zap.Int("restoredBackends", be))

	m.Registry().MustRegister(newBPFCollector(l, w))
	bpf := newBPFDataplane(w, term, m.Registry(), log)
	bpf.prepare = tc.prepare
	bpf.ranges = &sourceRangeCheck{set: l.SetSourceRangeCheck, on: l.SourceRangeCheck, log: log}
	dp := &dataplane{Dataplane: bpf, mode: modeEBPF, reason: reason, close: func() { tc.close(); l.Close() },
		removeLeftovers: func(ctx context.Context) error {
			// Our iptables chains (every back end) first, then IPVS's
			// virtual servers, ipsets and dummy interface.
			return ipvs.Cleanup(ctx, "")
		}}
	if term != nil {
		dp.run = bpf.run
	}
	return dp, nil
}

// startIPTables prepares the iptables dataplane in the agent's namespace.
func startIPTables(ctx context.Context, o *options, m *metrics.Metrics, log *zap.Logger, reason string) (*dataplane, error) {
	if o.nodePortPrimary {
		return nil, fmt.Errorf("--nodeport-addresses=primary is supported in ebpf mode only; give the node's IP as a /32")
	}
	local, err := o.localDetector()
	if err != nil {
		return nil, err
	}
	d, err := iptables.New(ctx, iptables.Config{
		ClusterCIDR:       o.clusterPrefix,
		LocalDetector:     local,
		MasqueradeAll:     o.masqueradeAll,
		MasqueradeBit:     int(o.masqueradeBit),
		NodePortAddresses: o.nodePortPrefixes,
		Logger:            log.Named("iptables"),
		Metrics:           &m.FamilyMetrics,
	})
	if err != nil {
		return nil, err
	}
	return &dataplane{Dataplane: d, mode: modeIPTables, reason: reason, close: func() {},
		removeLeftovers: func(ctx context.Context) error {
			// The first sync replaced the IPVS mode's chains in our back
			// end; its ipsets are free to go now.
			return errors.Join(
				d.CleanupOtherBackends(ctx),
				ipvs.RemoveLeftovers(ctx, ""),
				loader.CleanupXDP(o.bpffsPath), loader.Cleanup(o.bpffsPath), loader.CleanupTC(),
			)
		}}, nil
}

// startIPVS prepares the IPVS dataplane in the agent's namespace.
func startIPVS(ctx context.Context, o *options, m *metrics.Metrics, log *zap.Logger, reason string) (*dataplane, error) {
	if o.nodePortPrimary {
		return nil, fmt.Errorf("--nodeport-addresses=primary is supported in ebpf mode only; give the node's IP as a /32")
	}
	local, err := o.localDetector()
	if err != nil {
		return nil, err
	}
	var exclude []netip.Prefix
	for _, c := range o.ipvsExcludeCIDRs {
		if p, err := netip.ParsePrefix(strings.TrimSpace(c)); err == nil && p.Addr().Is4() {
			exclude = append(exclude, p.Masked())
		}
	}
	d, err := ipvs.New(ctx, ipvs.Config{
		Scheduler:         o.ipvsScheduler,
		ClusterCIDR:       o.clusterPrefix,
		LocalDetector:     local,
		ExcludeCIDRs:      exclude,
		MasqueradeAll:     o.masqueradeAll,
		MasqueradeBit:     int(o.masqueradeBit),
		NodePortAddresses: o.nodePortPrefixes,
		TCPTimeout:        o.ipvsTCPTimeout,
		TCPFinTimeout:     o.ipvsTCPFinTimeout,
		UDPTimeout:        o.ipvsUDPTimeout,
		Logger:            log.Named("ipvs"),
		Metrics:           &m.FamilyMetrics,
	})
	if err != nil {
		return nil, err
	}
	return &dataplane{Dataplane: d, mode: modeIPVS, reason: reason, close: d.Close,
		removeLeftovers: func(ctx context.Context) error {
			// The first sync replaced the iptables mode's chains in our
			// back end.
			return errors.Join(d.CleanupOtherBackends(ctx), loader.CleanupXDP(o.bpffsPath), loader.Cleanup(o.bpffsPath), loader.CleanupTC())
		}}, nil
}

// cleanupAll is --cleanup: it removes what every mode created, BPF first
// so that no program keeps translating to backends whose rules are gone.
func cleanupAll(ctx context.Context, o *options, log *zap.Logger) error {
	var errs []error
	if err := errors.Join(loader.CleanupXDP(o.bpffsPath), loader.Cleanup(o.bpffsPath), loader.CleanupTC()); err != nil {
		errs = append(errs, fmt.Errorf("BPF programs and maps: %w", err))
	} else {
		log.Info("removed every pinned BPF program and map", zap.String("bpffsPath", o.bpffsPath))
	}
	if err := ipvs.Cleanup(ctx, ""); err != nil {
		errs = append(errs, fmt.Errorf("iptables chains and IPVS configuration: %w", err))
	} else {
		log.Info("removed every iptables chain, IPVS virtual server, ipset and interface of ours")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}

// localDetector is --detect-local-mode for the fallback dataplanes. The
// zero detector with ClusterCIDR (or its default) lets them use
// --cluster-cidr.
func (o *options) localDetector() (xtables.LocalDetector, error) {
	switch o.detectLocalMode {
	case detectLocalBridgeInterface:
		return xtables.LocalDetector{Bridge: o.podBridgeInterface}, nil
	case detectLocalInterfaceNamePrefix:
		return xtables.LocalDetector{InterfacePrefix: o.podInterfacePrefix}, nil
	case detectLocalNodeCIDR:
		return xtables.LocalDetector{}, fmt.Errorf("--detect-local-mode=NodeCIDR is not supported in iptables and ipvs mode: use ClusterCIDR with --cluster-cidr, BridgeInterface or InterfaceNamePrefix")
	}
	return xtables.LocalDetector{}, nil
}
