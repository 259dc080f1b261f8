// Package proxymode chooses and starts the dataplane --proxy-mode asks
// for: the BPF dataplane, or a fallback where the kernel cannot run it
// (the choice under "auto", and why, is logged and exported), and removes
// what the other modes, and upstream kube-proxy once it has stopped, left
// on the node. It also implements --cleanup, which removes what every mode
// ever created (not kube-proxy's: kube-proxy --cleanup does that).
package proxymode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/kubeproxy"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nodeaddrs"
)

// Proxy modes (--proxy-mode); /proxyMode serves the one in use.
const (
	Auto     = "auto"
	EBPF     = bpf.Name
	IPTables = iptables.Name
	IPVS     = ipvs.Name
)

// Why a mode was chosen: the reason label of ebpfproxy_proxy_mode and the
// "reason" key of the log line. A fixed set of words; the log line's
// "detail" carries the errors behind them.
const (
	ReasonConfigured     = "configured"      // --proxy-mode named the mode
	ReasonBPFSupported   = "bpf-supported"   // auto: the probes passed and the programs loaded
	ReasonBPFUnsupported = "bpf-unsupported" // auto: the kernel lacks a BPF feature the programs need
	ReasonBPFLoadFailed  = "bpf-load-failed" // auto: the probes passed but loading or attaching failed
	// Appended to the above when auto falls through to iptables.
	ReasonIPVSUnavailable = ",ipvs-unavailable" // the ip_vs module does not load
	ReasonIPVSFailed      = ",ipvs-failed"      // IPVS is there but the dataplane could not start
)

// Config is what every mode needs; each dataplane takes its own part.
type Config struct {
	// Mode is --proxy-mode: one of Modes.
	Mode string
	// FallbackUnsupported, if set, is why the flags rule out the fallback
	// dataplanes (a --detect-local-mode they lack): they fail with it.
	FallbackUnsupported error
	// BPF, IPTables and IPVS configure the dataplanes. Their loggers and
	// metrics are set by Start.
	BPF      bpf.Config
	IPTables iptables.Config
	IPVS     ipvs.Config
	// Metrics receives ebpfproxy_kube_proxy_leftovers and
	// ebpfproxy_kube_proxy_leftovers_removed_total; nil for none.
	Metrics *metrics.Metrics
	// KubeProxyInterval is how often RemoveLeftovers's watch looks again
	// for a running kube-proxy; kubeproxy.DefaultInterval if zero.
	KubeProxyInterval time.Duration
}

// Started is the chosen dataplane and what comes with it.
type Started struct {
	dataplane.Dataplane
	// Mode is the proxy mode, Reason why it was chosen.
	Mode, Reason string
	// removeLeftovers removes what the other modes left on the node.
	removeLeftovers func(ctx context.Context) error
	// kubeProxy configures the removal of kube-proxy's leftovers.
	kubeProxy kubeproxy.Config
	// close releases handles; what is programmed stays and keeps serving.
	close func()
}

// RemoveLeftovers removes what the other modes left on the node, then
// starts a goroutine that removes upstream kube-proxy's leftovers once no
// kube-proxy process runs on the node, checking again periodically until
// that is done or ctx ends (kubeproxy.Watch). Call it once, after the
// first sync, so that the node is never without Services between two
// modes or between kube-proxy and us (make before break). The error is
// the other modes' only; the watch logs its own.
func (s *Started) RemoveLeftovers(ctx context.Context) error {
	err := s.removeLeftovers(ctx)
	go kubeproxy.Watch(ctx, s.kubeProxy)
	return err
}

// Close releases handles; what is programmed stays and keeps serving until
// the next agent adopts it.
func (s *Started) Close() { s.close() }

// Start starts the dataplane cfg.Mode asks for. Under auto it tries ebpf,
// then ipvs, then iptables, and a dataplane that fails to start makes way
// for the next, except ebpf failing with loader.ErrPinnedMapMismatch (pinned
// maps of a layout it cannot migrate), which is an error as in every mode;
// a named mode that fails is an error.
func Start(ctx context.Context, cfg Config, log *zap.Logger) (*Started, error) {
	s, err := start(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	s.kubeProxy = kubeproxy.Config{Interval: cfg.KubeProxyInterval, Logger: log.Named("kube-proxy-leftovers")}
	if cfg.Metrics != nil {
		s.kubeProxy.Present = cfg.Metrics.KubeProxyLeftovers
		s.kubeProxy.Removed = cfg.Metrics.KubeProxyLeftoversRemovedTotal
	}
	return s, nil
}

func start(ctx context.Context, cfg Config, log *zap.Logger) (*Started, error) {
	cfg.BPF.Logger = log
	cfg.IPTables.Logger = log.Named("iptables")
	cfg.IPVS.Logger = log.Named("ipvs")
	switch cfg.Mode {
	case EBPF:
		if err := bpf.Probe(); err != nil {
			return nil, err
		}
		return startBPF(ctx, cfg, ReasonConfigured)
	case IPTables:
		return startIPTables(ctx, cfg, ReasonConfigured)
	case IPVS:
		return startIPVS(ctx, cfg, ReasonConfigured)
	case Auto:
	default:
		return nil, fmt.Errorf("unknown --proxy-mode %q", cfg.Mode)
	}

	var reason string
	var details []zap.Field
	if err := bpf.Probe(); err != nil {
		reason = ReasonBPFUnsupported
		details = append(details, zap.NamedError("bpf", err))
	} else {
		s, err := startBPF(ctx, cfg, ReasonBPFSupported)
		if err == nil {
			logChoice(log, s, details)
			return s, nil
		}
		if errors.Is(err, loader.ErrPinnedMapMismatch) {
			// An earlier agent's maps that this one can neither adopt
			// nor migrate: an upgrade problem to fix, not a kernel
			// that cannot run BPF. Falling back would move the node to
			// another dataplane and, after its first sync, remove the
			// pinned maps and every id in them. Refuse, as kube-proxy
			// refuses a broken configuration; the old programs keep
			// serving meanwhile.
			return nil, fmt.Errorf("--proxy-mode=auto does not fall back to IPVS or iptables over pinned maps it cannot migrate: %w", err)
		}
		reason = ReasonBPFLoadFailed
		details = append(details, zap.NamedError("bpf", err))
	}
	if err := ipvs.Available(""); err != nil {
		reason += ReasonIPVSUnavailable
		details = append(details, zap.NamedError("ipvs", err))
	} else {
		s, err := startIPVS(ctx, cfg, reason)
		if err == nil {
			logChoice(log, s, details)
			return s, nil
		}
		reason += ReasonIPVSFailed
		details = append(details, zap.NamedError("ipvs", err))
	}
	s, err := startIPTables(ctx, cfg, reason)
	if err != nil {
		return nil, fmt.Errorf("no proxy mode can run here: iptables: %w", err)
	}
	logChoice(log, s, details)
	return s, nil
}

// Guess returns the mode Start would pick, by the probes alone: for
// --init-only, which starts no dataplane.
func Guess(mode string) string {
	if mode != Auto {
		return mode
	}
	if bpf.Probe() != nil {
		return IPTables
	}
	return EBPF
}

func logChoice(log *zap.Logger, s *Started, details []zap.Field) {
	fields := append([]zap.Field{zap.String("mode", s.Mode), zap.String("reason", s.Reason)}, details...)
	if s.Mode == EBPF {
		log.Info("proxy mode chosen", fields...)
		return
	}
	log.Warn("proxy mode chosen: the BPF dataplane cannot run on this node", fields...)
}

func startBPF(ctx context.Context, cfg Config, reason string) (*Started, error) {
	d, err := bpf.New(ctx, cfg.BPF)
	if err != nil {
		return nil, err
	}
	return &Started{Dataplane: d, Mode: EBPF, Reason: reason, close: d.Close,
		removeLeftovers: func(ctx context.Context) error {
			// Our iptables chains (every back end) first, then IPVS's
			// virtual servers, ipsets and dummy interface.
			return ipvs.Cleanup(ctx, "")
		}}, nil
}

// startIPTables prepares the iptables dataplane in the agent's namespace.
func startIPTables(ctx context.Context, cfg Config, reason string) (*Started, error) {
	if cfg.FallbackUnsupported != nil {
		return nil, cfg.FallbackUnsupported
	}
	d, err := iptables.New(ctx, cfg.IPTables)
	if err != nil {
		return nil, err
	}
	bpffs := cfg.BPF.BPFFSPath
	return &Started{Dataplane: d, Mode: IPTables, Reason: reason, close: func() {},
		removeLeftovers: func(ctx context.Context) error {
			// The first sync replaced the IPVS mode's chains in our back
			// end; its ipsets are free to go now.
			return errors.Join(d.CleanupOtherBackends(ctx), ipvs.RemoveLeftovers(ctx, ""), cleanupBPF(bpffs))
		}}, nil
}

// startIPVS prepares the IPVS dataplane in the agent's namespace.
func startIPVS(ctx context.Context, cfg Config, reason string) (*Started, error) {
	if cfg.FallbackUnsupported != nil {
		return nil, cfg.FallbackUnsupported
	}
	d, err := ipvs.New(ctx, cfg.IPVS)
	if err != nil {
		return nil, err
	}
	bpffs := cfg.BPF.BPFFSPath
	return &Started{Dataplane: d, Mode: IPVS, Reason: reason, close: d.Close,
		removeLeftovers: func(ctx context.Context) error {
			// The first sync replaced the iptables mode's chains in our
			// back end.
			return errors.Join(d.CleanupOtherBackends(ctx), cleanupBPF(bpffs))
		}}, nil
}

// cleanupBPF detaches and unpins every BPF program and map of ours.
func cleanupBPF(bpffsPath string) error {
	return errors.Join(loader.CleanupXDP(bpffsPath), loader.Cleanup(bpffsPath), loader.CleanupTC())
}

// Cleanup is --cleanup: it removes what every mode created, BPF first so
// that no program keeps translating to backends whose rules are gone.
func Cleanup(ctx context.Context, bpffsPath string, log *zap.Logger) error {
	var errs []error
	if err := cleanupBPF(bpffsPath); err != nil {
		errs = append(errs, fmt.Errorf("BPF programs and maps: %w", err))
	} else {
		log.Info("removed every pinned BPF program and map", zap.String("bpffsPath", bpffsPath))
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

// LocalAddrs lists the node's interface addresses, among which
// --nodeport-addresses selects, for the sync loop to read before every
// sync. The IPVS mode's dummy interface holds Service addresses, never
// node addresses, whatever the mode in use.
func LocalAddrs() ([]netip.Addr, error) { return nodeaddrs.Local(ipvs.DummyName) }
