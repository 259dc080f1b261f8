package iptables

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
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

// counterCollector exports one counter read from our rules' counters in
// every family's dataplane, summed, as kube-proxy's nfacct objects are
// shared by its IPv4 and IPv6 proxiers. A scrape reads the counters (one
// iptables -S per family, at most 2 s); a failed read is logged and leaves
// the series out of that scrape, as kube-proxy's does.
type counterCollector struct {
	ds   []*Dataplane
	desc *prometheus.Desc
	log  *zap.Logger
	// what names the rules in the log; read reads one dataplane's count.
	what string
	read func(*Dataplane, context.Context) (uint64, error)
}

// NewInvalidDropCollector returns the collector of
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total over ds.
func NewInvalidDropCollector(log *zap.Logger, ds ...*Dataplane) prometheus.Collector {
	return &counterCollector{ds: ds, log: log, what: "the INVALID drop rule's counter", read: (*Dataplane).InvalidDropped,
		desc: prometheus.NewDesc("kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
			"Packets dropped by iptables to work around conntrack problems (conntrack state INVALID in forwarded traffic).", nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *counterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *counterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var total uint64
	for _, d := range c.ds {
		n, err := c.read(d, ctx)
		if err != nil {
			c.log.Error("reading "+c.what, zap.String("ipFamily", d.cfg.family().name), zap.Error(err))
			return
		}
		total += n
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(total))
}

// routeLocalnet is the sysctl that lets packets to 127.0.0.0/8 be routed
// off the loopback device, which NodePorts on 127.0.0.1 need.
const routeLocalnet = "net/ipv4/conf/all/route_localnet"

// setRouteLocalnet sets route_localnet in the dataplane's network
// namespace, as kube-proxy's iptables mode does when it serves NodePorts
// on 127.0.0.1: the static rules drop what the network could then send to
// the node's loopback services.
func (d *Dataplane) setRouteLocalnet() error {
	return netns.Do(d.cfg.Netns, func() error {
		set, err := sysctl.Default.SetInt(routeLocalnet, 1)
		if err != nil {
			return fmt.Errorf("NodePorts on 127.0.0.1 (--iptables-localhost-nodeports): %w", err)
		}
		if set {
			d.cfg.Logger.Info("set route_localnet=1 to serve NodePorts on 127.0.0.1, as kube-proxy does; to change this, turn off --iptables-localhost-nodeports or leave loopback addresses out of --nodeport-addresses")
		}
		return nil
	})
}

// LocalhostAccepted returns how many new connections NodePorts took on
// 127.0.0.1 since their rules were made: the counters of the NodePort
// rules for loopback destinations, which kube-proxy counts with nfacct as
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total (the nat
// table sees each connection's first packet).
func (d *Dataplane) LocalhostAccepted(ctx context.Context) (uint64, error) {
	if d.cfg.IPv6 {
		return 0, nil
	}
	rules, err := d.runner.ListChainCounters(ctx, "nat", chainNodePorts)
	if err != nil {
		return 0, err
	}
	var total uint64
	loopback := "-d " + d.cfg.family().loopback.String() + " "
	for _, r := range rules {
		if !strings.Contains(r, loopback) {
			continue
		}
		n, ok := xtables.RulePackets(r)
		if !ok {
			return 0, fmt.Errorf("no counter in %q", r)
		}
		total += n
	}
	return total, nil
}

// NewLocalhostCollector returns the collector of
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total over ds.
func NewLocalhostCollector(log *zap.Logger, ds ...*Dataplane) prometheus.Collector {
	return &counterCollector{ds: ds, log: log, what: "the counters of the NodePort rules on 127.0.0.1", read: (*Dataplane).LocalhostAccepted,
		desc: prometheus.NewDesc("kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
			"Packets accepted on NodePorts on 127.0.0.1 (localhost NodePorts; the first packet of each connection).", nil, nil)}
}
