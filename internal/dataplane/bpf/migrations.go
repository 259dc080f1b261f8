package bpf

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// migrations logs and counts what the loader did with the pinned maps an
// earlier agent left in another size or layout (an upgrade, or a changed
// map size flag).
type migrations struct {
	log   *zap.Logger
	total *prometheus.CounterVec
}

func newMigrations(log *zap.Logger) *migrations {
	return &migrations{log: log, total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ebpfproxy_bpf_map_migrations_total",
		Help: "Pinned BPF maps of another size or layout found at start-up, by map and result: resized, converted, recreated " +
			"(a cache started empty), kept (the entries did not fit the new size; the old map serves on at its old size) or carried " +
			"(a resized LRU map, after the new programs attached: the entries the earlier ones wrote meanwhile, carried over).",
	}, []string{"map", "result"})}
}

// report is the loader's Migrated callback.
func (m *migrations) report(r loader.MapMigration) {
	m.total.WithLabelValues(r.Map, r.Result).Inc()
	fields := []zap.Field{zap.String("map", r.Map), zap.String("result", r.Result), zap.Int("entries", r.Entries),
		zap.String("old", r.Old), zap.String("new", r.New)}
	if r.From != r.Map {
		fields = append(fields, zap.String("from", r.From))
	}
	if r.Result == loader.MigrationKept {
		m.log.Error("pinned map kept at its old size: its entries do not fit the configured size; lower the map size flag only once fewer entries are in use",
			append(fields, zap.Error(r.Err))...)
		return
	}
	if r.Result == loader.MigrationCarried {
		if r.Err != nil {
			m.log.Error("entries the earlier programs wrote during the migration were not all carried over: those flows or clients start afresh",
				append(fields, zap.Error(r.Err))...)
			return
		}
		m.log.Info("entries the earlier programs wrote during the migration carried over", fields...)
		return
	}
	m.log.Info("pinned map migrated", fields...)
}
