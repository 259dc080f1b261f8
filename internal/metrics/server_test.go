package metrics

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func get(t *testing.T, h http.Handler, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec
}

func TestServerMuxEndpoints(t *testing.T) {
	mux := NewServerMux(New(IPv4), "ebpf")

	tests := []struct {
		name        string
		target      string
		wantCode    int
		wantBody    string
		wantType    string
		wantNoSniff bool
	}{
		{"proxyMode is the mode name in plain text", "/proxyMode", 200, "ebpf", "text/plain; charset=utf-8", true},
		{"healthz is an apiserver ping", "/healthz", 200, "ok", "text/plain; charset=utf-8", true},
		{"healthz verbose lists the ping check", "/healthz?verbose", 200, "[+]ping ok\nhealthz check passed\n", "text/plain; charset=utf-8", true},
		{"healthz verbose with the ping check excluded", "/healthz?verbose&exclude=ping", 200, "[+]ping excluded: ok\nhealthz check passed\n", "text/plain; charset=utf-8", true},
		{"healthz warns about excluding unknown checks", "/healthz?verbose&exclude=zz&exclude=etcd", 200,
			"[+]ping ok\nwarn: some health checks cannot be excluded: no matches for \"etcd\",\"zz\"\nhealthz check passed\n", "text/plain; charset=utf-8", true},
		{"healthz/ping is the single check", "/healthz/ping", 200, "ok", "text/plain; charset=utf-8", false},
		{"no livez on the metrics server", "/livez", 404, "404 page not found\n", "text/plain; charset=utf-8", true},
		{"unknown path", "/", 404, "404 page not found\n", "text/plain; charset=utf-8", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := get(t, mux, http.MethodGet, tt.target)
			if rec.Code != tt.wantCode {
				t.Errorf("status %d, want %d", rec.Code, tt.wantCode)
			}
			if got := rec.Body.String(); got != tt.wantBody {
				t.Errorf("body %q, want %q", got, tt.wantBody)
			}
			if got := rec.Header().Get("Content-Type"); got != tt.wantType {
				t.Errorf("Content-Type %q, want %q", got, tt.wantType)
			}
			if got := rec.Header().Get("X-Content-Type-Options") == "nosniff"; got != tt.wantNoSniff {
				t.Errorf("X-Content-Type-Options nosniff = %v, want %v", got, tt.wantNoSniff)
			}
		})
	}
}

func TestServerMuxServesTheRegistry(t *testing.T) {
	m := New(IPv4)
	m.ServiceChangesTotal.Add(3)
	families := scrape(t, NewServerMux(m, "ebpf"))

	s := findSeries(t, families, "kubeproxy_sync_proxy_rules_service_changes_total", map[string]string{})
	if got := s.GetCounter().GetValue(); got != 3 {
		t.Errorf("kubeproxy_sync_proxy_rules_service_changes_total = %v through the server mux, want 3", got)
	}
}

func TestServerMuxSLIMetricsCountPings(t *testing.T) {
	mux := NewServerMux(New(IPv4), "iptables")
	sliLabels := map[string]string{"name": "ping", "type": "healthz"}

	// scrape() requests /metrics; route it to /metrics/slis instead.
	slisHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.URL.Path = "/metrics/slis"
		mux.ServeHTTP(w, r)
	})

	get(t, mux, http.MethodGet, "/healthz")
	get(t, mux, http.MethodGet, "/healthz?verbose")
	get(t, mux, http.MethodGet, "/healthz?exclude=ping") // excluded checks are not observed

	families := scrape(t, slisHandler)
	total := findSeries(t, families, "kubernetes_healthchecks_total",
		map[string]string{"name": "ping", "type": "healthz", "status": "success"})
	if got := total.GetCounter().GetValue(); got != 2 {
		t.Errorf("kubernetes_healthchecks_total{status=success} = %v, want 2", got)
	}
	if got := findSeries(t, families, "kubernetes_healthcheck", sliLabels).GetGauge().GetValue(); got != 1 {
		t.Errorf("kubernetes_healthcheck = %v, want 1", got)
	}
	if f := families["process_start_time_seconds"]; f == nil || f.GetMetric()[0].GetGauge().GetValue() <= 0 {
		t.Errorf("process_start_time_seconds missing or not positive on /metrics/slis: %v", f)
	}

	rec := get(t, mux, http.MethodDelete, "/metrics/slis")
	if rec.Code != 200 || rec.Body.String() != "metrics reset\n" {
		t.Fatalf("DELETE /metrics/slis: %d %q, want 200 \"metrics reset\\n\"", rec.Code, rec.Body.String())
	}
	if f := scrape(t, slisHandler)["kubernetes_healthchecks_total"]; f != nil {
		t.Errorf("kubernetes_healthchecks_total still has series after reset: %v", f.GetMetric())
	}
}
