package metrics

import (
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches /metrics from h and parses it the way Prometheus does.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: status %d, body %q", rec.Code, rec.Body.String())
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics: Content-Type %q, want the Prometheus text format", ct)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

func labelsOf(m *dto.Metric) map[string]string {
	out := make(map[string]string)
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// findSeries returns the series of family name whose labels equal want.
func findSeries(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	f, ok := families[name]
	if !ok {
		t.Fatalf("metric %s not exposed", name)
	}
	for _, m := range f.GetMetric() {
		got := labelsOf(m)
		if len(got) != len(want) {
			continue
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
				break
			}
		}
		if match {
			return m
		}
	}
	t.Fatalf("metric %s has no series with labels %v", name, want)
	return nil
}

func bucketBounds(m *dto.Metric) []float64 {
	var out []float64
	for _, b := range m.GetHistogram().GetBucket() {
		if !math.IsInf(b.GetUpperBound(), +1) {
			out = append(out, b.GetUpperBound())
		}
	}
	return out
}

func TestMetricsExposedWithKubeProxyNamesTypesAndLabels(t *testing.T) {
	m := New(IPv4)
	v6 := m.Family(IPv6)

	m.SyncProxyRulesDuration.Observe(0.003)
	m.SyncFullProxyRulesDuration.Observe(0.003)
	v6.SyncPartialProxyRulesDuration.Observe(0.5)
	m.SyncProxyRulesLastTimestamp.Set(1700000000)
	m.SyncProxyRulesLastQueuedTimestamp.Set(1700000001)
	m.NetworkProgrammingDuration.Observe(1.5)
	m.NoLocalEndpointsInternal.Set(2)
	v6.NoLocalEndpointsExternal.Set(3)
	m.EndpointChangesPending.Set(4)
	m.EndpointChangesTotal.Add(5)
	m.ServiceChangesPending.Set(6)
	m.ServiceChangesTotal.Add(7)
	m.ProxyHealthzTotal.WithLabelValues("200").Inc()
	m.ProxyLivezTotal.WithLabelValues("503").Inc()
	m.SyncErrorsTotal.WithLabelValues("ebpf").Inc()
	m.MapOperationErrorsTotal.WithLabelValues("services_v1", "update").Inc()
	m.InvalidObjectsTotal.WithLabelValues("Service", "invalid_cluster_ip").Inc()
	m.SetProxyMode("ebpf", "configured")
	m.KubeProxyLeftovers.Set(1)
	m.ConntrackHandoverConnections.Set(14)
	m.SCTPServicePorts.WithLabelValues("IPv6", "nftables").Set(15)
	m.KubeProxyLeftoversRemovedTotal.WithLabelValues("chain").Add(12)
	m.IPTablesRestoreFailuresTotal.Add(9)
	v6.IPTablesPartialRestoreFailuresTotal.Inc()
	m.IPTablesRulesTotal.WithLabelValues("nat").Set(10)
	v6.IPTablesRulesLast.WithLabelValues("filter").Set(11)
	v6.ConntrackReconcilerSyncDuration.Observe(0.002)
	m.ConntrackReconcilerDeletedEntriesTotal.Add(13)
	v6.NFTablesSyncFailuresTotal.Add(2)

	families := scrape(t, m.Handler())

	tests := []struct {
		name   string
		typ    dto.MetricType
		labels map[string]string
		// value is checked for gauges and counters.
		value float64
		// alpha: the help text carries component-base's "[ALPHA] " prefix.
		alpha bool
	}{
		{"kubeproxy_sync_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"ip_family": "IPv4"}, 0, true},
		{"kubeproxy_sync_full_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"ip_family": "IPv4"}, 0, true},
		{"kubeproxy_sync_partial_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"ip_family": "IPv6"}, 0, true},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", dto.MetricType_GAUGE, map[string]string{"ip_family": "IPv4"}, 1700000000, true},
		{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", dto.MetricType_GAUGE, map[string]string{"ip_family": "IPv4"}, 1700000001, true},
		{"kubeproxy_network_programming_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"ip_family": "IPv4"}, 0, true},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", dto.MetricType_GAUGE, map[string]string{"traffic_policy": "internal", "ip_family": "IPv4"}, 2, true},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", dto.MetricType_GAUGE, map[string]string{"traffic_policy": "external", "ip_family": "IPv6"}, 3, true},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", dto.MetricType_GAUGE, map[string]string{}, 4, true},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", dto.MetricType_COUNTER, map[string]string{}, 5, true},
		{"kubeproxy_sync_proxy_rules_service_changes_pending", dto.MetricType_GAUGE, map[string]string{}, 6, true},
		{"kubeproxy_sync_proxy_rules_service_changes_total", dto.MetricType_COUNTER, map[string]string{}, 7, true},
		{"kubeproxy_proxy_healthz_total", dto.MetricType_COUNTER, map[string]string{"code": "200"}, 1, true},
		{"kubeproxy_proxy_livez_total", dto.MetricType_COUNTER, map[string]string{"code": "503"}, 1, true},
		{"ebpfproxy_sync_errors_total", dto.MetricType_COUNTER, map[string]string{"dataplane": "ebpf"}, 1, false},
		{"ebpfproxy_map_operation_errors_total", dto.MetricType_COUNTER, map[string]string{"map": "services_v1", "op": "update"}, 1, false},
		{"ebpfproxy_invalid_objects_total", dto.MetricType_COUNTER, map[string]string{"kind": "Service", "reason": "invalid_cluster_ip"}, 1, false},
		{"ebpfproxy_proxy_mode", dto.MetricType_GAUGE, map[string]string{"mode": "ebpf", "reason": "configured"}, 1, false},
		{"ebpfproxy_kube_proxy_leftovers", dto.MetricType_GAUGE, map[string]string{}, 1, false},
		{"ebpfproxy_conntrack_handover_connections", dto.MetricType_GAUGE, map[string]string{}, 14, false},
		{"ebpfproxy_sctp_service_ports", dto.MetricType_GAUGE, map[string]string{"ip_family": "IPv6", "served_by": "nftables"}, 15, false},
		{"ebpfproxy_kube_proxy_leftovers_removed_total", dto.MetricType_COUNTER, map[string]string{"kind": "chain"}, 12, false},
		{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", dto.MetricType_COUNTER, map[string]string{"ip_family": "IPv4"}, 9, true},
		{"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", dto.MetricType_COUNTER, map[string]string{"ip_family": "IPv6"}, 1, true},
		{"kubeproxy_sync_proxy_rules_iptables_total", dto.MetricType_GAUGE, map[string]string{"table": "nat", "ip_family": "IPv4"}, 10, true},
		{"kubeproxy_sync_proxy_rules_iptables_last", dto.MetricType_GAUGE, map[string]string{"table": "filter", "ip_family": "IPv6"}, 11, true},
		{"kubeproxy_conntrack_reconciler_sync_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"ip_family": "IPv6"}, 0, true},
		{"kubeproxy_conntrack_reconciler_deleted_entries_total", dto.MetricType_COUNTER, map[string]string{"ip_family": "IPv4"}, 13, true},
		{"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", dto.MetricType_COUNTER, map[string]string{"ip_family": "IPv6"}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := families[tt.name]
			if f == nil {
				t.Fatalf("%s not exposed", tt.name)
			}
			if f.GetType() != tt.typ {
				t.Errorf("%s has type %v, want %v", tt.name, f.GetType(), tt.typ)
			}
			if got := strings.HasPrefix(f.GetHelp(), "[ALPHA] "); got != tt.alpha {
				t.Errorf("%s help %q: [ALPHA] prefix present = %v, want %v", tt.name, f.GetHelp(), got, tt.alpha)
			}
			s := findSeries(t, families, tt.name, tt.labels)
			var got float64
			switch tt.typ {
			case dto.MetricType_GAUGE:
				got = s.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				got = s.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				if s.GetHistogram().GetSampleCount() != 1 {
					t.Errorf("%s%v has %d samples, want 1", tt.name, tt.labels, s.GetHistogram().GetSampleCount())
				}
				return
			}
			if got != tt.value {
				t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.value)
			}
		})
	}

	// A few Go runtime and process series, which kube-proxy also exposes.
	for _, name := range []string{"go_goroutines", "go_gc_duration_seconds", "process_cpu_seconds_total", "process_start_time_seconds"} {
		if families[name] == nil {
			t.Errorf("%s not exposed", name)
		}
	}
}

func TestHistogramBucketsMatchUpstream(t *testing.T) {
	// Built here independently of the package's bucket variables: upstream
	// uses ExponentialBuckets(0.001, 2, 15) for sync durations and
	// MergeBuckets(Linear(0.25,0.25,2), Linear(1,1,59), Linear(60,5,12),
	// Linear(120,30,7)), which starts with a 0 bucket, for network programming.
	var syncBuckets []float64
	for i := range 15 {
		syncBuckets = append(syncBuckets, 0.001*math.Pow(2, float64(i)))
	}
	npBuckets := []float64{0, 0.25, 0.5}
	for s := 1.0; s <= 59; s++ {
		npBuckets = append(npBuckets, s)
	}
	for s := 60.0; s <= 115; s += 5 {
		npBuckets = append(npBuckets, s)
	}
	for s := 120.0; s <= 300; s += 30 {
		npBuckets = append(npBuckets, s)
	}
	if len(npBuckets) != 81 {
		t.Fatalf("test bug: %d network programming buckets, upstream has 81", len(npBuckets))
	}

	m := New(IPv6)
	families := scrape(t, m.Handler())

	tests := []struct {
		name string
		want []float64
	}{
		{"kubeproxy_sync_proxy_rules_duration_seconds", syncBuckets},
		{"kubeproxy_sync_full_proxy_rules_duration_seconds", syncBuckets},
		{"kubeproxy_sync_partial_proxy_rules_duration_seconds", syncBuckets},
		{"kubeproxy_network_programming_duration_seconds", npBuckets},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := bucketBounds(findSeries(t, families, tt.name, map[string]string{"ip_family": "IPv6"}))
			if len(got) != len(tt.want) {
				t.Fatalf("%d buckets %v, want %d %v", len(got), got, len(tt.want), tt.want)
			}
			for i := range got {
				if math.Abs(got[i]-tt.want[i]) > 1e-9 {
					t.Fatalf("bucket %d is le=%v, want %v (all: %v)", i, got[i], tt.want[i], got)
				}
			}
		})
	}
}

func TestFamilySeriesAreSeparate(t *testing.T) {
	m := New(IPv4)
	m.SyncProxyRulesDuration.Observe(1)
	m.Family(IPv4).SyncProxyRulesDuration.Observe(1)
	m.Family(IPv6).SyncProxyRulesDuration.Observe(1)

	families := scrape(t, m.Handler())
	for family, want := range map[string]uint64{"IPv4": 2, "IPv6": 1} {
		s := findSeries(t, families, "kubeproxy_sync_proxy_rules_duration_seconds", map[string]string{"ip_family": family})
		if got := s.GetHistogram().GetSampleCount(); got != want {
			t.Errorf("ip_family=%s has %d samples, want %d", family, got, want)
		}
	}
}

func TestSetProxyModeKeepsOnlyTheActiveMode(t *testing.T) {
	m := New(IPv4)
	m.SetProxyMode("ebpf", "bpf-supported")
	m.SetProxyMode("iptables", "bpf-load-failed")

	families := scrape(t, m.Handler())
	var modes []string
	for _, s := range families["ebpfproxy_proxy_mode"].GetMetric() {
		modes = append(modes, labelsOf(s)["mode"]+","+labelsOf(s)["reason"]+"="+strconv.FormatFloat(s.GetGauge().GetValue(), 'g', -1, 64))
	}
	sort.Strings(modes)
	if !slices.Equal(modes, []string{"iptables,bpf-load-failed=1"}) {
		t.Errorf("ebpfproxy_proxy_mode series %v, want only iptables,bpf-load-failed=1", modes)
	}
}

func TestNewRejectsUnknownIPFamily(t *testing.T) {
	for _, family := range []string{"", "ipv4", "v4", "IPv5"} {
		t.Run(family, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%q) did not panic", family)
				}
			}()
			New(family)
		})
	}
}

func TestInstancesDoNotShareState(t *testing.T) {
	a, b := New(IPv4), New(IPv4)
	a.ServiceChangesTotal.Inc()

	s := findSeries(t, scrape(t, b.Handler()), "kubeproxy_sync_proxy_rules_service_changes_total", map[string]string{})
	if got := s.GetCounter().GetValue(); got != 0 {
		t.Errorf("second instance counts %v service changes made on the first", got)
	}
}
