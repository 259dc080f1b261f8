package bpf

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// collector exports the BPF programs' per-CPU event counters at scrape
// time, so the datapath pays one counter increment and nothing more.
type collector struct {
	l      *loader.Loaded
	events *prometheus.Desc
	errors *prometheus.Desc
}

func newCollector(l *loader.Loaded) prometheus.Collector {
	return &collector{
		l: l,
		events: prometheus.NewDesc("ebpfproxy_bpf_events_total",
			"Events counted by the BPF programs, by event.", []string{"event"}, nil),
		errors: prometheus.NewDesc("ebpfproxy_bpf_counter_read_errors_total",
			"1 when the BPF counters could not be read at this scrape.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.errors
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
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
