package iptables

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// Name is the proxy mode this dataplane implements.
const Name = dataplane.IPTables

// Dataplane writes the model to iptables. It implements dataplane.Dataplane.
// It is not safe for concurrent use: the sync loop is its only caller.
type Dataplane struct {
	cfg    Config
	runner *xtables.Runner
	plan   *planner
	// ct deletes the UDP conntrack entries each sync made stale.
	ct *nfconntrack.Cleaner
	// synced is false until the first full sync succeeded; needRead
	// makes the next sync read our chains from the kernel again (after
	// a failure, the kernel may hold more or less than we think).
	synced, needRead bool
}

// New prepares the iptables dataplane for the namespace in cfg: it picks
// the back end, reads which of our chains already exist (an earlier agent's
// or another mode's, to be replaced or removed by the first sync, which is
// always full) and writes nothing. It fails when no iptables back end works.
func New(ctx context.Context, cfg Config) (*Dataplane, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("iptables dataplane: %w", err)
	}
	backend, err := xtables.DetectFamily(ctx, cfg.Netns, cfg.Backend, cfg.IPv6)
	if err != nil {
		return nil, fmt.Errorf("iptables dataplane: %w", err)
	}
	d := &Dataplane{
		cfg:    cfg,
		runner: &xtables.Runner{Backend: backend, Netns: cfg.Netns},
		plan:   newPlanner(&cfg),
		ct:     cfg.conntrackCleaner(),
	}
	d.plan.dropInvalid = !sysctl.TCPBeLiberal(cfg.Netns)
	d.plan.r.cfg = &d.cfg
	if err := d.read(ctx); err != nil {
		return nil, fmt.Errorf("iptables dataplane: %w", err)
	}
	cfg.Logger.Info("iptables dataplane ready", zap.String("ipFamily", cfg.family().name), zap.String("backend", backend.Name),
		zap.String("restore", backend.Restore), zap.Int("existingChains", len(d.plan.kernel["nat"])+len(d.plan.kernel["filter"])))
	return d, nil
}

// Name returns "iptables".
func (d *Dataplane) Name() string { return Name }

// Backend returns the iptables back end in use ("legacy" or "nft").
func (d *Dataplane) Backend() string { return d.runner.Backend.Name }

// read learns which of our chains the kernel holds.
func (d *Dataplane) read(ctx context.Context) error {
	d.plan.strayJumps = nil
	for _, table := range xtables.Tables {
		own, err := xtables.ReadOwned(ctx, d.runner, table, Prefix)
		if err != nil {
			return err
		}
		d.plan.kernel[table] = own.Chains
		for _, j := range own.Jumps {
			// Built-in chains are put right by EnsureHooks.
			if !isBuiltin(j.Table, j.Chain) {
				d.plan.strayJumps = append(d.plan.strayJumps, j)
			}
		}
	}
	d.needRead = false
	return nil
}

func isBuiltin(table, chain string) bool {
	for _, c := range xtables.Builtin[table] {
		if c == chain {
			return true
		}
	}
	return false
}

// Sync applies up with one iptables-restore run.
//
// Once the rules are written, the UDP conntrack entries that the change
// made stale are deleted (nfconntrack.Cleaner); a failure to delete them is
// logged and does not fail the sync.
//
// A full sync (up.Full) reconciles: every ServicePort is rendered and only
// those whose rules changed, appeared or went away are written, after
// checking that the built-in chains still jump to ours (if not, someone
// flushed them, and everything is rewritten). Everything is rewritten, and
// our chains that nothing wants are deleted, on the first sync and after a
// failure. Otherwise only up.Changed is rewritten.
//
// On failure the kernel keeps, per table, either the old or the new rules
// (each table commits atomically), the failure is counted in
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total, and the next
// sync re-reads our chains and rewrites everything.
func (d *Dataplane) Sync(up model.Update) error {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
	defer cancel()
	rewrite := !d.synced || d.needRead
	if d.needRead {
		if err := d.read(ctx); err != nil {
			return fmt.Errorf("iptables sync: %w", err)
		}
	}
	if up.Full && !rewrite {
		intact, err := xtables.HooksIntact(ctx, d.runner, Prefix, hooks())
		if err != nil {
			return fmt.Errorf("iptables sync: %w", err)
		}
		if !intact {
			d.cfg.Logger.Warn("jumps to our chains are missing from the built-in chains; rewriting all rules")
			rewrite = true
		}
	}
	if np := &up.State.Node.NodePorts; !np.Equal(&d.plan.r.nodePorts) {
		if np.Localhost && !d.cfg.IPv6 {
			if err := d.setRouteLocalnet(); err != nil {
				return fmt.Errorf("iptables sync: %w", err)
			}
		}
		// The static rules that lead to the NodePorts change.
		rewrite = true
		d.plan.r.nodePorts = *np
	}
	d.plan.r.nodeIPs = nil
	for _, a := range d.cfg.NodeIPs {
		if d.cfg.inFamily(a) {
			d.plan.r.nodeIPs = append(d.plan.r.nodeIPs, a)
		}
	}
	if len(d.plan.r.nodeIPs) == 0 {
		d.plan.r.nodeIPs = up.State.Node.Addrs
	}
	d.plan.r.comments = countEndpoints(up.State) <= largeClusterEndpoints

	var pl *plan
	switch {
	case rewrite:
		var err error
		pl, err = d.plan.full(up.State, func(tx *xtables.Transaction) error {
			return xtables.EnsureHooks(ctx, d.runner, Prefix, hooks(), tx)
		})
		if err != nil {
			d.needRead = true
			return fmt.Errorf("iptables sync: %w", err)
		}
	case up.Full:
		pl = d.plan.reconcile(up.State)
	default:
		pl = d.plan.partial(up)
	}
	if !pl.tx.Empty() {
		if err := d.runner.Restore(ctx, pl.tx.Bytes()); err != nil {
			d.needRead = true
			if m := d.cfg.Metrics; m != nil {
				m.IPTablesRestoreFailuresTotal.Inc()
				if !rewrite {
					m.IPTablesPartialRestoreFailuresTotal.Inc()
				}
			}
			return fmt.Errorf("iptables sync (%s, rewrite=%t, full=%t, %d changed): %w", d.runner.Backend, rewrite, up.Full, len(up.Changed), err)
		}
	}
	d.plan.commit(pl)
	d.synced = true
	// The rules are in place: a flow whose entry goes now is translated
	// again by them at its next datagram.
	d.ct.Synced(up)
	if m := d.cfg.Metrics; m != nil {
		for _, table := range []string{"filter", "nat"} {
			m.IPTablesRulesTotal.WithLabelValues(table).Set(float64(d.plan.total[table]))
			m.IPTablesRulesLast.WithLabelValues(table).Set(float64(pl.tx.Rules(table)))
		}
	}
	return nil
}

// conntrackCleaner returns the Cleaner of the dataplane's namespace and
// family.
func (c *Config) conntrackCleaner() *nfconntrack.Cleaner {
	return nfconntrack.NewCleaner(nfconntrack.CleanerConfig{Netns: c.Netns, IPv6: c.IPv6, Logger: c.Logger, Metrics: c.Metrics})
}

func countEndpoints(s *model.State) int {
	n := 0
	for _, svc := range s.Services {
		n += len(svc.Endpoints)
	}
	return n
}

// Cleanup removes every chain named with Prefix, and every jump to one,
// from the filter, nat and mangle tables of the namespace at netns ("" for the
// caller's), with every iptables and ip6tables back end that is installed
// and holds any. It removes what the iptables dataplanes of both IP
// families and the IPVS dataplane create, so that a start in any mode and
// --cleanup leave nothing of another mode. Where nothing of ours exists it
// only reads (see xtables.Holding).
func Cleanup(ctx context.Context, netns string) error {
	return xtables.CleanupAll(ctx, netns, Prefix, nil)
}

// Tools returns the iptables tools (back end and IP family) d writes with.
func (d *Dataplane) Tools() xtables.Backend { return d.runner.Backend }

// CleanupOtherBackends is Cleanup for every back end of d's IP family but
// the one d uses: an agent that starts in iptables mode calls it after its
// first sync, which has replaced whatever an earlier agent left in d's own
// back end. The other family's tools are left alone: on a dual-stack node
// they are the other family's dataplane's.
func (d *Dataplane) CleanupOtherBackends(ctx context.Context) error {
	return xtables.CleanupAll(ctx, d.cfg.Netns, Prefix, xtables.OtherBackends(d.runner.Backend))
}
