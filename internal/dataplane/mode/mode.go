// Package mode is what a dataplane package implements to be a proxy mode
// (its Mode), and what internal/proxymode, which chooses and starts one
// of the registered modes, gives it (Env) and takes back (Instance). It
// is apart from proxymode, as database/sql/driver is from database/sql:
// the dataplanes import it, and proxymode, which also removes kube-proxy's
// leftovers through the IPVS dataplane's package, sits above them.
package mode

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Reasons are the words of a mode for the reason label under auto.
type Reasons struct {
	// Key names the mode's errors in the log line of auto's choice.
	Key string
	// Chosen: the mode was the first auto tried, and it started.
	Chosen string
	// Unsupported: its probe failed.
	Unsupported string
	// Failed: the probe passed but the start failed.
	Failed string
}

// Mode describes one proxy mode. Its dataplane package exports it; the
// agent registers it in its Modes.
type Mode struct {
	// Name is --proxy-mode's value for it, one of dataplane's names.
	Name string
	// Auto lets --proxy-mode=auto choose it, in the order of Modes.
	Auto bool
	// Reasons are its words under auto.
	Reasons Reasons
	// Defaults sets the defaults of its own settings in o, before the
	// flags and kube-proxy's file are read; nil for none.
	Defaults func(o *config.Options)
	// Validate checks its settings in o (after config's Validate, whatever
	// the mode, as auto may choose any); nil for none.
	Validate func(o *config.Options) error
	// Probe says why the node cannot run the mode; nil means it can. A
	// nil Probe always passes.
	Probe func(ctx context.Context) error
	// Start starts the mode's dataplanes for env.Families.
	Start func(ctx context.Context, env Env) (*Instance, error)
	// Remove removes what the mode creates on the node, but what running
	// (the mode that serves, and what it uses) keeps: after the first
	// syncs of the mode that serves (leftovers of an earlier agent), and
	// for --cleanup, where running is nil. Nothing to remove is no error.
	Remove func(ctx context.Context, o *config.Options, running *Running) error
	// Handover, if set, lists, before another mode starts, what of this
	// mode must go the moment that mode's first sync of a family is
	// written, and returns what removes it for a family (metrics.IPv4 or
	// metrics.IPv6) and says how many objects it removed: what would
	// otherwise break the new connections the other mode translates (the
	// IPVS mode's virtual servers). It runs before the other mode writes
	// anything, so that the removal is quick.
	Handover func(ctx context.Context) (func(family string) (int, error), error)
	// SyncPeriods are the sync loop's periods in this mode.
	SyncPeriods func(o *config.Options) (sync, minSync time.Duration)
	// NodePorts, if set, is where NodePorts are served in this mode for
	// an IP family; nil means o.NodePorts[family].
	NodePorts func(o *config.Options, family string) model.NodePortSpec
	// Ignored logs, once at start, each setting given that has no effect
	// in this mode; nil for none.
	Ignored func(o *config.Options, log *zap.Logger)
	// AfterStart runs once the mode started, before it serves; nil for
	// nothing. An error stops the agent.
	AfterStart func(o *config.Options, log *zap.Logger) error
	// Netfilter says the mode translates with netfilter's NAT, so that
	// the node's nf_conntrack settings (--conntrack-*) apply in full.
	Netfilter bool
}

// Env is what a mode's Start gets.
type Env struct {
	// Options are the agent's settings.
	Options *config.Options
	// Families are the IP families to serve, primary first (metrics.IPv4,
	// metrics.IPv6). A mode serves the primary family or fails (under
	// auto, makes way for the next); a secondary family it cannot serve
	// is left out (Instance.Skipped), as kube-proxy runs single-stack
	// where iptables lacks a family.
	Families []string
	// NodeFamilies are the families the node has addresses of, which
	// the BPF mode gives maps of full size.
	NodeFamilies []string
	// Metrics receives the mode's metrics.
	Metrics *metrics.Metrics
	// Logger is the mode's logger, named after it.
	Logger *zap.Logger
	// Written, when a mode's dataplane calls it right after its first
	// sync of a family has written what translates the family's new
	// connections, removes at once what of the other modes would break
	// them from then on (their Handover); the rest of what they left goes
	// after every family's first sync (Remove). nil for nothing to do; a
	// mode that needs no handover does not call it.
	Written func(family string)
}

// Family is the dataplane of one IP family.
type Family struct {
	// IPFamily is metrics.IPv4 or metrics.IPv6.
	IPFamily string
	dataplane.Dataplane
}

// Instance is what a mode's Start started.
type Instance struct {
	// Families are the dataplanes of the IP families served, primary
	// first: each gets its own sync loop.
	Families []Family
	// Skipped are the secondary families the mode cannot serve, with why.
	Skipped map[string]error
	// Uses names what the mode writes with, for the other modes' Remove
	// (e.g. the iptables back ends in use); nil for nothing shared.
	Uses []string
	// Close releases handles; what is programmed stays and keeps serving.
	// nil for nothing to release.
	Close func()
	// Undo removes what the start attached and pinned on a node that had
	// none of it; nil when there is nothing to remove (it adopted an
	// earlier agent's pins, or the mode writes nothing before its first
	// sync).
	Undo func() error
	// OptedOutPods sets the pods, by address, opted out of the socket
	// hooks (the BPF mode's SetOptedOutPods); nil where no pod can opt
	// out (the fallbacks, and the BPF mode translating pods per packet
	// already). The agent then watches the node's pods and namespaces for
	// the opt-out annotation.
	OptedOutPods func(ctx context.Context, addrs []netip.Addr) error
}

// Running is the mode that serves, as the other modes' Remove sees it.
type Running struct {
	// Mode is its name.
	Mode string
	// Families are the IP families it serves.
	Families []string
	// Uses is its Instance.Uses.
	Uses []string
}

// Serves says whether the running mode serves an IP family.
func (r *Running) Serves(family string) bool { return slices.Contains(r.Families, family) }

// FinalError marks a start's error under which auto does not try the next
// mode: a problem to fix, not a kernel that cannot run the mode. Its text
// follows "does not fall back to another mode " (e.g. "over pinned maps
// it cannot migrate: ...").
type FinalError struct{ Err error }

func (e *FinalError) Error() string { return e.Err.Error() }
func (e *FinalError) Unwrap() error { return e.Err }

// PerFamily starts one dataplane per family of env.Families (primary
// first) with start, as the fallback modes run one per family like
// upstream's per-family proxiers. The primary family's failure is the
// error (after nothing was started); a secondary family that fails is left
// out, with why, in the Instance's Skipped.
func PerFamily[D dataplane.Dataplane](fams []string, start func(family string) (D, error)) (ds []D, in *Instance, err error) {
	in = &Instance{Skipped: map[string]error{}}
	for i, f := range fams {
		d, err := start(f)
		switch {
		case err != nil && i == 0:
			return nil, nil, err
		case err != nil:
			in.Skipped[f] = err
			continue
		}
		ds = append(ds, d)
		in.Families = append(in.Families, Family{IPFamily: f, Dataplane: d})
	}
	return ds, in, nil
}
