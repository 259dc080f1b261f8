package iptables

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
)

// The drop of conntrack-INVALID packets in our FORWARD chain (staticRules)
// is kube-proxy's iptables mode's, whose packets it counts as
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total through an
// nfacct object. The rule's own counter holds the same number, without the
// nfnetlink_acct module or the nfacct match, which not every node has.

// InvalidDropped returns how many packets the INVALID drop rule has
// dropped since it was made, 0 where there is no such rule (the node's
// nf_conntrack_tcp_be_liberal makes it unneeded, as in kube-proxy).
func (d *Dataplane) InvalidDropped(ctx context.Context) (uint64, error) {
	rules, err := d.runner.ListChainCounters(ctx, "filter", chainForward)
	if err != nil {
		return 0, err
	}
	for _, r := range rules {
		if strings.Contains(r, "--ctstate INVALID") && strings.HasSuffix(r, "-j DROP") {
			n, ok := xtables.RulePackets(r)
			if !ok {
				return 0, fmt.Errorf("no counter in %q", r)
			}
			return n, nil
		}
	}
	return 0, nil
}

// invalidDropCollector exports the INVALID drops of every family's
// dataplane as one counter, as kube-proxy's nfacct object is shared by
// its IPv4 and IPv6 proxiers.
type invalidDropCollector struct {
	ds   []*Dataplane
	desc *prometheus.Desc
	log  *zap.Logger
}

// NewInvalidDropCollector returns the collector of
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total over ds. A
// scrape reads the rules' counters (one iptables -S per family, at most 2
// s); a failed read is logged and leaves the series out of that scrape, as
// kube-proxy's does.
func NewInvalidDropCollector(log *zap.Logger, ds ...*Dataplane) prometheus.Collector {
	return &invalidDropCollector{ds: ds, log: log,
		desc: prometheus.NewDesc("kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
			"Packets dropped by iptables to work around conntrack problems (conntrack state INVALID in forwarded traffic).", nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *invalidDropCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *invalidDropCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var total uint64
	for _, d := range c.ds {
		n, err := d.InvalidDropped(ctx)
		if err != nil {
			c.log.Error("reading the INVALID drop rule's counter", zap.String("ipFamily", d.cfg.family().name), zap.Error(err))
			return
		}
		total += n
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(total))
}
