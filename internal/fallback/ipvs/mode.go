package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/mode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// Mode is the IPVS dataplane as a proxy mode: only when named, as
// kube-proxy's.
var Mode = mode.Mode{
	Name:      Name,
	Netfilter: true,
	Validate: func(o *config.Options) error {
		if o.IPVSScheduler != "" && !slices.Contains(Schedulers, o.IPVSScheduler) {
			return fmt.Errorf("--ipvs-scheduler=%s: want one of %s", o.IPVSScheduler, strings.Join(Schedulers, ", "))
		}
		return nil
	},
	Start:  start,
	Remove: remove,
	Handover: func(ctx context.Context) (func(string) (int, error), error) {
		return Handover(ctx, "")
	},
	SyncPeriods: func(o *config.Options) (time.Duration, time.Duration) {
		return o.IPVSSyncPeriod, o.IPVSMinSync
	},
	AfterStart: func(o *config.Options, log *zap.Logger) error {
		if !o.IPVSStrictARP {
			return nil
		}
		return ApplyStrictARP(sysctl.Default, log)
	},
}

// ConfigFrom is the IPVS dataplane's configuration of an IP family from
// the agent's settings.
func ConfigFrom(o *config.Options, family string, m *metrics.Metrics, log *zap.Logger) (Config, error) {
	n, err := xtables.NetfilterFrom(o, family, m, log)
	if err != nil {
		return Config{}, err
	}
	var exclude []netip.Prefix
	for _, c := range o.IPVSExcludeCIDRs {
		if p, err := netip.ParsePrefix(strings.TrimSpace(c)); err == nil {
			exclude = append(exclude, p.Masked())
		}
	}
	return Config{Netfilter: n, Scheduler: o.IPVSScheduler, ExcludeCIDRs: exclude,
		TCPTimeout: o.IPVSTCPTimeout, TCPFinTimeout: o.IPVSTCPFinTimeout, UDPTimeout: o.IPVSUDPTimeout}, nil
}

// start prepares the IPVS dataplanes in the agent's namespace, one per
// family.
func start(ctx context.Context, env mode.Env) (*mode.Instance, error) {
	ds, in, err := mode.PerFamily(env.Families, func(f string) (*Dataplane, error) {
		cfg, err := ConfigFrom(env.Options, f, env.Metrics, env.Logger)
		if err != nil {
			return nil, err
		}
		return New(ctx, cfg)
	})
	if err != nil {
		return nil, err
	}
	in.Uses = xtables.ToolNames(ds)
	in.Close = func() {
		for _, d := range ds {
			d.Close()
		}
	}
	return in, nil
}

// remove removes our virtual servers, ipsets and dummy interface, and the
// chains that reference them, where a mode without iptables chains runs
// and for --cleanup (Cleanup). Where the iptables mode or the IPVS mode
// runs, their first syncs replaced the chains in the back ends they write
// with: the other back ends' chains go first (an ipset that a rule
// references cannot be destroyed), then what the IPVS mode made (the
// iptables mode) or made for a family it no longer serves (the IPVS
// mode).
func remove(ctx context.Context, _ *config.Options, running *mode.Running) error {
	if running == nil || len(running.Uses) == 0 {
		return Cleanup(ctx, "")
	}
	errs := []error{xtables.CleanupAll(ctx, "", xtables.Prefix, xtables.Keeping(running.Uses))}
	if running.Mode != Name {
		return errors.Join(append(errs, RemoveLeftovers(ctx, ""))...)
	}
	for _, f := range []string{metrics.IPv4, metrics.IPv6} {
		if !running.Serves(f) {
			errs = append(errs, RemoveFamilyLeftovers(ctx, "", f == metrics.IPv6))
		}
	}
	return errors.Join(errs...)
}
