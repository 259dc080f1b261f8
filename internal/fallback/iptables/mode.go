package iptables

import (
	"context"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/mode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
)

// Mode is the iptables dataplane as a proxy mode: auto's last resort.
var Mode = mode.Mode{
	Name:      Name,
	Auto:      true,
	Netfilter: true,
	Start:     start,
	Remove:    remove,
	SyncPeriods: func(o *config.Options) (time.Duration, time.Duration) {
		return o.IPTablesSyncPeriod, o.IPTablesMinSync
	},
}

// start prepares the iptables dataplanes in the agent's namespace, one
// per family.
func start(ctx context.Context, env mode.Env) (*mode.Instance, error) {
	ds, in, err := mode.PerFamily(env.Families, func(f string) (*Dataplane, error) {
		n, err := xtables.NetfilterFrom(env.Options, f, env.Metrics, env.Logger)
		if err != nil {
			return nil, err
		}
		return New(ctx, Config{Netfilter: n})
	})
	if err != nil {
		return nil, err
	}
	in.Uses = xtables.ToolNames(ds)
	env.Metrics.Registry().MustRegister(NewInvalidDropCollector(env.Logger, ds...), NewLocalhostCollector(env.Logger, ds...))
	return in, nil
}

// remove removes our chains of every back end, but those the running mode
// writes with (the iptables and ipvs modes' first syncs replaced them).
func remove(ctx context.Context, _ *config.Options, running *mode.Running) error {
	var uses []string
	if running != nil {
		uses = running.Uses
	}
	return xtables.CleanupAll(ctx, "", Prefix, xtables.Keeping(uses))
}
