// Package proxymode chooses and starts the dataplane --proxy-mode asks
// for: the BPF dataplane, or a fallback (nftables, iptables, ipvs) where
// the kernel cannot run it (the choice under "auto", and why, is logged
// and exported), and removes
// what the other modes, and upstream kube-proxy once it has stopped, left
// on the node. It also implements --cleanup, which removes what every mode
// ever created (not kube-proxy's: kube-proxy --cleanup does that).
package proxymode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/kubeproxy"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
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
	NFTables = nftables.Name
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
	ReasonNFTablesUnavailable = ",nftables-unavailable" // nft or the kernel's nf_tables do not work
	ReasonNFTablesFailed      = ",nftables-failed"      // nftables works but the dataplane could not start
)

// Config is what every mode needs; each dataplane takes its own part.
type Config struct {
	// Mode is --proxy-mode: one of Modes.
	Mode string
	// FallbackUnsupported, if set, is why the flags rule out the fallback
	// dataplanes (a --detect-local-mode they lack): they fail with it.
	FallbackUnsupported error
	// Families are the IP families to serve, primary first (metrics.IPv4,
	// metrics.IPv6); empty means IPv4 alone. A mode serves the primary
	// family or fails (under auto, makes way for the next); a secondary
	// family it cannot serve is left out with one log line, as kube-proxy
	// runs single-stack where iptables lacks a family.
	Families []string
	// NodeFamilies are the families the node has addresses of: what a
	// mode leaves out of another family is logged as information, not as
	// a warning.
	NodeFamilies []string
	// BPF, NFTables, IPTables and IPVS configure the dataplanes. Their
	// loggers and metrics are set by Start.
	BPF      bpf.Config
	NFTables nftables.Config
	IPTables iptables.Config
	IPVS     ipvs.Config
	// NFTables6, IPTables6 and IPVS6 configure the IPv6 nftables, iptables
	// and IPVS dataplanes (their IPv6 is set by Start, their loggers are
	// those of the IPv4 ones).
	NFTables6 nftables.Config
	IPTables6 iptables.Config
	IPVS6     ipvs.Config
	// Metrics receives ebpfproxy_kube_proxy_leftovers and
	// ebpfproxy_kube_proxy_leftovers_removed_total; nil for none.
	Metrics *metrics.Metrics
	// KubeProxyInterval is how often RemoveLeftovers's watch looks again
	// for a running kube-proxy; kubeproxy.DefaultInterval if zero.
	KubeProxyInterval time.Duration
}

// Family is the dataplane of one IP family.
type Family struct {
	// IPFamily is metrics.IPv4 or metrics.IPv6.
	IPFamily string
	dataplane.Dataplane
}

// Started is the chosen dataplane and what comes with it.
type Started struct {
	// Families are the dataplanes of the IP families served, primary
	// first: each gets its own sync loop.
	Families []Family
	// Skipped are the secondary families the mode cannot serve, with why.
	Skipped map[string]error
	// Mode is the proxy mode, Reason why it was chosen.
	Mode, Reason string
	// removeLeftovers removes what the other modes left on the node.
	removeLeftovers func(ctx context.Context) error
	// kubeProxy configures the removal of kube-proxy's leftovers.
	kubeProxy kubeproxy.Config
	// close releases handles; what is programmed stays and keeps serving.
	close func()
	// undo removes what the start attached and pinned on a node that had
	// none of it; nil when there is nothing to remove (it adopted an
	// earlier agent's pins, or the mode writes nothing before its first
	// sync).
	undo func() error
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

// Abandon is Close for a start that failed before the agent served: what
// the start attached and pinned on a node that had none of it is removed,
// so that a failed start never leaves a half-made node; what it adopted
// from an earlier agent keeps serving, untouched. It logs what it did.
func (s *Started) Abandon(log *zap.Logger) {
	s.close()
	if s.undo == nil {
		return
	}
	if err := s.undo(); err != nil {
		log.Error("removing what the failed start attached", zap.String("mode", s.Mode), zap.Error(err))
		return
	}
	log.Info("removed what the failed start attached", zap.String("mode", s.Mode))
}

// Start starts the dataplane cfg.Mode asks for. Under auto it tries ebpf,
// then nftables where nft and the kernel's nf_tables work, then iptables
// (ipvs runs only when named), and a dataplane that fails to start makes
// way for the next, except ebpf failing with loader.ErrPinnedMapMismatch
// (pinned maps of a layout it cannot migrate), which is an error as in
// every mode; a named mode that fails is an error.
func Start(ctx context.Context, cfg Config, log *zap.Logger) (*Started, error) {
	if len(cfg.Families) == 0 {
		cfg.Families = []string{metrics.IPv4}
	}
	for i, f := range cfg.Families {
		if !metrics.ValidIPFamily(f) || slices.Contains(cfg.Families[:i], f) {
			return nil, fmt.Errorf("IP families %v: want IPv4, IPv6 or both, once each", cfg.Families)
		}
	}
	s, err := start(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	for _, f := range cfg.Families[1:] {
		if why := s.Skipped[f]; why != nil {
			cfg.logFor(log, f)("not serving an IP family: its Services' addresses of that family are not translated",
				zap.String("ipFamily", f), zap.String("mode", s.Mode), zap.Error(why))
		}
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
	cfg.NFTables.Logger = log.Named("nftables")
	switch cfg.Mode {
	case EBPF:
		if err := bpf.Probe(); err != nil {
			return nil, err
		}
		return startBPF(ctx, cfg, log, ReasonConfigured)
	case IPTables:
		return startIPTables(ctx, cfg, ReasonConfigured)
	case IPVS:
		return startIPVS(ctx, cfg, ReasonConfigured)
	case NFTables:
		return startNFTables(ctx, cfg, ReasonConfigured)
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
		s, err := startBPF(ctx, cfg, log, ReasonBPFSupported)
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
			return nil, fmt.Errorf("--proxy-mode=auto does not fall back to nftables or iptables over pinned maps it cannot migrate: %w", err)
		}
		reason = ReasonBPFLoadFailed
		details = append(details, zap.NamedError("bpf", err))
	}
	if err := nftables.Available(ctx, ""); err != nil {
		reason += ReasonNFTablesUnavailable
		details = append(details, zap.NamedError("nftables", err))
	} else {
		s, err := startNFTables(ctx, cfg, reason)
		if err == nil {
			logChoice(log, s, details)
			return s, nil
		}
		reason += ReasonNFTablesFailed
		details = append(details, zap.NamedError("nftables", err))
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
	if bpf.Probe() == nil {
		return EBPF
	}
	if nftables.Available(context.Background(), "") == nil {
		return NFTables
	}
	return IPTables
}

func logChoice(log *zap.Logger, s *Started, details []zap.Field) {
	fields := append([]zap.Field{zap.String("mode", s.Mode), zap.String("reason", s.Reason)}, details...)
	if s.Mode == EBPF {
		log.Info("proxy mode chosen", fields...)
		return
	}
	log.Warn("proxy mode chosen: the BPF dataplane cannot run on this node", fields...)
}

// logFor returns the level to say what a mode leaves out of family at: a
// warning where the node has addresses of the family, else information.
func (c Config) logFor(log *zap.Logger, family string) func(string, ...zap.Field) {
	if slices.Contains(c.NodeFamilies, family) {
		return log.Warn
	}
	return log.Info
}

// perFamily starts one dataplane per family of fams (primary first) with
// start, as the fallback modes run one per family like upstream's
// per-family proxiers. The primary family's failure is the error (after
// nothing was started); a secondary family that fails is left out, with
// why, in skipped.
func perFamily[D dataplane.Dataplane](fams []string, start func(family string) (D, error)) (ds []D, served []Family, skipped map[string]error, err error) {
	skipped = map[string]error{}
	for i, f := range fams {
		d, err := start(f)
		switch {
		case err != nil && i == 0:
			return nil, nil, nil, err
		case err != nil:
			skipped[f] = err
			continue
		}
		ds = append(ds, d)
		served = append(served, Family{IPFamily: f, Dataplane: d})
	}
	return ds, served, skipped, nil
}

func startBPF(ctx context.Context, cfg Config, log *zap.Logger, reason string) (*Started, error) {
	// A node without our pins gets everything from this start.
	fresh := !loader.Pinned(cfg.BPF.BPFFSPath)
	d, err := bpf.New(ctx, cfg.BPF)
	if err != nil {
		return nil, err
	}
	var undo func() error
	if fresh {
		undo = func() error { return cleanupBPF(cfg.BPF.BPFFSPath) }
	}
	var fams []Family
	for _, f := range cfg.Families {
		if f == metrics.IPv6 {
			log.Info("serving IPv6", zap.String("ipFamily", f))
			fams = append(fams, Family{IPFamily: f, Dataplane: d.IPv6()})
			continue
		}
		fams = append(fams, Family{IPFamily: f, Dataplane: d})
	}
	return &Started{Families: fams, Mode: EBPF, Reason: reason, close: d.Close, undo: undo,
		removeLeftovers: func(ctx context.Context) error {
			// IPVS's virtual servers, our iptables chains (every
			// back end), IPVS's ipsets and dummy interface
			// (ipvs.Cleanup, in that order: its closed connections
			// would capture the socket hooks' new ones from the same
			// ports), then our nftables tables.
			return errors.Join(ipvs.Cleanup(ctx, ""), nftables.Cleanup(ctx, ""))
		}}, nil
}

// startIPTables prepares the iptables dataplane in the agent's namespace.
func startIPTables(ctx context.Context, cfg Config, reason string) (*Started, error) {
	if cfg.FallbackUnsupported != nil {
		return nil, cfg.FallbackUnsupported
	}
	ds, fams, skipped, err := perFamily(cfg.Families, func(f string) (*iptables.Dataplane, error) {
		c := cfg.IPTables
		if f == metrics.IPv6 {
			c = cfg.IPTables6
			c.IPv6 = true
			c.Logger = cfg.IPTables.Logger
		}
		return iptables.New(ctx, c)
	})
	if err != nil {
		return nil, err
	}
	s := &Started{Families: fams, Skipped: skipped, Mode: IPTables, Reason: reason, close: func() {}}
	if cfg.Metrics != nil {
		cfg.Metrics.Registry().MustRegister(iptables.NewInvalidDropCollector(cfg.IPTables.Logger, ds...))
	}
	bpffs := cfg.BPF.BPFFSPath
	var used []xtables.Backend
	for _, d := range ds {
		used = append(used, d.Tools())
	}
	s.removeLeftovers = func(ctx context.Context) error {
		// The first syncs replaced the IPVS mode's chains in the back
		// ends in use, whose ipsets are free to go now; the others
		// (another back end's, or a family not served) go whole.
		return errors.Join(xtables.CleanupAll(ctx, "", xtables.Prefix, xtables.InUse(used...)),
			ipvs.RemoveLeftovers(ctx, ""), nftables.Cleanup(ctx, ""), cleanupBPF(bpffs))
	}
	return s, nil
}

// startIPVS prepares the IPVS dataplanes in the agent's namespace, one
// per family, as startIPTables does.
func startIPVS(ctx context.Context, cfg Config, reason string) (*Started, error) {
	if cfg.FallbackUnsupported != nil {
		return nil, cfg.FallbackUnsupported
	}
	ds, fams, skipped, err := perFamily(cfg.Families, func(f string) (*ipvs.Dataplane, error) {
		c := cfg.IPVS
		if f == metrics.IPv6 {
			c = cfg.IPVS6
			c.IPv6 = true
			c.Logger = cfg.IPVS.Logger
		}
		return ipvs.New(ctx, c)
	})
	if err != nil {
		return nil, err
	}
	var used []xtables.Backend
	served := map[string]bool{}
	for i, d := range ds {
		used = append(used, d.Tools())
		served[fams[i].IPFamily] = true
	}
	bpffs := cfg.BPF.BPFFSPath
	return &Started{Families: fams, Skipped: skipped, Mode: IPVS, Reason: reason,
		close: func() {
			for _, d := range ds {
				d.Close()
			}
		},
		removeLeftovers: func(ctx context.Context) error {
			// The first syncs replaced the iptables mode's chains in the
			// back ends in use; the other back ends, and those of a
			// family not served, go whole, and then the IPVS objects
			// an earlier agent left of a family not served.
			errs := []error{xtables.CleanupAll(ctx, "", xtables.Prefix, xtables.InUse(used...))}
			for _, f := range []string{metrics.IPv4, metrics.IPv6} {
				if !served[f] {
					errs = append(errs, ipvs.RemoveFamilyLeftovers(ctx, "", f == metrics.IPv6))
				}
			}
			return errors.Join(append(errs, nftables.Cleanup(ctx, ""), cleanupBPF(bpffs))...)
		}}, nil
}

// startNFTables prepares the nftables dataplanes in the agent's namespace,
// one per family (each its own table), as startIPTables does.
func startNFTables(ctx context.Context, cfg Config, reason string) (*Started, error) {
	if cfg.FallbackUnsupported != nil {
		return nil, cfg.FallbackUnsupported
	}
	_, fams, skipped, err := perFamily(cfg.Families, func(f string) (*nftables.Dataplane, error) {
		c := cfg.NFTables
		if f == metrics.IPv6 {
			c = cfg.NFTables6
			c.IPv6 = true
			c.Logger = cfg.NFTables.Logger
		}
		return nftables.New(ctx, c)
	})
	if err != nil {
		return nil, err
	}
	served := map[string]bool{}
	for _, f := range fams {
		served[f.IPFamily] = true
	}
	bpffs := cfg.BPF.BPFFSPath
	return &Started{Families: fams, Skipped: skipped, Mode: NFTables, Reason: reason, close: func() {},
		removeLeftovers: func(ctx context.Context) error {
			// The iptables and IPVS modes' chains (every back end),
			// virtual servers, ipsets and dummy interface, our table
			// of a family not served, and the BPF dataplane.
			errs := []error{ipvs.Cleanup(ctx, "")}
			for _, f := range []string{metrics.IPv4, metrics.IPv6} {
				if !served[f] {
					errs = append(errs, nftables.CleanupFamily(ctx, "", f == metrics.IPv6))
				}
			}
			return errors.Join(append(errs, cleanupBPF(bpffs))...)
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
	if err := nftables.Cleanup(ctx, ""); err != nil {
		errs = append(errs, fmt.Errorf("nftables tables: %w", err))
	} else {
		log.Info("removed our nftables tables", zap.String("table", nftables.TableName))
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
