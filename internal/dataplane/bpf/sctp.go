package bpf

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// SCTPTable names the nftables tables (ip and ip6) that serve the SCTP
// ServicePorts beside the BPF programs.
const SCTPTable = "ebpf-proxy-sctp"

// SCTPTables are those tables as "family name".
var SCTPTables = []string{"ip " + SCTPTable, "ip6 " + SCTPTable}

// Served-by values of ebpfproxy_sctp_service_ports.
const (
	SCTPServedByNFTables = "nftables"
	SCTPServedByNone     = "none"
)

// SCTPConfig configures the serving of one IP family's SCTP ServicePorts.
type SCTPConfig struct {
	// Netfilter configures the nftables dataplane that serves them (its
	// Metrics are left out: the sync metrics are the BPF dataplane's).
	Netfilter xtables.Netfilter
	// Gauge, if set, is ebpfproxy_sctp_service_ports.
	Gauge *prometheus.GaugeVec
	// Logger receives what is done with them.
	Logger *zap.Logger
	// Unavailable, if set, says why no nftables dataplane can be
	// configured: the SCTP ServicePorts stay unserved.
	Unavailable error
}

// WithSCTP returns d, one IP family's BPF dataplane, with that family's
// SCTP ServicePorts served by nftables beside it. The programs translate
// TCP and UDP alone: SCTP sockets and packets pass them (the cgroup hooks
// return at once, the TC and XDP programs parse TCP and UDP only), so
// netfilter's NAT serves them, as kube-proxy's nftables mode would, in a
// table of their own (SCTPTable) holding the SCTP ServicePorts alone. The
// table exists only while SCTP ServicePorts do: a node without them keeps
// no netfilter rule, nor the conntrack it would need. Where nftables
// cannot run they stay unserved, which an error line and
// ebpfproxy_sctp_service_ports{served_by="none"} say. d still gets every
// ServicePort: its maps keep the SCTP ones, which no program reads.
func WithSCTP(d dataplane.Dataplane, cfg SCTPConfig) dataplane.Dataplane {
	cfg.Netfilter.Metrics = nil
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &withSCTP{Dataplane: d, s: &sctpBeside{cfg: cfg, names: map[model.ServicePortName]struct{}{}}}
}

type withSCTP struct {
	dataplane.Dataplane
	s *sctpBeside
}

// Sync implements dataplane.Dataplane: the BPF dataplane's sync, then the
// SCTP table's.
func (w *withSCTP) Sync(up model.Update) error {
	return errors.Join(w.Dataplane.Sync(up), w.s.sync(up))
}

// sctpBeside is the nftables dataplane of one family's SCTP ServicePorts.
type sctpBeside struct {
	cfg SCTPConfig
	// names are the SCTP ServicePorts of the last update.
	names map[model.ServicePortName]struct{}
	// nft serves them; nil while there are none, or where it cannot
	// start (err says why, logged once).
	nft    *nftables.Dataplane
	err    error
	synced bool
}

func (s *sctpBeside) family() string {
	if s.cfg.Netfilter.IPv6 {
		return metrics.IPv6
	}
	return metrics.IPv4
}

func (s *sctpBeside) table() string {
	if s.cfg.Netfilter.IPv6 {
		return SCTPTables[1]
	}
	return SCTPTables[0]
}

func (s *sctpBeside) sync(up model.Update) error {
	changed := model.ChangeSet{}
	if up.Full || !s.synced {
		clear(s.names)
		for name := range up.State.Services {
			if name.Protocol == model.SCTP {
				s.names[name] = struct{}{}
			}
		}
	} else {
		for name := range up.Changed {
			if name.Protocol != model.SCTP {
				continue
			}
			changed[name] = struct{}{}
			if _, ok := up.State.Services[name]; ok {
				s.names[name] = struct{}{}
			} else {
				delete(s.names, name)
			}
		}
		if len(changed) == 0 && (s.nft != nil || len(s.names) == 0) {
			return nil
		}
	}
	first := !s.synced
	s.synced = true
	if len(s.names) == 0 {
		s.gauge(0, 0)
		if s.nft == nil && !first {
			return nil
		}
		// The last SCTP ServicePort is gone (or an earlier agent left
		// a table): no rule stays behind.
		s.nft = nil
		if err := nftables.DeleteTables(context.Background(), s.cfg.Netfilter.Netns, s.table()); err != nil {
			return fmt.Errorf("delete the SCTP table %s: %w", s.table(), err)
		}
		return nil
	}
	full := up.Full
	if s.nft == nil {
		// Without a configuration it is never tried; after a failure,
		// again at the next full sync.
		err := s.cfg.Unavailable
		if err == nil && !up.Full && s.err != nil {
			err = s.err
		}
		if err == nil {
			var nft *nftables.Dataplane
			if nft, err = nftables.New(context.Background(), nftables.Config{Netfilter: s.cfg.Netfilter, Table: SCTPTable, Beside: true}); err == nil {
				s.nft, full = nft, true
				s.cfg.Logger.Info("SCTP ServicePorts are served by nftables beside the BPF programs",
					zap.String("ipFamily", s.family()), zap.String("table", s.table()), zap.Int("servicePorts", len(s.names)))
			}
		}
		if err != nil {
			if s.err == nil || s.err.Error() != err.Error() {
				s.cfg.Logger.Error("SCTP ServicePorts are not served: the BPF programs translate TCP and UDP alone, and nftables, which serves SCTP beside them, cannot run",
					zap.String("ipFamily", s.family()), zap.Int("servicePorts", len(s.names)), zap.Error(err))
			}
			s.err = err
			s.gauge(0, len(s.names))
			return nil
		}
		s.err = nil
	}
	st := &model.State{Node: up.State.Node, Services: make(map[model.ServicePortName]*model.Service, len(s.names))}
	for name := range s.names {
		st.Services[name] = up.State.Services[name]
	}
	s.gauge(len(s.names), 0)
	if err := s.nft.Sync(model.Update{State: st, Changed: changed, Full: full}); err != nil {
		return fmt.Errorf("SCTP ServicePorts: %w", err)
	}
	return nil
}

func (s *sctpBeside) gauge(served, unserved int) {
	if s.cfg.Gauge == nil {
		return
	}
	s.cfg.Gauge.WithLabelValues(s.family(), SCTPServedByNFTables).Set(float64(served))
	s.cfg.Gauge.WithLabelValues(s.family(), SCTPServedByNone).Set(float64(unserved))
}
