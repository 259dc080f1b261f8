package bpf

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/mode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maglev"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
)

// Mode is the BPF dataplane as a proxy mode: auto's first choice.
var Mode = mode.Mode{
	Name: Name,
	Auto: true,
	Reasons: mode.Reasons{Key: "bpf", Chosen: "bpf-supported", Unsupported: "bpf-unsupported",
		Failed: "bpf-load-failed"},
	Defaults: func(o *config.Options) {
		o.XDP = loader.XDPOff
		o.BPFFSPath = loader.DefaultBPFFSPath
		// The other capacities are 0: sized by the agent (mapSizes).
		o.MapSizes = config.MapSizes{MaglevTable: loader.DefaultMapSizes.MaglevTable}
		o.MapMemoryRatio = loader.DefaultLRUMemoryRatio
		o.SNATPortRange = DefaultSNATPortRange.String()
		o.SocketLBScope = SocketLBAll
	},
	Validate: func(o *config.Options) error {
		if err := ValidateAttach(o.TCAttach, o.XDP); err != nil {
			return err
		}
		if _, err := ParsePortRange(o.SNATPortRange); err != nil {
			return fmt.Errorf("--nodeport-snat-port-range: %w", err)
		}
		if err := maglev.CheckSize(int(o.MapSizes.MaglevTable)); err != nil {
			return fmt.Errorf("--maglev-table-size: %w", err)
		}
		if err := loader.CheckLRUMemoryRatio(o.MapMemoryRatio); err != nil {
			return fmt.Errorf("--bpf-map-dynamic-size-ratio: %w", err)
		}
		return ValidateSocketLBScope(o.SocketLBScope)
	},
	Probe:  func(context.Context) error { return Probe() },
	Start:  start,
	Remove: remove,
	SyncPeriods: func(o *config.Options) (time.Duration, time.Duration) {
		return o.SyncPeriod, o.MinSyncPeriod
	},
	Ignored: func(o *config.Options, log *zap.Logger) {
		if o.DetectLocalMode != "" && o.DetectLocalMode != config.DetectLocalClusterCIDR {
			log.Info("--detect-local-mode has no effect in ebpf mode: the socket programs know every client on the node", zap.String("detectLocalMode", o.DetectLocalMode))
		}
	},
}

// ConfigFrom is the BPF dataplane's configuration from the agent's
// settings.
func ConfigFrom(o *config.Options, m *metrics.Metrics, log *zap.Logger) (Config, error) {
	snat, err := ParsePortRange(o.SNATPortRange)
	if err != nil {
		return Config{}, fmt.Errorf("--nodeport-snat-port-range: %w", err)
	}
	sizes := loader.MapSizes{Services: o.MapSizes.Services, Backends: o.MapSizes.Backends, RevNat: o.MapSizes.RevNat,
		SockRevNat: o.MapSizes.SockRevNat, Affinity: o.MapSizes.Affinity, MaglevTable: o.MapSizes.MaglevTable}
	return Config{
		CgroupPath: o.CgroupPath, BPFFSPath: o.BPFFSPath, Sizes: sizes, TerminateSockets: o.TerminateSockets,
		Devices: o.Devices, TCAttach: o.TCAttach, XDP: o.XDP, ConntrackSize: o.ConntrackSize,
		SNATPorts: snat, SNATPortRangeForce: o.SNATPortRangeForce, SocketLBScope: o.SocketLBScope, Metrics: m, Logger: log,
	}, nil
}

// start loads and attaches the programs: one dataplane serves both
// families.
func start(ctx context.Context, env mode.Env) (*mode.Instance, error) {
	cfg, err := ConfigFrom(env.Options, env.Metrics, env.Logger)
	if err != nil {
		return nil, err
	}
	if cfg.Sizes, cfg.ConntrackSize, err = mapSizes(cfg.Sizes, cfg.ConntrackSize, env.Options.MapMemoryRatio, env.NodeFamilies, env.Logger); err != nil {
		return nil, err
	}
	cfg.Written = env.Written
	// A node without our pins gets everything from this start.
	fresh := !loader.Pinned(cfg.BPFFSPath)
	d, err := New(ctx, cfg)
	if errors.Is(err, loader.ErrPinnedMapMismatch) {
		// An earlier agent's maps that this one can neither adopt nor
		// migrate: an upgrade problem to fix, not a kernel that cannot
		// run BPF. Falling back would move the node to another
		// dataplane and, after its first sync, remove the pinned maps
		// and every id in them. Refuse, as kube-proxy refuses a broken
		// configuration; the old programs keep serving meanwhile.
		return nil, &mode.FinalError{Err: fmt.Errorf("over pinned maps it cannot migrate: %w", err)}
	}
	if err != nil {
		return nil, err
	}
	in := &mode.Instance{Close: d.Close}
	if d.optOut != nil {
		in.OptedOutPods = d.SetOptedOutPods
	}
	if fresh {
		in.Undo = func() error { return Cleanup(cfg.BPFFSPath) }
	}
	for _, f := range env.Families {
		var fd dataplane.Dataplane = d
		if f == metrics.IPv6 {
			env.Logger.Info("serving IPv6", zap.String("ipFamily", f))
			fd = d.IPv6()
		}
		sctp := SCTPConfig{Logger: env.Logger.Named("sctp")}
		sctp.Netfilter, sctp.Unavailable = xtables.NetfilterFrom(env.Options, f, nil, sctp.Logger)
		if env.Metrics != nil {
			sctp.Gauge = env.Metrics.SCTPServicePorts
		}
		in.Families = append(in.Families, mode.Family{IPFamily: f, Dataplane: WithSCTP(fd, sctp)})
	}
	return in, nil
}

// remove detaches and unpins everything of ours, and deletes the tables
// that kept connection tracking running (nfconntrack.Keep) and served SCTP
// (WithSCTP), where another mode runs or for --cleanup.
func remove(ctx context.Context, o *config.Options, running *mode.Running) error {
	if running != nil && running.Mode == Name {
		return nil
	}
	// A mode translating with netfilter keeps connection tracking running
	// itself.
	return errors.Join(Cleanup(o.BPFFSPath), nfconntrack.RemoveKeep(ctx, ""), nftables.DeleteTables(ctx, "", SCTPTables...))
}

// Cleanup detaches and unpins every BPF program and map of ours pinned
// under bpffsPath, and our TC and XDP programs.
func Cleanup(bpffsPath string) error {
	return errors.Join(loader.CleanupXDP(bpffsPath), loader.Cleanup(bpffsPath), loader.CleanupTC())
}

// mapSizes are the maps' capacities: those the flags give (flags,
// conntrack), and for the others what the node's memory and the families
// it has addresses of call for (loader.AutoSizes), logged.
func mapSizes(flags loader.MapSizes, conntrack uint32, ratio float64, nodeFamilies []string, log *zap.Logger) (loader.MapSizes, uint32, error) {
	mem, err := loader.NodeMemory()
	if err != nil {
		return flags, conntrack, fmt.Errorf("size the BPF maps: %w", err)
	}
	in := loader.SizeInput{NodeMemory: mem, Ratio: ratio,
		IPv4: slices.Contains(nodeFamilies, metrics.IPv4), IPv6: slices.Contains(nodeFamilies, metrics.IPv6)}
	sizes, ct, err := loader.AutoSizes(flags, conntrack, in)
	if err != nil {
		return flags, conntrack, fmt.Errorf("size the BPF maps: %w", err)
	}
	s6 := sizes.IPv6
	log.Info("BPF map sizes", zap.Uint64("nodeMemoryMiB", mem>>20), zap.Float64("lruMemoryRatio", in.Ratio),
		zap.Strings("nodeFamilies", nodeFamilies),
		zap.Uint32s("ipv4", []uint32{sizes.Services, sizes.Backends, sizes.RevNat, sizes.SockRevNat, sizes.Affinity, ct}),
		zap.Uint32s("ipv6", []uint32{s6.Services, s6.Backends, s6.RevNat, s6.SockRevNat, s6.Affinity, s6.Conntrack}),
		zap.String("order", "services, backends, revnat, sockRevnat, affinity, conntrack"))
	return sizes, ct, nil
}
