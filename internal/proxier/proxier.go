// Package proxier is the one sync loop: it waits until the sources have
// delivered their initial lists, batches changes, hands each dataplane the
// new State with the set of changed ServicePorts, retries failures with a
// full sync and backoff, runs a periodic full sync, and records kube-proxy's
// sync metrics and health once for every dataplane.
package proxier

import (
	"context"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// Health is the part of the proxier health server the loop reports to.
type Health interface {
	QueuedUpdate(ipFamily string)
	Updated(ipFamily string)
}

// Observer is told every update a dataplane applied: the health check
// node ports (healthcheck.ServiceHealthServer) and the local API
// (internal/api) serve what is programmed from it.
type Observer interface {
	Sync(up model.Update)
}

// Config tunes the loop.
type Config struct {
	// MinSyncPeriod is the least time between two syncs; changes arriving
	// sooner are batched into the next one. 0 syncs as soon as a change
	// arrives (a sync writes only what changed, so this is cheap).
	MinSyncPeriod time.Duration
	// SyncPeriod is the interval of the periodic full sync and the longest
	// backoff after a failure.
	SyncPeriod time.Duration
	// IPFamily is the metric label and health key, "IPv4" or "IPv6": a
	// dual-stack node runs one loop per family, as kube-proxy runs one
	// proxier per family. Empty means IPv4.
	IPFamily string
	// ServiceHealth, if set, gets every update after the dataplane applied
	// it, whatever the dataplane: as in kube-proxy, the health check node
	// ports report what is programmed, not what is merely known.
	ServiceHealth Observer
	// Applied, if set, is told every update the dataplane applied, after
	// ServiceHealth: the local API (internal/api) serves what is
	// programmed from it.
	Applied Observer
	// LocalAddrs, if set, lists the node's interface addresses before
	// every sync: --nodeport-addresses selects among them (the tracker
	// resolves State.Node.NodePorts), so that an address the node gains
	// gets NodePorts at the next sync, as in kube-proxy.
	LocalAddrs func() ([]netip.Addr, error)
}

// Proxier runs the sync loop.
type Proxier struct {
	cfg     Config
	tr      *tracker.Tracker
	dp      dataplane.Dataplane
	metrics *metrics.Metrics
	// fam are the metrics bound to the loop's IP family.
	fam     *metrics.FamilyMetrics
	health  Health
	log     *zap.Logger
	now     func() time.Time
	started time.Time

	// noLocal remembers which ServicePorts lack local endpoints under a
	// Local policy, so that the gauges are kept without a full scan.
	noLocalInternal map[model.ServicePortName]bool
	noLocalExternal map[model.ServicePortName]bool

	synced chan struct{}
	// unprogrammed are the trigger times of updates whose sync failed:
	// their changes are programmed by the retry, which observes them.
	unprogrammed []time.Time

	// afterSync, set only by tests, runs when a sync that reached the
	// dataplane has recorded everything it records (metrics, health).
	afterSync func()
}

// New returns a sync loop feeding dp from tr.
func New(cfg Config, tr *tracker.Tracker, dp dataplane.Dataplane, m *metrics.Metrics, h Health, log *zap.Logger) *Proxier {
	if cfg.IPFamily == "" {
		cfg.IPFamily = "IPv4"
	}
	if cfg.SyncPeriod <= 0 {
		cfg.SyncPeriod = 30 * time.Second
	}
	return &Proxier{
		cfg: cfg, tr: tr, dp: dp, metrics: m, fam: m.Family(cfg.IPFamily), health: h, log: log.With(zap.String("ipFamily", cfg.IPFamily)),
		now: time.Now, started: time.Now(),
		noLocalInternal: map[model.ServicePortName]bool{},
		noLocalExternal: map[model.ServicePortName]bool{},
		synced:          make(chan struct{}),
	}
}

// FirstSync is closed after the first successful sync.
func (p *Proxier) FirstSync() <-chan struct{} { return p.synced }

// Run syncs until ctx is done. Nothing is programmed until both Services and
// EndpointSlices have synced: a partial view would delete what is not yet
// known.
func (p *Proxier) Run(ctx context.Context) {
	for !p.tr.Synced() {
		select {
		case <-ctx.Done():
			return
		case <-p.tr.Notify():
		}
	}
	p.log.Info("sources synced, starting sync loop", zap.String("mode", p.dp.Name()))
	p.health.Updated(p.cfg.IPFamily)
	p.fam.SyncProxyRulesLastQueuedTimestamp.SetToCurrentTime()

	needFull := true
	backoff := time.Duration(0)
	var lastSync time.Time
	periodic := time.NewTimer(p.cfg.SyncPeriod)
	defer periodic.Stop()
	for {
		if wait := p.cfg.MinSyncPeriod - p.now().Sub(lastSync); !lastSync.IsZero() && wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		lastSync = p.now()
		if p.syncOnce(needFull) {
			needFull = false
			backoff = 0
			resetTimer(periodic, p.cfg.SyncPeriod)
		} else {
			needFull = true
			backoff = min(max(2*backoff, time.Second), p.cfg.SyncPeriod)
			resetTimer(periodic, backoff)
		}

		select {
		case <-ctx.Done():
			return
		case <-p.tr.Notify():
			p.queued()
		case <-periodic.C:
			needFull = true
		}
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

func (p *Proxier) queued() {
	p.health.QueuedUpdate(p.cfg.IPFamily)
	p.fam.SyncProxyRulesLastQueuedTimestamp.SetToCurrentTime()
	svcs, eps := p.tr.Pending()
	p.metrics.ServiceChangesPending.Set(float64(svcs))
	p.metrics.EndpointChangesPending.Set(float64(eps))
}

// syncOnce applies pending changes and reports whether the dataplane took
// them.
func (p *Proxier) syncOnce(full bool) bool {
	start := p.now()
	if p.cfg.LocalAddrs != nil {
		addrs, err := p.cfg.LocalAddrs()
		if err != nil {
			// The last addresses read stay in use.
			p.log.Warn("cannot list the node's addresses; NodePorts stay where they were", zap.Error(err))
		} else {
			p.tr.SetLocalAddrs(addrs)
		}
	}
	up := p.tr.Apply()
	up.Full = up.Full || full
	if len(p.unprogrammed) > 0 {
		up.TriggerTimes = append(p.unprogrammed, up.TriggerTimes...)
		p.unprogrammed = nil
	}
	p.metrics.ServiceChangesPending.Set(0)
	p.metrics.EndpointChangesPending.Set(0)
	p.metrics.ServiceChangesTotal.Add(float64(up.ServiceChanges))
	p.metrics.EndpointChangesTotal.Add(float64(up.EndpointChanges))
	if !up.Full && len(up.Changed) == 0 {
		// A wake-up whose changes were all folded into the previous sync,
		// or changes that cancel out: nothing to write, and what they
		// triggered is programmed.
		p.health.Updated(p.cfg.IPFamily)
		p.observeProgrammed(up.TriggerTimes)
		return true
	}

	err := p.dp.Sync(up)
	if p.afterSync != nil {
		defer p.afterSync()
	}
	elapsed := p.now().Sub(start)
	p.fam.SyncProxyRulesDuration.Observe(elapsed.Seconds())
	if up.Full {
		p.fam.SyncFullProxyRulesDuration.Observe(elapsed.Seconds())
	} else {
		p.fam.SyncPartialProxyRulesDuration.Observe(elapsed.Seconds())
	}
	p.updateNoLocal(up)
	if err != nil {
		p.unprogrammed = up.TriggerTimes
		p.metrics.SyncErrorsTotal.WithLabelValues(p.dp.Name()).Inc()
		p.log.Error("sync failed; retrying with a full sync", zap.String("mode", p.dp.Name()),
			zap.Bool("full", up.Full), zap.Int("changed", len(up.Changed)), zap.Error(err))
		return false
	}
	p.fam.SyncProxyRulesLastTimestamp.SetToCurrentTime()
	p.health.Updated(p.cfg.IPFamily)
	if p.cfg.ServiceHealth != nil {
		p.cfg.ServiceHealth.Sync(up)
	}
	if p.cfg.Applied != nil {
		p.cfg.Applied.Sync(up)
	}
	p.observeProgrammed(up.TriggerTimes)
	p.log.Debug("synced", zap.String("mode", p.dp.Name()), zap.Bool("full", up.Full),
		zap.Int("changed", len(up.Changed)), zap.Duration("elapsed", elapsed))
	select {
	case <-p.synced:
	default:
		close(p.synced)
		p.log.Info("first sync done", zap.Int("servicePorts", len(up.State.Services)), zap.Duration("elapsed", elapsed))
	}
	return true
}

// observeProgrammed observes the network programming latency of changes
// triggered at times, now programmed.
func (p *Proxier) observeProgrammed(times []time.Time) {
	now := p.now()
	for _, t := range times {
		// Changes older than the agent are the initial state, not latency.
		if t.After(p.started) {
			p.fam.NetworkProgrammingDuration.Observe(now.Sub(t).Seconds())
		}
	}
}

func (p *Proxier) updateNoLocal(up model.Update) {
	visit := func(spn model.ServicePortName) {
		svc := up.State.Services[spn]
		delete(p.noLocalInternal, spn)
		delete(p.noLocalExternal, spn)
		if svc == nil || !svc.Selection.HasAny || len(svc.Selection.Local) > 0 {
			return
		}
		if svc.Port.InternalPolicy == model.PolicyLocal {
			p.noLocalInternal[spn] = true
		}
		if svc.Port.ExternalPolicy == model.PolicyLocal && svc.Port.ExternallyAccessible() {
			p.noLocalExternal[spn] = true
		}
	}
	if up.Full {
		clear(p.noLocalInternal)
		clear(p.noLocalExternal)
		for spn := range up.State.Services {
			visit(spn)
		}
	} else {
		for spn := range up.Changed {
			visit(spn)
		}
	}
	p.fam.NoLocalEndpointsInternal.Set(float64(len(p.noLocalInternal)))
	p.fam.NoLocalEndpointsExternal.Set(float64(len(p.noLocalExternal)))
}
