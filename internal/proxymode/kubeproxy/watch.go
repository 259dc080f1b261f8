package kubeproxy

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultInterval is how often a Watcher looks again for a running
// kube-proxy.
const DefaultInterval = 30 * time.Second

// Config configures a Watcher. The zero value watches the caller's
// namespace and /proc every DefaultInterval, without metrics.
type Config struct {
	// Netns is the path of the namespace to clean; "" for the caller's.
	Netns string
	// Interval between checks; DefaultInterval if zero.
	Interval time.Duration
	// Running lists the running kube-proxy processes; Running("/proc") if
	// nil. Tests narrow it to the processes they start.
	Running func() ([]int, error)
	// Present is set to 1 while kube-proxy's leftovers are known to be on
	// the node, 0 once they are gone (ebpfproxy_kube_proxy_leftovers).
	Present prometheus.Gauge
	// Removed counts the objects removed, by kind: chain, virtual_server,
	// ipset, interface, nftables_table
	// (ebpfproxy_kube_proxy_leftovers_removed_total).
	Removed *prometheus.CounterVec
	// Logger; zap.NewNop() if nil.
	Logger *zap.Logger
}

// Watch removes kube-proxy's leftovers once no kube-proxy process runs on
// the node: at once if none runs, else at the first check after it has
// stopped (make before break: the caller starts it after its own first
// sync, and kube-proxy keeps serving until then). It checks every
// cfg.Interval until the removal has succeeded once or ctx ends, and
// returns then. While kube-proxy runs, or while the agent cannot tell
// (ErrCannotTell), nothing is removed; each of these is logged once.
func Watch(ctx context.Context, cfg Config) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Running == nil {
		cfg.Running = func() ([]int, error) { return Running("/proc") }
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	w := watcher{Config: cfg}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for !w.check(ctx) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type watcher struct {
	Config
	loggedRunning, loggedCannotTell bool
}

// check returns true once there is nothing more to do.
func (w *watcher) check(ctx context.Context) bool {
	log := w.Logger
	pids, err := w.Running()
	if err != nil {
		if !w.loggedCannotTell {
			level := log.Warn
			if errors.Is(err, ErrCannotTell) {
				level = log.Info
			}
			level("kube-proxy's rules, if any, are left on the node: cannot tell whether kube-proxy still runs", zap.Error(err))
			w.loggedCannotTell = true
		}
		return false
	}
	if len(pids) > 0 {
		if !w.loggedRunning {
			w.loggedRunning = true
			present, err := Present(ctx, w.Netns)
			if present {
				w.setPresent(1)
			}
			log.Info("kube-proxy runs on this node: its rules are left until it stops, then removed",
				zap.Ints("pids", pids), zap.Bool("leftoversFound", present), zap.Error(err))
		}
		return false
	}
	done, err := Remove(ctx, w.Netns)
	w.count("chain", len(done.Chains))
	w.count("virtual_server", len(done.VirtualServers))
	w.count("ipset", len(done.IPSets))
	if done.Interface != "" {
		w.count("interface", 1)
	}
	w.count("nftables_table", len(done.NFTables))
	fields := []zap.Field{
		zap.Int("chains", len(done.Chains)), zap.Strings("fixedChains", fixed(done.Chains)),
		zap.Strings("keptChains", done.Kept), zap.Int("virtualServers", len(done.VirtualServers)),
		zap.Strings("ipsets", done.IPSets), zap.String("interface", done.Interface),
		zap.Strings("nftablesTables", done.NFTables),
	}
	if err != nil {
		w.setPresent(1)
		if ctx.Err() == nil {
			log.Error("removing kube-proxy's leftovers; retrying", append(fields, zap.Error(err))...)
		}
		return false
	}
	w.setPresent(0)
	switch {
	case !done.Empty():
		log.Info("removed kube-proxy's leftovers", fields...)
	case len(done.Kept) > 0:
		log.Info("kube-proxy's chains that other rules use are left", fields...)
	}
	return true
}

// fixed lists the chains of done other than the per-Service ones, which
// can be tens of thousands: enough for the log line to say what went.
func fixed(removed []string) []string {
	var out []string
	for _, c := range removed {
		if chains[c[strings.LastIndexByte(c, ' ')+1:]] {
			out = append(out, c)
		}
	}
	return out
}
func (w *watcher) setPresent(v float64) {
	if w.Present != nil {
		w.Present.Set(v)
	}
}

func (w *watcher) count(kind string, n int) {
	if w.Removed != nil && n > 0 {
		w.Removed.WithLabelValues(kind).Add(float64(n))
	}
}
