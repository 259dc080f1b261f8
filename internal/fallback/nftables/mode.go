package nftables

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/mode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Mode is the nftables dataplane as a proxy mode: auto's choice where the
// BPF dataplane cannot run and nft and the kernel's nf_tables work.
var Mode = mode.Mode{
	Name:      Name,
	Auto:      true,
	Netfilter: true,
	Reasons:   mode.Reasons{Key: "nftables", Unsupported: "nftables-unavailable", Failed: "nftables-failed"},
	Probe:     func(ctx context.Context) error { return Available(ctx, "") },
	Start:     start,
	Remove:    remove,
	SyncPeriods: func(o *config.Options) (time.Duration, time.Duration) {
		return o.NFTablesPeriods()
	},
	NodePorts: nodePorts,
	Ignored: func(o *config.Options, log *zap.Logger) {
		xtables.NoteLocalhostNodePorts(o, Name, log)
	},
}

// nodePorts is --nodeport-addresses as config parsed it, except that an
// unset flag means "primary", as kube-proxy's nftables mode defaults it
// (every local address in the other modes, as kube-proxy's iptables and
// ipvs modes).
func nodePorts(o *config.Options, family string) model.NodePortSpec {
	if len(o.NodePortAddresses) == 0 {
		// "primary" always parses.
		s, _ := model.ParseNodePortSpec([]string{model.NodePortPrimary}, family == metrics.IPv6, o.LocalhostNodePorts)
		return s
	}
	return o.NodePorts[family]
}

// start prepares the nftables dataplanes in the agent's namespace, one per
// family, each its own table.
func start(ctx context.Context, env mode.Env) (*mode.Instance, error) {
	_, in, err := mode.PerFamily(env.Families, func(f string) (*Dataplane, error) {
		n, err := xtables.NetfilterFrom(env.Options, f, env.Metrics, env.Logger)
		if err != nil {
			return nil, err
		}
		return New(ctx, Config{Netfilter: n})
	})
	return in, err
}

// remove removes our tables, but those of the families the running
// nftables mode serves.
func remove(ctx context.Context, _ *config.Options, running *mode.Running) error {
	if running == nil || running.Mode != Name {
		return Cleanup(ctx, "")
	}
	var errs []error
	for _, f := range []string{metrics.IPv4, metrics.IPv6} {
		if !running.Serves(f) {
			errs = append(errs, CleanupFamily(ctx, "", f == metrics.IPv6))
		}
	}
	return errors.Join(errs...)
}
