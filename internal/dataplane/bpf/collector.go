package bpf

import (
	"errors"
	"reflect"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// DefaultMapCountInterval is how long the collector reuses its count of the
// maps the BPF programs fill themselves (connection tracking, session
// affinity) before counting them again; see Config.MapCountInterval.
const DefaultMapCountInterval = 30 * time.Second

// countBatch is how many entries one batch lookup reads when counting a
// map: a full map of 262,144 entries takes 64 system calls.
const countBatch = 4096

// collector exports, at scrape time, the BPF programs' per-CPU event
// counters, so the datapath pays one counter increment and nothing more,
// and how full the maps are:
//
//   - the maps the Go writers fill (services, backends, reverse NAT of both
//     families) from the writers' own count (maps.Writer.Entries), which
//     costs nothing;
//   - the LRU maps the programs fill (session affinity, and connection
//     tracking once the TC programs are attached) by reading them in
//     batches (countEntries), at most once per interval: between two
//     counts a scrape sees the last count. An LRU map at capacity evicts
//     its least recently used entries rather than failing, so its count
//     is what says that flows or affinities are being forgotten early.
//
// The capacity of every map is its max_entries as loaded, which may differ
// from the configured size when a pinned map was kept at its old size.
type collector struct {
	l *loader.Loaded
	// writers are the IPv4 and IPv6 maps writers.
	writers [2]*maps.Writer
	// tc returns the TC programs' objects once attached, else nil.
	tc func() *loader.TCLoaded

	events, errors    *prometheus.Desc
	entries, capacity *prometheus.Desc
	countErrors       *prometheus.CounterVec

	// mu guards the cached counts; concurrent scrapes count once.
	mu       sync.Mutex
	interval time.Duration
	now      func() time.Time
	counted  map[string]mapCount
}

// mapCount is the last count of one of the maps counted by iteration.
type mapCount struct {
	entries int
	at      time.Time
}

func newCollector(l *loader.Loaded, w4, w6 *maps.Writer, tc func() *loader.TCLoaded, interval time.Duration) *collector {
	if interval <= 0 {
		interval = DefaultMapCountInterval
	}
	return &collector{
		l: l, writers: [2]*maps.Writer{w4, w6}, tc: tc, interval: interval, now: time.Now,
		counted: map[string]mapCount{},
		events: prometheus.NewDesc("ebpfproxy_bpf_events_total",
			"Events counted by the BPF programs, by event.", []string{"event"}, nil),
		errors: prometheus.NewDesc("ebpfproxy_bpf_counter_read_errors_total",
			"1 when the BPF counters could not be read at this scrape.", nil, nil),
		entries: prometheus.NewDesc("ebpfproxy_bpf_map_entries",
			"Entries in each BPF map: as written by the agent for the maps it fills, as last counted "+
				"(at most once per 30s by default) for the LRU maps the programs fill (affinity, conntrack).",
			[]string{"map"}, nil),
		capacity: prometheus.NewDesc("ebpfproxy_bpf_map_capacity",
			"Capacity (max_entries) of each BPF map as loaded.", []string{"map"}, nil),
		countErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebpfproxy_bpf_map_count_errors_total",
			Help: "Counts of a BPF map's entries that failed; the map's entries are not exported at that scrape.",
		}, []string{"map"}),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.errors
	ch <- c.entries
	ch <- c.capacity
	c.countErrors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.collectCounters(ch)
	c.collectFill(ch)
	c.countErrors.Collect(ch)
}

func (c *collector) collectCounters(ch chan<- prometheus.Metric) {
	counts, err := c.l.Counters()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.GaugeValue, 0)
	for i, v := range counts {
		ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(v), loader.CounterNames[i])
	}
}

// collectFill exports the entries and capacity of every map it watches.
func (c *collector) collectFill(ch chan<- prometheus.Metric) {
	o := &c.l.Objects.SockMaps
	written := [2]struct{ services, backends, revnat *ebpf.Map }{
		{o.Lb4ServicesV1, o.Lb4BackendsV1, o.Lb4RevnatV1},
		{o.Lb6ServicesV1, o.Lb6BackendsV1, o.Lb6RevnatV1},
	}
	names := [2][3]string{
		{bpfobj.SockMapLb4ServicesV1, bpfobj.SockMapLb4BackendsV1, bpfobj.SockMapLb4RevnatV1},
		{bpfobj.SockMapLb6ServicesV1, bpfobj.SockMapLb6BackendsV1, bpfobj.SockMapLb6RevnatV1},
	}
	for f, w := range c.writers {
		if w == nil {
			continue
		}
		e := w.Entries()
		m := written[f]
		c.fill(ch, names[f][0], e.Services, m.services)
		c.fill(ch, names[f][1], e.Backends, m.backends)
		c.fill(ch, names[f][2], e.RevNat, m.revnat)
	}

	counted := []struct {
		name string
		m    *ebpf.Map
	}{
		{bpfobj.SockMapLb4AffinityV1, o.Lb4AffinityV1},
		{bpfobj.SockMapLb6AffinityV1, o.Lb6AffinityV1},
	}
	if tc := c.tc(); tc != nil {
		counted = append(counted, []struct {
			name string
			m    *ebpf.Map
		}{
			{bpfobj.TcMapTc4CtV1, tc.Objects.Tc4CtV1},
			{bpfobj.TcMapTc6CtV1, tc.Objects.Tc6CtV1},
		}...)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for _, x := range counted {
		last, ok := c.counted[x.name]
		if !ok || now.Sub(last.at) >= c.interval {
			n, err := countEntries(x.m)
			if err != nil {
				c.countErrors.WithLabelValues(x.name).Inc()
				delete(c.counted, x.name)
				ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(x.m.MaxEntries()), x.name)
				continue
			}
			last = mapCount{entries: n, at: now}
			c.counted[x.name] = last
		}
		c.fill(ch, x.name, last.entries, x.m)
	}
}

func (c *collector) fill(ch chan<- prometheus.Metric, name string, entries int, m *ebpf.Map) {
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(entries), name)
	ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(m.MaxEntries()), name)
}

var byteType = reflect.TypeFor[byte]()

// countEntries counts the entries of m, a (non per-CPU) hash map, with
// batch lookups of countBatch entries into buffers of raw keys and values:
// 64 system calls for 262,144 entries, where iterating key by key would
// take two per entry. Entries added or removed while it reads may or may
// not be counted, as with any iteration of a live map.
func countEntries(m *ebpf.Map) (int, error) {
	buf := func(size uint32) any {
		t := reflect.SliceOf(reflect.ArrayOf(int(size), byteType))
		return reflect.MakeSlice(t, countBatch, countBatch).Interface()
	}
	keys, values := buf(m.KeySize()), buf(m.ValueSize())
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return 0, err
		}
	}
}
