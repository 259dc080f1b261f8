// Package proxymode chooses and starts the dataplane --proxy-mode asks
// for. Each dataplane package describes its mode with a mode.Mode (name,
// probe, start, what its cleanup removes, sync periods, steps after
// start); the agent registers them, in auto's order, as one Modes. Start runs the one
// asked for, or under "auto" the first the node can run (the choice, and
// why, is logged and exported); once it serves, AfterFirstSync removes
// what the other modes, and upstream kube-proxy once it has stopped, left
// on the node. Cleanup is --cleanup, which removes what every mode ever
// created (not kube-proxy's: kube-proxy --cleanup does that).
package proxymode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/mode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode/kubeproxy"
)

// ReasonConfigured is the reason of a mode --proxy-mode named: the reason
// label of ebpfproxy_proxy_mode and the "reason" key of the log line.
// Under auto the reason is the chosen mode's Reasons.Chosen where it was
// the first tried, else what made the ones before it make way, joined by
// commas (e.g. "bpf-load-failed,nftables-unavailable"): a fixed set of
// words; the log line's "detail" carries the errors behind them.
const ReasonConfigured = "configured"

// Modes are the registered modes, in the order auto tries them.
type Modes []mode.Mode

// find returns the mode of a name.
func (ms Modes) find(name string) (mode.Mode, bool) {
	i := slices.IndexFunc(ms, func(m mode.Mode) bool { return m.Name == name })
	if i < 0 {
		return mode.Mode{}, false
	}
	return ms[i], true
}

// Names lists the modes --proxy-mode takes, auto first.
func (ms Modes) Names() []string {
	names := []string{config.ProxyModeAuto}
	for _, m := range ms {
		names = append(names, m.Name)
	}
	return names
}

// NewOptions are the agent's settings before its flags: kube-proxy's
// defaults (config.Defaults) and every mode's own.
func (ms Modes) NewOptions() *config.Options {
	o := config.Defaults()
	for _, m := range ms {
		if m.Defaults != nil {
			m.Defaults(o)
		}
	}
	return o
}

// Validate checks the settings (config's Validate, which parses what the
// agent needs parsed), --proxy-mode, and every mode's own settings, as
// auto may choose any.
func (ms Modes) Validate(o *config.Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if _, ok := ms.find(o.ProxyMode); !ok && o.ProxyMode != config.ProxyModeAuto {
		return fmt.Errorf("unknown --proxy-mode %q: want %s", o.ProxyMode, quoted(ms.Names()))
	}
	for _, m := range ms {
		if m.Validate == nil {
			continue
		}
		if err := m.Validate(o); err != nil {
			return err
		}
	}
	return nil
}

// quoted is names as "'a', 'b' or 'c'".
func quoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "'" + n + "'"
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// Config is what Start needs besides the options.
type Config struct {
	// Families are the IP families to serve, primary first; empty means
	// IPv4 alone.
	Families []string
	// NodeFamilies are the families the node has addresses of: what a
	// mode leaves out of another family is logged as information, not as
	// a warning.
	NodeFamilies []string
	// Metrics receives the modes' metrics, ebpfproxy_kube_proxy_leftovers
	// and ebpfproxy_kube_proxy_leftovers_removed_total; nil gives a
	// registry of its own.
	Metrics *metrics.Metrics
	// KubeProxyInterval is how often AfterFirstSync's watch looks again
	// for a running kube-proxy; kubeproxy.DefaultInterval if zero.
	KubeProxyInterval time.Duration
}

// Started is the chosen mode's running dataplanes and what comes with
// them.
type Started struct {
	*mode.Instance
	// Mode is the proxy mode, Reason why it was chosen.
	Mode, Reason string
	// SyncPeriod and MinSyncPeriod are the sync loop's periods in the
	// mode.
	SyncPeriod, MinSyncPeriod time.Duration

	desc    mode.Mode
	modes   Modes
	options *config.Options
	cfg     Config
}

// NodePorts returns where NodePorts are served for an IP family in the
// running mode.
func (s *Started) NodePorts(family string) model.NodePortSpec {
	if s.desc.NodePorts != nil {
		return s.desc.NodePorts(s.options, family)
	}
	return s.options.NodePorts[family]
}

// Close releases handles; what is programmed stays and keeps serving until
// the next agent adopts it.
func (s *Started) Close() {
	if s.Instance.Close != nil {
		s.Instance.Close()
	}
}

// Abandon is Close for a start that failed before the agent served: what
// the start attached and pinned on a node that had none of it is removed,
// so that a failed start never leaves a half-made node; what it adopted
// from an earlier agent keeps serving, untouched. It logs what it did.
func (s *Started) Abandon(log *zap.Logger) {
	s.Close()
	if s.Undo == nil {
		return
	}
	if err := s.Undo(); err != nil {
		log.Error("removing what the failed start attached", zap.String("mode", s.Mode), zap.Error(err))
		return
	}
	log.Info("removed what the failed start attached", zap.String("mode", s.Mode))
}

// AfterFirstSync is what follows the first sync of every family: it
// applies the node's connection tracking settings (the fallbacks' rules
// have loaded nf_conntrack by then, whose parameters exist only once it
// is), in a mode without netfilter keeps connection tracking running for
// the connections netfilter translated before it (nfconntrack.Keep),
// removes what the other modes left on the node (each mode's Remove,
// the last registered first, the running mode's own for what it no longer
// serves), and starts a goroutine that removes upstream kube-proxy's
// leftovers once no kube-proxy process runs on the node, checking again
// periodically until that is done or ctx ends (kubeproxy.Watch). Call it
// once, after the first syncs, so that the node is never without Services
// between two modes or between kube-proxy and us (make before break). It
// logs what it did.
func (s *Started) AfterFirstSync(ctx context.Context, log *zap.Logger) {
	nfconntrack.Setup(nfconntrack.Node, s.options.Conntrack, s.desc.Netfilter, log) //nolint:errcheck // logged; the node keeps its own values
	if !s.desc.Netfilter {
		// Before kube-proxy's rules or a fallback's go: the connections
		// they translated are the kernel's to carry on (bpf/lib/nfct.h).
		keep := nfconntrack.KeepConfig{Logger: log.Named("conntrack-handover")}
		if s.cfg.Metrics != nil {
			keep.Held = s.cfg.Metrics.ConntrackHandoverConnections
		}
		if _, err := nfconntrack.Keep(ctx, keep); err != nil {
			log.Error("keeping connection tracking running for the connections netfilter translated: once the rules that made them are removed they may break", zap.Error(err))
		}
	}
	running := &mode.Running{Mode: s.Mode, Uses: s.Uses}
	for _, f := range s.Families {
		running.Families = append(running.Families, f.IPFamily)
	}
	var errs []error
	for _, m := range slices.Backward(s.modes) {
		if m.Remove != nil {
			errs = append(errs, m.Remove(ctx, s.options, running))
		}
	}
	if err := errors.Join(errs...); err != nil {
		log.Error("removing what other proxy modes left", zap.String("mode", s.Mode), zap.Error(err))
	} else {
		log.Info("removed what other proxy modes left", zap.String("mode", s.Mode))
	}
	kp := kubeproxy.Config{Interval: s.cfg.KubeProxyInterval, Logger: log.Named("kube-proxy-leftovers")}
	if s.cfg.Metrics != nil {
		kp.Present = s.cfg.Metrics.KubeProxyLeftovers
		kp.Removed = s.cfg.Metrics.KubeProxyLeftoversRemovedTotal
	}
	go kubeproxy.Watch(ctx, kp)
}

// Start starts the dataplane o.ProxyMode asks for. Under auto it tries the
// modes marked Auto in order (a mode whose probe fails or whose start
// fails makes way for the next), except that a start failing with an
// error marked Final is an error, as in every mode; a named mode that
// fails is an error. Then it logs the settings without effect in the mode
// and runs the mode's steps after start.
func (ms Modes) Start(ctx context.Context, o *config.Options, cfg Config, log *zap.Logger) (*Started, error) {
	if len(cfg.Families) == 0 {
		cfg.Families = []string{metrics.IPv4}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(cfg.Families[0])
	}
	for i, f := range cfg.Families {
		if !metrics.ValidIPFamily(f) || slices.Contains(cfg.Families[:i], f) {
			return nil, fmt.Errorf("IP families %v: want IPv4, IPv6 or both, once each", cfg.Families)
		}
	}
	s, err := ms.start(ctx, o, cfg, log)
	if err != nil {
		return nil, err
	}
	for _, f := range cfg.Families[1:] {
		if why := s.Skipped[f]; why != nil {
			logFor(log, cfg.NodeFamilies, f)("not serving an IP family: its Services' addresses of that family are not translated",
				zap.String("ipFamily", f), zap.String("mode", s.Mode), zap.Error(why))
		}
	}
	s.SyncPeriod, s.MinSyncPeriod = s.desc.SyncPeriods(o)
	o.NoteIgnored(s.Mode, log)
	if s.desc.Ignored != nil {
		s.desc.Ignored(o, log)
	}
	if s.desc.AfterStart != nil {
		if err := s.desc.AfterStart(o, log); err != nil {
			s.Abandon(log)
			return nil, err
		}
	}
	return s, nil
}

// handover lists what of the modes other than running must go the moment
// running's first sync of a family is written (mode.Mode.Handover), and
// returns what removes it then, and logs it. What cannot be listed is left
// to the removal after every family's first sync (AfterFirstSync).
func (ms Modes) handover(ctx context.Context, running string, log *zap.Logger) func(family string) {
	type handover struct {
		mode   string
		remove func(family string) (int, error)
	}
	var hs []handover
	for _, m := range ms {
		if m.Name == running || m.Handover == nil {
			continue
		}
		remove, err := m.Handover(ctx)
		if err != nil {
			log.Warn("cannot list what of another mode goes at the first sync; it goes after every family's first sync",
				zap.String("mode", m.Name), zap.Error(err))
			continue
		}
		hs = append(hs, handover{m.Name, remove})
	}
	return func(family string) {
		for _, h := range hs {
			n, err := h.remove(family)
			if err != nil {
				log.Error("removing at the first sync what of another mode would break new connections",
					zap.String("mode", h.mode), zap.String("ipFamily", family), zap.Error(err))
			}
			if n > 0 {
				log.Info("removed at the first sync what of another mode would break new connections",
					zap.String("mode", h.mode), zap.String("ipFamily", family), zap.Int("removed", n))
			}
		}
	}
}

func (ms Modes) start(ctx context.Context, o *config.Options, cfg Config, log *zap.Logger) (*Started, error) {
	run := func(m mode.Mode, reason string) (*Started, error) {
		mlog := log
		if m.Name != dataplane.EBPF {
			mlog = log.Named(m.Name)
		}
		in, err := m.Start(ctx, mode.Env{Options: o, Families: cfg.Families, NodeFamilies: cfg.NodeFamilies, Metrics: cfg.Metrics, Logger: mlog,
			Written: ms.handover(ctx, m.Name, log)})
		if err != nil {
			return nil, err
		}
		return &Started{Instance: in, Mode: m.Name, Reason: reason, desc: m, modes: ms, options: o, cfg: cfg}, nil
	}
	if o.ProxyMode != config.ProxyModeAuto {
		m, ok := ms.find(o.ProxyMode)
		if !ok {
			return nil, fmt.Errorf("unknown --proxy-mode %q", o.ProxyMode)
		}
		if m.Probe != nil {
			// A named mode says first what the node lacks for it.
			if err := m.Probe(ctx); err != nil {
				return nil, err
			}
		}
		return run(m, ReasonConfigured)
	}

	var reasons []string
	var details []zap.Field
	last := errors.New("no mode to try")
	for _, m := range ms {
		if !m.Auto {
			continue
		}
		if m.Probe != nil {
			if err := m.Probe(ctx); err != nil {
				reasons = append(reasons, m.Reasons.Unsupported)
				details = append(details, zap.NamedError(m.Reasons.Key, err))
				last = fmt.Errorf("%s: %w", m.Name, err)
				continue
			}
		}
		reason := m.Reasons.Chosen
		if len(reasons) > 0 {
			reason = strings.Join(reasons, ",")
		}
		s, err := run(m, reason)
		if err == nil {
			logChoice(log, s, details)
			return s, nil
		}
		var final *mode.FinalError
		if errors.As(err, &final) {
			return nil, fmt.Errorf("--proxy-mode=auto does not fall back to another mode %w", final.Err)
		}
		reasons = append(reasons, m.Reasons.Failed)
		details = append(details, zap.NamedError(m.Reasons.Key, err))
		last = fmt.Errorf("%s: %w", m.Name, err)
	}
	return nil, fmt.Errorf("no proxy mode can run here: %w", last)
}

// Guess returns the mode Start would pick, by the probes alone: for
// --init-only, which starts no dataplane.
func (ms Modes) Guess(ctx context.Context, name string) (mode.Mode, bool) {
	if name != config.ProxyModeAuto {
		return ms.find(name)
	}
	for _, m := range ms {
		if m.Auto && (m.Probe == nil || m.Probe(ctx) == nil) {
			return m, true
		}
	}
	return mode.Mode{}, false
}

// InitOnly is --init-only: it applies the node's connection tracking
// settings for the mode Start would pick, and starts nothing.
func (ms Modes) InitOnly(ctx context.Context, o *config.Options, log *zap.Logger) error {
	m, ok := ms.Guess(ctx, o.ProxyMode)
	if !ok {
		return fmt.Errorf("--init-only: no proxy mode can run here")
	}
	log.Info("--init-only: applying the connection tracking settings, then exiting", zap.String("proxyMode", m.Name))
	return nfconntrack.Setup(nfconntrack.Node, o.Conntrack, m.Netfilter, log)
}

// Cleanup is --cleanup: it removes what every mode created, in the order
// of Modes (BPF first, so that no program keeps translating to backends
// whose rules are gone).
func (ms Modes) Cleanup(ctx context.Context, o *config.Options, log *zap.Logger) error {
	var errs []error
	for _, m := range ms {
		if m.Remove == nil {
			continue
		}
		if err := m.Remove(ctx, o, nil); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
			continue
		}
		log.Info("removed what the mode creates", zap.String("mode", m.Name))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}

func logChoice(log *zap.Logger, s *Started, details []zap.Field) {
	fields := append([]zap.Field{zap.String("mode", s.Mode), zap.String("reason", s.Reason)}, details...)
	if s.Mode == dataplane.EBPF {
		log.Info("proxy mode chosen", fields...)
		return
	}
	log.Warn("proxy mode chosen: the BPF dataplane cannot run on this node", fields...)
}

// logFor returns the level to say what a mode leaves out of family at: a
// warning where the node has addresses of the family, else information.
func logFor(log *zap.Logger, nodeFamilies []string, family string) func(string, ...zap.Field) {
	if slices.Contains(nodeFamilies, family) {
		return log.Warn
	}
	return log.Info
}
