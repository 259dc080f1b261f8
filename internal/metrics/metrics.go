// Package metrics owns every Prometheus metric ebpf-proxy exports.
//
// Metrics whose meaning is the same as upstream kube-proxy's keep kube-proxy's
// names, help text (including the "[ALPHA] " stability prefix that
// k8s.io/component-base prints), label names and bucket layouts, so that
// dashboards and alerts written for kube-proxy keep working unchanged.
// Metrics that only make sense for the BPF dataplane use the "ebpfproxy_"
// prefix.
//
// All metrics live in a private registry (never the global default one) so
// that tests can create as many independent instances as they like.
package metrics

import (
	"fmt"
	"net/http"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// IP family label values. They are the strings of k8s.io/api/core/v1.IPFamily
// because upstream kube-proxy uses exactly those for its ip_family label.
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// FamilyOf is the family label value of a, an IPv4-mapped IPv6 address
// counting as IPv4.
func FamilyOf(a netip.Addr) string {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// traffic_policy label values of kubeproxy_sync_proxy_rules_no_local_endpoints_total.
const (
	TrafficPolicyInternal = "internal"
	TrafficPolicyExternal = "external"
)

// Label names. Exported so that tests and dashboards generated from code use
// the same spelling as the exporter.
const (
	LabelIPFamily      = "ip_family"
	LabelTrafficPolicy = "traffic_policy"
	LabelCode          = "code"
	LabelDataplane     = "dataplane"
	LabelMap           = "map"
	LabelOp            = "op"
	LabelKind          = "kind"
	LabelReason        = "reason"
	LabelMode          = "mode"
	LabelTable         = "table"
	LabelState         = "state"
	LabelDevice        = "device"
	LabelServedBy      = "served_by"
)

const (
	kubeProxySubsystem = "kubeproxy"
	ebpfProxyNamespace = "ebpfproxy"

	// alpha is what k8s.io/component-base prepends to the help text of every
	// ALPHA metric; scrapers see it, so we print it too.
	alpha = "[ALPHA] "
)

// SyncDurationBuckets are the buckets of the kubeproxy_sync_*_duration_seconds
// histograms: 1ms doubling up to 16.384s (upstream ExponentialBuckets(0.001, 2, 15)).
var SyncDurationBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// NetworkProgrammingBuckets are the buckets of
// kubeproxy_network_programming_duration_seconds. Upstream builds them with
// component-base's MergeBuckets, which starts from a single 0 bucket, so the
// layout is 0, 0.25, 0.5, 1..59 step 1, 60..115 step 5, 120..300 step 30.
// The leading 0 is kept: dropping it would change the le="0" series that
// existing recording rules may reference.
var NetworkProgrammingBuckets = mergeBuckets(
	prometheus.LinearBuckets(0.25, 0.25, 2),
	prometheus.LinearBuckets(1, 1, 59),
	prometheus.LinearBuckets(60, 5, 12),
	prometheus.LinearBuckets(120, 30, 7),
)

func mergeBuckets(parts ...[]float64) []float64 {
	out := []float64{0}
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// FamilyMetrics are the metrics one IP family's sync loop records. Every field
// is already bound to its ip_family label value, so callers never spell a
// label. Obtain one from Metrics.Family; Metrics embeds the one for the family
// given to New.
type FamilyMetrics struct {
	// IPFamily is the ip_family label value these metrics are bound to.
	IPFamily string

	// SyncProxyRulesDuration (kubeproxy_sync_proxy_rules_duration_seconds)
	// observes the duration in seconds of every sync, full or partial.
	SyncProxyRulesDuration prometheus.Observer
	// SyncFullProxyRulesDuration (kubeproxy_sync_full_proxy_rules_duration_seconds)
	// observes the duration in seconds of full syncs only.
	SyncFullProxyRulesDuration prometheus.Observer
	// SyncPartialProxyRulesDuration (kubeproxy_sync_partial_proxy_rules_duration_seconds)
	// observes the duration in seconds of partial syncs only.
	SyncPartialProxyRulesDuration prometheus.Observer
	// SyncProxyRulesLastTimestamp (kubeproxy_sync_proxy_rules_last_timestamp_seconds)
	// is set to the current time after every successful sync.
	SyncProxyRulesLastTimestamp prometheus.Gauge
	// SyncProxyRulesLastQueuedTimestamp (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds)
	// is set to the current time whenever a sync is requested and once when the
	// sync loop starts; if it runs far ahead of SyncProxyRulesLastTimestamp the
	// sync loop is stuck.
	SyncProxyRulesLastQueuedTimestamp prometheus.Gauge
	// NetworkProgrammingDuration (kubeproxy_network_programming_duration_seconds)
	// observes, after a successful sync, the seconds elapsed since each
	// programmed EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time.
	NetworkProgrammingDuration prometheus.Observer
	// NoLocalEndpointsInternal (kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal"})
	// is set after each sync to the number of services with
	// internalTrafficPolicy=Local and no local endpoints.
	NoLocalEndpointsInternal prometheus.Gauge
	// NoLocalEndpointsExternal (kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="external"})
	// is set after each sync to the number of services with
	// externalTrafficPolicy=Local and no local endpoints.
	NoLocalEndpointsExternal prometheus.Gauge

	// IPTablesRestoreFailuresTotal (kubeproxy_sync_proxy_rules_iptables_restore_failures_total)
	// counts iptables-restore runs of the iptables and IPVS dataplanes that
	// failed, full and partial.
	IPTablesRestoreFailuresTotal prometheus.Counter
	// IPTablesPartialRestoreFailuresTotal (kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total)
	// counts the failed iptables-restore runs of partial syncs only.
	IPTablesPartialRestoreFailuresTotal prometheus.Counter
	// IPTablesRulesTotal (kubeproxy_sync_proxy_rules_iptables_total{table})
	// is the number of iptables rules the dataplane owns in each table
	// ("filter", "nat") after the last successful sync. It is already bound
	// to the ip_family label: callers give only the table.
	IPTablesRulesTotal *prometheus.GaugeVec
	// IPTablesRulesLast (kubeproxy_sync_proxy_rules_iptables_last{table}) is
	// the number of rules the last successful sync wrote to each table.
	IPTablesRulesLast *prometheus.GaugeVec

	// ConntrackReconcilerSyncDuration (kubeproxy_conntrack_reconciler_sync_duration_seconds)
	// observes how long each deletion of stale UDP conntrack entries by the
	// iptables and IPVS dataplanes took (one table dump and the deletes).
	ConntrackReconcilerSyncDuration prometheus.Observer
	// ConntrackReconcilerDeletedEntriesTotal (kubeproxy_conntrack_reconciler_deleted_entries_total)
	// counts the stale UDP conntrack entries those deletions removed.
	ConntrackReconcilerDeletedEntriesTotal prometheus.Counter
	// NFTablesSyncFailuresTotal (kubeproxy_sync_proxy_rules_nftables_sync_failures_total)
	// counts nft transactions of the nftables dataplane that failed, full
	// and partial.
	NFTablesSyncFailuresTotal prometheus.Counter
}

// Metrics holds every metric ebpf-proxy exports and the registry serving them.
type Metrics struct {
	// FamilyMetrics are bound to the IP family passed to New.
	FamilyMetrics

	// EndpointChangesPending (kubeproxy_sync_proxy_rules_endpoint_changes_pending)
	// counts EndpointSlice changes received but not yet synced: incremented per
	// change that needs a sync, set to 0 when a sync takes the changes.
	EndpointChangesPending prometheus.Gauge
	// EndpointChangesTotal (kubeproxy_sync_proxy_rules_endpoint_changes_total)
	// counts every EndpointSlice event the change tracker received.
	EndpointChangesTotal prometheus.Counter
	// ServiceChangesPending (kubeproxy_sync_proxy_rules_service_changes_pending)
	// is the number of Services with changes not yet synced.
	ServiceChangesPending prometheus.Gauge
	// ServiceChangesTotal (kubeproxy_sync_proxy_rules_service_changes_total)
	// counts every Service event the change tracker received.
	ServiceChangesTotal prometheus.Counter

	// ProxyHealthzTotal (kubeproxy_proxy_healthz_total{code}) counts /healthz
	// responses of the proxier health server by HTTP status code.
	ProxyHealthzTotal *prometheus.CounterVec
	// ProxyLivezTotal (kubeproxy_proxy_livez_total{code}) counts /livez
	// responses of the proxier health server by HTTP status code.
	ProxyLivezTotal *prometheus.CounterVec

	// SyncErrorsTotal (ebpfproxy_sync_errors_total{dataplane}) counts failed
	// syncs per dataplane ("ebpf", "nftables", "iptables", "ipvs").
	SyncErrorsTotal *prometheus.CounterVec
	// MapOperationErrorsTotal (ebpfproxy_map_operation_errors_total{map,op})
	// counts failed BPF map operations by map name and operation
	// ("lookup", "update", "delete", "iterate").
	MapOperationErrorsTotal *prometheus.CounterVec
	// InvalidObjectsTotal (ebpfproxy_invalid_objects_total{kind,reason})
	// counts malformed Kubernetes objects that were skipped, by object kind
	// ("Service", "EndpointSlice", "Node") and a short machine-readable reason.
	InvalidObjectsTotal *prometheus.CounterVec
	// ProxyMode (ebpfproxy_proxy_mode{mode,reason}) is an info gauge: 1
	// for the active mode, labelled with why it was chosen. Set it with
	// SetProxyMode so that only one series ever exists.
	ProxyMode *prometheus.GaugeVec
	// HealthCheckListenFailuresTotal (ebpfproxy_health_check_node_port_listen_failures_total)
	// counts failed attempts to listen on a Service's healthCheckNodePort;
	// a failed port is retried on every sync until it succeeds.
	HealthCheckListenFailuresTotal prometheus.Counter
	// HealthCheckNodePorts (ebpfproxy_health_check_node_ports{state,ip_family})
	// is the number of Services whose health check node port is being
	// served (state "serving") or could not be bound (state "failed") on
	// the addresses of an IP family.
	HealthCheckNodePorts *prometheus.GaugeVec
	// XDPAttached (ebpfproxy_xdp_attached{device,mode}) is 1 for each
	// device the XDP fast path runs on, in its mode (native or generic).
	XDPAttached *prometheus.GaugeVec
	// XDPAttachFailuresTotal (ebpfproxy_xdp_attach_failures_total{device,mode})
	// counts devices that refused the XDP program in the mode asked for;
	// their traffic is handled by the TC programs alone.
	XDPAttachFailuresTotal *prometheus.CounterVec
	// KubeProxyLeftovers (ebpfproxy_kube_proxy_leftovers) is 1 while
	// upstream kube-proxy's rules are known to be on the node (kube-proxy
	// still runs, or removing them failed), 0 once they are removed.
	KubeProxyLeftovers prometheus.Gauge
	// ConntrackHandoverConnections
	// (ebpfproxy_conntrack_handover_connections) counts, in the BPF
	// mode, the open TCP connections that netfilter translated before it
	// (kube-proxy's), for which connection tracking is kept running
	// (nfconntrack.Keep); 0 once none is left.
	ConntrackHandoverConnections prometheus.Gauge
	// SCTPServicePorts (ebpfproxy_sctp_service_ports{ip_family,served_by})
	// counts, in the BPF mode, the SCTP ServicePorts, which its programs
	// do not translate: served_by="nftables" where nftables serves them
	// beside the programs, "none" where it cannot.
	SCTPServicePorts *prometheus.GaugeVec
	// KubeProxyLeftoversRemovedTotal
	// (ebpfproxy_kube_proxy_leftovers_removed_total{kind}) counts the
	// objects of kube-proxy's removed, by kind (chain, virtual_server,
	// ipset, interface, nftables_table).
	KubeProxyLeftoversRemovedTotal *prometheus.CounterVec

	registry *prometheus.Registry
	// collectors are what New registered, for Describe.
	collectors []prometheus.Collector

	syncDuration        *prometheus.HistogramVec
	syncFullDuration    *prometheus.HistogramVec
	syncPartialDuration *prometheus.HistogramVec
	lastTimestamp       *prometheus.GaugeVec
	lastQueuedTimestamp *prometheus.GaugeVec
	networkProgramming  *prometheus.HistogramVec
	noLocalEndpoints    *prometheus.GaugeVec
	restoreFailures     *prometheus.CounterVec
	nftablesFailures    *prometheus.CounterVec
	partialFailures     *prometheus.CounterVec
	iptablesTotal       *prometheus.GaugeVec
	iptablesLast        *prometheus.GaugeVec
	conntrackDuration   *prometheus.HistogramVec
	conntrackDeleted    *prometheus.CounterVec
}

// ValidIPFamily reports whether family is an ip_family label value kube-proxy
// uses ("IPv4" or "IPv6").
func ValidIPFamily(family string) bool {
	return family == IPv4 || family == IPv6
}

// New creates a registry holding the Go runtime and process collectors and all
// ebpf-proxy metrics, and returns typed handles to them. ipFamily ("IPv4" or
// "IPv6") is the primary family the embedded FamilyMetrics are bound to; a
// dual-stack agent gets the other family's handles from Family.
//
// New panics if ipFamily is not "IPv4" or "IPv6": it is always a constant in
// the caller, so a wrong value is a programming error, not bad input.
func New(ipFamily string) *Metrics {
	if !ValidIPFamily(ipFamily) {
		panic(fmt.Sprintf("metrics.New: ip family %q is neither %q nor %q", ipFamily, IPv4, IPv6))
	}

	m := &Metrics{registry: prometheus.NewRegistry()}

	m.syncDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_duration_seconds",
		Help:      alpha + "SyncProxyRules latency in seconds",
		Buckets:   SyncDurationBuckets,
	}, []string{LabelIPFamily})
	m.syncFullDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_full_proxy_rules_duration_seconds",
		Help:      alpha + "SyncProxyRules latency in seconds for full resyncs",
		Buckets:   SyncDurationBuckets,
	}, []string{LabelIPFamily})
	m.syncPartialDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_partial_proxy_rules_duration_seconds",
		Help:      alpha + "SyncProxyRules latency in seconds for partial resyncs",
		Buckets:   SyncDurationBuckets,
	}, []string{LabelIPFamily})
	m.lastTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_timestamp_seconds",
		Help:      alpha + "The last time proxy rules were successfully synced",
	}, []string{LabelIPFamily})
	m.lastQueuedTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
		Help:      alpha + "The last time a sync of proxy rules was queued",
	}, []string{LabelIPFamily})
	m.networkProgramming = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "network_programming_duration_seconds",
		Help:      alpha + "In Cluster Network Programming Latency in seconds",
		Buckets:   NetworkProgrammingBuckets,
	}, []string{LabelIPFamily})
	// A gauge despite the _total suffix: upstream defines it that way.
	m.noLocalEndpoints = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_no_local_endpoints_total",
		Help:      alpha + "Number of services with a Local traffic policy and no endpoints",
	}, []string{LabelTrafficPolicy, LabelIPFamily})

	m.restoreFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_restore_failures_total",
		Help:      alpha + "Cumulative proxy iptables restore failures",
	}, []string{LabelIPFamily})
	m.nftablesFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_nftables_sync_failures_total",
		Help:      alpha + "Cumulative proxy nftables sync failures",
	}, []string{LabelIPFamily})
	m.partialFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_partial_restore_failures_total",
		Help:      alpha + "Cumulative proxy iptables partial restore failures",
	}, []string{LabelIPFamily})
	m.iptablesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_total",
		Help:      alpha + "Total number of iptables rules owned by kube-proxy",
	}, []string{LabelTable, LabelIPFamily})
	m.iptablesLast = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_iptables_last",
		Help:      alpha + "Number of iptables rules written by kube-proxy in last sync",
	}, []string{LabelTable, LabelIPFamily})

	m.conntrackDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_sync_duration_seconds",
		Help:      alpha + "ReconcileConntrackFlowsLatency latency in seconds",
		Buckets:   SyncDurationBuckets,
	}, []string{LabelIPFamily})
	m.conntrackDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_deleted_entries_total",
		Help:      alpha + "Cumulative conntrack flows deleted by conntrack reconciler",
	}, []string{LabelIPFamily})

	m.EndpointChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_pending",
		Help:      alpha + "Pending proxy rules Endpoint changes",
	})
	m.EndpointChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_total",
		Help:      alpha + "Cumulative proxy rules Endpoint changes",
	})
	m.ServiceChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_pending",
		Help:      alpha + "Pending proxy rules Service changes",
	})
	m.ServiceChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_total",
		Help:      alpha + "Cumulative proxy rules Service changes",
	})
	m.ProxyHealthzTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_healthz_total",
		Help:      alpha + "Cumulative proxy healthz HTTP status",
	}, []string{LabelCode})
	m.ProxyLivezTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_livez_total",
		Help:      alpha + "Cumulative proxy livez HTTP status",
	}, []string{LabelCode})

	m.SyncErrorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "sync_errors_total",
		Help:      "Syncs of a dataplane that failed and will be retried.",
	}, []string{LabelDataplane})
	m.MapOperationErrorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "map_operation_errors_total",
		Help:      "BPF map operations that returned an error, by map and operation.",
	}, []string{LabelMap, LabelOp})
	m.InvalidObjectsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "invalid_objects_total",
		Help:      "Malformed Kubernetes objects that were skipped, by kind and reason.",
	}, []string{LabelKind, LabelReason})
	m.XDPAttached = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "xdp_attached",
		Help:      "1 for each device the XDP fast path is attached to, by device and mode (native or generic).",
	}, []string{LabelDevice, LabelMode})
	m.XDPAttachFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "xdp_attach_failures_total",
		Help:      "Devices that refused the XDP program in the mode asked for; their traffic goes through the TC programs only.",
	}, []string{LabelDevice, LabelMode})
	m.ProxyMode = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "proxy_mode",
		Help:      "The dataplane in use (1 for the active mode), and why it was chosen.",
	}, []string{LabelMode, LabelReason})
	m.HealthCheckListenFailuresTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "health_check_node_port_listen_failures_total",
		Help:      "Failed attempts to listen on a Service's healthCheckNodePort (retried on every sync).",
	})
	m.HealthCheckNodePorts = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "health_check_node_ports",
		Help:      "Services whose healthCheckNodePort is served (state=serving) or could not be bound (state=failed), by IP family.",
	}, []string{LabelState, LabelIPFamily})

	m.KubeProxyLeftovers = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "kube_proxy_leftovers",
		Help:      "1 while upstream kube-proxy's rules are known to be on the node (it still runs, or removing them failed), 0 once removed.",
	})
	m.ConntrackHandoverConnections = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "conntrack_handover_connections",
		Help:      "Open TCP connections netfilter translated before the BPF mode (kube-proxy's), for which connection tracking is kept running; 0 once none is left.",
	})
	m.SCTPServicePorts = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "sctp_service_ports",
		Help:      "SCTP ServicePorts in the BPF mode, by IP family and by what serves them: nftables beside the BPF programs, or none where nftables cannot.",
	}, []string{LabelIPFamily, LabelServedBy})
	m.KubeProxyLeftoversRemovedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ebpfProxyNamespace,
		Name:      "kube_proxy_leftovers_removed_total",
		Help:      "Objects upstream kube-proxy left on the node that were removed, by kind.",
	}, []string{LabelKind})

	m.collectors = []prometheus.Collector{
		// Same Go collector configuration as component-base's legacy
		// registry, so the go_* series match kube-proxy's.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),

		m.syncDuration,
		m.syncFullDuration,
		m.syncPartialDuration,
		m.lastTimestamp,
		m.lastQueuedTimestamp,
		m.networkProgramming,
		m.noLocalEndpoints,
		m.restoreFailures,
		m.partialFailures,
		m.nftablesFailures,
		m.iptablesTotal,
		m.iptablesLast,
		m.conntrackDuration,
		m.conntrackDeleted,
		m.EndpointChangesPending,
		m.EndpointChangesTotal,
		m.ServiceChangesPending,
		m.ServiceChangesTotal,
		m.ProxyHealthzTotal,
		m.ProxyLivezTotal,

		m.SyncErrorsTotal,
		m.MapOperationErrorsTotal,
		m.InvalidObjectsTotal,
		m.ProxyMode,
		m.HealthCheckListenFailuresTotal,
		m.HealthCheckNodePorts,
		m.XDPAttached,
		m.XDPAttachFailuresTotal,
		m.KubeProxyLeftovers,
		m.ConntrackHandoverConnections,
		m.SCTPServicePorts,
		m.KubeProxyLeftoversRemovedTotal,
	}
	m.registry.MustRegister(m.collectors...)

	m.FamilyMetrics = *m.Family(ipFamily)
	return m
}

// Family returns the metrics of one IP family's sync loop, bound to the
// ip_family label value family. Calling it again for the same family returns
// handles to the same series.
//
// Family panics if family is not "IPv4" or "IPv6" (see New).
func (m *Metrics) Family(family string) *FamilyMetrics {
	if !ValidIPFamily(family) {
		panic(fmt.Sprintf("metrics.Family: ip family %q is neither %q nor %q", family, IPv4, IPv6))
	}
	return &FamilyMetrics{
		IPFamily:                          family,
		SyncProxyRulesDuration:            m.syncDuration.WithLabelValues(family),
		SyncFullProxyRulesDuration:        m.syncFullDuration.WithLabelValues(family),
		SyncPartialProxyRulesDuration:     m.syncPartialDuration.WithLabelValues(family),
		SyncProxyRulesLastTimestamp:       m.lastTimestamp.WithLabelValues(family),
		SyncProxyRulesLastQueuedTimestamp: m.lastQueuedTimestamp.WithLabelValues(family),
		NetworkProgrammingDuration:        m.networkProgramming.WithLabelValues(family),
		NoLocalEndpointsInternal:          m.noLocalEndpoints.WithLabelValues(TrafficPolicyInternal, family),
		NoLocalEndpointsExternal:          m.noLocalEndpoints.WithLabelValues(TrafficPolicyExternal, family),

		NFTablesSyncFailuresTotal:           m.nftablesFailures.WithLabelValues(family),
		IPTablesRestoreFailuresTotal:        m.restoreFailures.WithLabelValues(family),
		IPTablesPartialRestoreFailuresTotal: m.partialFailures.WithLabelValues(family),
		IPTablesRulesTotal:                  m.iptablesTotal.MustCurryWith(prometheus.Labels{LabelIPFamily: family}),
		IPTablesRulesLast:                   m.iptablesLast.MustCurryWith(prometheus.Labels{LabelIPFamily: family}),

		ConntrackReconcilerSyncDuration:        m.conntrackDuration.WithLabelValues(family),
		ConntrackReconcilerDeletedEntriesTotal: m.conntrackDeleted.WithLabelValues(family),
	}
}

// SetProxyMode makes (mode, reason) the only ebpfproxy_proxy_mode series,
// with value 1. reason is one of a few fixed words (see cmd/ebpf-proxy),
// never free text, to keep the series bounded. Earlier series are removed
// rather than set to 0 so that "ebpfproxy_proxy_mode == 1" and
// "count(ebpfproxy_proxy_mode)" agree.
func (m *Metrics) SetProxyMode(mode, reason string) {
	m.ProxyMode.Reset()
	m.ProxyMode.WithLabelValues(mode, reason).Set(1)
}

// Describe sends the descriptors of every metric New registered, whether
// or not it has a series yet, for checks that dashboards and alerts name
// metrics the agent really exports. Collectors registered later on
// Registry (the BPF dataplane's) are not included.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// Registry returns the registry holding all metrics, for callers that need to
// register collectors of their own (for example per-CPU BPF counters).
func (m *Metrics) Registry() *prometheus.Registry {
	return m.registry
}

// Handler returns the /metrics handler: the Prometheus text format of the
// registry, as component-base's legacyregistry.Handler serves it (no
// OpenMetrics negotiation, so the output matches kube-proxy's).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
