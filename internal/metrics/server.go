package metrics

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultServerAddress is kube-proxy's default metricsBindAddress (IPv4 form).
const DefaultServerAddress = "127.0.0.1:10249"

// pingCheck is the only check behind the metrics server's /healthz, as in
// kube-proxy, where healthz.InstallHandler is called without checks and so
// installs apiserver's PingHealthz.
const pingCheck = "ping"

// healthzType is the "type" label of the SLI metrics: apiserver uses the
// first path segment of the health endpoint.
const healthzType = "healthz"

// NewServerMux returns the handler of the metrics server (kube-proxy's
// metricsBindAddress, default 127.0.0.1:10249) with kube-proxy's endpoints:
//
//   - /metrics: the registry of m in Prometheus text format;
//   - /metrics/slis: kubernetes_healthcheck and kubernetes_healthchecks_total
//     for the checks behind /healthz (DELETE resets them, as upstream);
//   - /healthz and /healthz/ping: the apiserver-style ping check, "ok" with
//     ?verbose and ?exclude= handled as apiserver does;
//   - /proxyMode: the proxy mode name in plain text.
//
// The metrics server has no /livez: kube-proxy serves /livez only on the
// proxier health server. Callers add /configz or /debug/pprof to the returned
// mux if they want them. Unknown paths get 404.
func NewServerMux(m *Metrics, proxyMode string) *http.ServeMux {
	mux := http.NewServeMux()
	slis := newSLIMetrics()

	mux.Handle("/metrics", m.Handler())
	mux.Handle("/metrics/slis", slis.handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		servePing(w, r, slis)
	})
	mux.HandleFunc("/healthz/"+pingCheck, func(w http.ResponseWriter, _ *http.Request) {
		// apiserver's per-check handler sets no headers of its own.
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, proxyMode)
	})
	return mux
}

// servePing reproduces apiserver's root health handler for a single check that
// always passes. Reproduced rather than imported because k8s.io/apiserver
// would pull a large dependency tree into the agent for twenty lines.
func servePing(w http.ResponseWriter, r *http.Request, slis *sliMetrics) {
	query := r.URL.Query()
	var out strings.Builder
	unknownExcluded := make(map[string]bool)
	for _, name := range query["exclude"] {
		unknownExcluded[name] = true
	}
	if unknownExcluded[pingCheck] {
		delete(unknownExcluded, pingCheck)
		fmt.Fprintf(&out, "[+]%s excluded: ok\n", pingCheck)
	} else {
		slis.observe(pingCheck, healthzType, true)
		fmt.Fprintf(&out, "[+]%s ok\n", pingCheck)
	}
	if len(unknownExcluded) > 0 {
		// apiserver lists them sorted (sets.String.List) and quoted.
		names := make([]string, 0, len(unknownExcluded))
		for name := range unknownExcluded {
			names = append(names, strconv.Quote(name))
		}
		slices.Sort(names)
		fmt.Fprintf(&out, "warn: some health checks cannot be excluded: no matches for %s\n", strings.Join(names, ","))
	}

	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if _, verbose := query["verbose"]; !verbose {
		fmt.Fprint(w, "ok")
		return
	}
	fmt.Fprintf(w, "%s%s check passed\n", out.String(), healthzType)
}

// sliMetrics is component-base's /metrics/slis registry for one server.
type sliMetrics struct {
	registry     *prometheus.Registry
	healthcheck  *prometheus.GaugeVec
	healthchecks *prometheus.CounterVec
}

func newSLIMetrics() *sliMetrics {
	s := &sliMetrics{
		registry: prometheus.NewRegistry(),
		healthcheck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kubernetes",
			Name:      "healthcheck",
			Help:      "[STABLE] This metric records the result of a single healthcheck.",
		}, []string{"name", "type"}),
		healthchecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubernetes",
			Name:      "healthchecks_total",
			Help:      "[STABLE] This metric records the results of all healthcheck.",
		}, []string{"name", "type", "status"}),
	}
	startTime := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "process_start_time_seconds",
		Help: alpha + "Start time of the process since unix epoch in seconds.",
	})
	startTime.Set(processStartTime())
	s.registry.MustRegister(s.healthcheck, s.healthchecks, startTime)
	return s
}

func (s *sliMetrics) observe(name, typ string, ok bool) {
	status, value := "success", 1.0
	if !ok {
		status, value = "error", 0
	}
	s.healthcheck.WithLabelValues(name, typ).Set(value)
	s.healthchecks.WithLabelValues(name, typ, status).Inc()
}

func (s *sliMetrics) handler() http.Handler {
	scrape := promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			// component-base's HandlerWithReset: resettable metrics are
			// cleared, process_start_time_seconds stays.
			s.healthcheck.Reset()
			s.healthchecks.Reset()
			fmt.Fprint(w, "metrics reset\n")
			return
		}
		scrape.ServeHTTP(w, r)
	})
}

// processStartTime reads process_start_time_seconds from the process
// collector, falling back to now where /proc is unavailable, as component-base
// does.
func processStartTime() float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	families, err := reg.Gather()
	if err == nil {
		for _, f := range families {
			if f.GetName() == "process_start_time_seconds" && len(f.GetMetric()) == 1 {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
	}
	return float64(time.Now().Unix())
}
