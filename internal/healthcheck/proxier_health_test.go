package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

const timeout = 60 * time.Second

// t0 is an arbitrary start time; a non-UTC zone checks that times are
// reported in the clock's zone, as kube-proxy does with time.Now().
var t0 = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.FixedZone("CET", 3600))

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// step is one thing that happens to the server in a scenario.
type step func(s *ProxyHealthServer, c *fakeClock)

func queued(family string) step {
	return func(s *ProxyHealthServer, _ *fakeClock) { s.QueuedUpdate(family) }
}

func updated(family string) step {
	return func(s *ProxyHealthServer, _ *fakeClock) { s.Updated(family) }
}

func wait(d time.Duration) step {
	return func(_ *ProxyHealthServer, c *fakeClock) { c.Step(d) }
}

func node(n *NodeStatus) step {
	return func(s *ProxyHealthServer, _ *fakeClock) { s.SetNode(n) }
}

var eligibleNode = &NodeStatus{TaintKeys: []string{"node-role.kubernetes.io/control-plane"}}

func newTestServer(t *testing.T) (*ProxyHealthServer, *fakeClock, *metrics.Metrics) {
	t.Helper()
	c := &fakeClock{now: t0}
	m := metrics.New(metrics.IPv4)
	s, err := NewProxyHealthServer(DefaultProxierHealthAddress, timeout, m, WithClock(c))
	if err != nil {
		t.Fatalf("NewProxyHealthServer: %v", err)
	}
	return s, c, m
}

// body mirrors the JSON a probe receives; pointers tell absent from zero.
type body struct {
	LastUpdated  *time.Time `json:"lastUpdated"`
	CurrentTime  *time.Time `json:"currentTime"`
	NodeEligible *bool      `json:"nodeEligible"`
	Healthy      *bool      `json:"healthy"`
	Status       map[string]struct {
		LastUpdated time.Time `json:"lastUpdated"`
		Healthy     bool      `json:"healthy"`
	} `json:"status"`
}

func probe(t *testing.T, h http.Handler, path string) (int, body) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if got := rec.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("GET %s: Content-Type %q, want application/json", path, got)
	}
	if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("GET %s: X-Content-Type-Options %q, want nosniff", path, got)
	}
	var b body
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatalf("GET %s: body %q is not JSON: %v", path, rec.Body.String(), err)
	}
	if b.LastUpdated == nil || b.CurrentTime == nil || b.Healthy == nil {
		t.Fatalf("GET %s: body %q lacks lastUpdated, currentTime or healthy", path, rec.Body.String())
	}
	return rec.Code, b
}

func TestProxierHealth(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		// Expected responses.
		healthz, livez int
		// healthy is the "healthy" field (proxier health only).
		healthy bool
		// family health under "status"; families not listed must be absent.
		status map[string]bool
		// lastUpdated on 503 responses: the latest successful sync.
		lastSync time.Time
		eligible bool
	}{
		{
			name:    "nothing started and node unknown: livez ok, healthz fails on the node",
			healthz: 503, livez: 200, healthy: true, status: map[string]bool{}, eligible: false,
		},
		{
			name:    "sync loop started on an eligible node: healthy",
			steps:   []step{node(eligibleNode), updated("IPv4")},
			healthz: 200, livez: 200, healthy: true, status: map[string]bool{"IPv4": true}, eligible: true,
		},
		{
			name:    "idle for far longer than the timeout: still healthy",
			steps:   []step{node(eligibleNode), updated("IPv4"), wait(100 * timeout)},
			healthz: 200, livez: 200, healthy: true, status: map[string]bool{"IPv4": true}, eligible: true,
		},
		{
			name:    "update queued just under the timeout ago: healthy",
			steps:   []step{node(eligibleNode), updated("IPv4"), queued("IPv4"), wait(timeout - time.Nanosecond)},
			healthz: 200, livez: 200, healthy: true, status: map[string]bool{"IPv4": true}, eligible: true,
		},
		{
			name:    "update queued exactly the timeout ago: unhealthy",
			steps:   []step{node(eligibleNode), updated("IPv4"), wait(time.Second), queued("IPv4"), wait(timeout)},
			healthz: 503, livez: 503, healthy: false, status: map[string]bool{"IPv4": false},
			lastSync: t0, eligible: true,
		},
		{
			name:    "update queued longer than the timeout ago: unhealthy",
			steps:   []step{node(eligibleNode), updated("IPv4"), queued("IPv4"), wait(5 * timeout)},
			healthz: 503, livez: 503, healthy: false, status: map[string]bool{"IPv4": false},
			lastSync: t0, eligible: true,
		},
		{
			name: "later queued updates do not reset the oldest pending one",
			steps: []step{node(eligibleNode), updated("IPv4"), queued("IPv4"), wait(timeout / 2),
				queued("IPv4"), wait(timeout / 2)},
			healthz: 503, livez: 503, healthy: false, status: map[string]bool{"IPv4": false},
			lastSync: t0, eligible: true,
		},
		{
			name: "a successful sync after a late update clears it",
			steps: []step{node(eligibleNode), updated("IPv4"), queued("IPv4"), wait(2 * timeout),
				updated("IPv4"), wait(time.Second)},
			healthz: 200, livez: 200, healthy: true, status: map[string]bool{"IPv4": true}, eligible: true,
		},
		{
			name: "after a sync, a new queued update starts a new timeout",
			steps: []step{node(eligibleNode), updated("IPv4"), queued("IPv4"), wait(timeout - time.Second),
				updated("IPv4"), queued("IPv4"), wait(timeout - time.Second)},
			healthz: 200, livez: 200, healthy: true, status: map[string]bool{"IPv4": true}, eligible: true,
		},
		{
			name: "dual-stack: one late family makes the agent unhealthy",
			steps: []step{node(eligibleNode), updated("IPv4"), updated("IPv6"), wait(time.Second),
				queued("IPv6"), queued("IPv4"), wait(time.Second), updated("IPv4"), wait(timeout)},
			healthz: 503, livez: 503, healthy: false, status: map[string]bool{"IPv4": true, "IPv6": false},
			lastSync: t0.Add(2 * time.Second), eligible: true,
		},
		{
			name:    "queued update for a family whose sync loop never started is not reported",
			steps:   []step{node(eligibleNode), updated("IPv4"), queued("IPv6"), wait(2 * timeout)},
			healthz: 200, livez: 200, healthy: true, status: map[string]bool{"IPv4": true}, eligible: true,
		},
		{
			name:    "node being deleted: healthz fails, livez ok",
			steps:   []step{node(&NodeStatus{Deleting: true}), updated("IPv4")},
			healthz: 503, livez: 200, healthy: true, status: map[string]bool{"IPv4": true},
			lastSync: t0, eligible: false,
		},
		{
			name:    "node tainted by the cluster autoscaler: healthz fails, livez ok",
			steps:   []step{node(&NodeStatus{TaintKeys: []string{"example.com/foo", ToBeDeletedTaint}}), updated("IPv4")},
			healthz: 503, livez: 200, healthy: true, status: map[string]bool{"IPv4": true},
			lastSync: t0, eligible: false,
		},
		{
			name:    "node forgotten after being eligible: healthz fails",
			steps:   []step{node(eligibleNode), updated("IPv4"), node(nil)},
			healthz: 503, livez: 200, healthy: true, status: map[string]bool{"IPv4": true},
			lastSync: t0, eligible: false,
		},
		{
			name:    "taint removed again: eligible",
			steps:   []step{node(&NodeStatus{TaintKeys: []string{ToBeDeletedTaint}}), node(eligibleNode), updated("IPv4")},
			healthz: 200, livez: 200, healthy: true, status: map[string]bool{"IPv4": true}, eligible: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c, _ := newTestServer(t)
			for _, st := range tt.steps {
				st(s, c)
			}
			now := c.Now()
			h := s.Handler()

			for _, p := range []struct {
				path string
				want int
			}{{"/healthz", tt.healthz}, {"/livez", tt.livez}} {
				code, b := probe(t, h, p.path)
				if code != p.want {
					t.Errorf("GET %s: status %d, want %d", p.path, code, p.want)
				}
				if *b.Healthy != tt.healthy {
					t.Errorf("GET %s: healthy %v, want %v", p.path, *b.Healthy, tt.healthy)
				}
				if !b.CurrentTime.Equal(now) {
					t.Errorf("GET %s: currentTime %v, want %v", p.path, b.CurrentTime, now)
				}
				wantLast := tt.lastSync
				if code == http.StatusOK {
					wantLast = now
				}
				if !b.LastUpdated.Equal(wantLast) {
					t.Errorf("GET %s: lastUpdated %v, want %v", p.path, b.LastUpdated, wantLast)
				}
				switch {
				case p.path == "/livez" && b.NodeEligible != nil:
					t.Errorf("GET /livez: has nodeEligible=%v, want the field absent", *b.NodeEligible)
				case p.path == "/healthz" && b.NodeEligible == nil:
					t.Errorf("GET /healthz: nodeEligible absent")
				case p.path == "/healthz" && *b.NodeEligible != tt.eligible:
					t.Errorf("GET /healthz: nodeEligible %v, want %v", *b.NodeEligible, tt.eligible)
				}
				if len(b.Status) != len(tt.status) {
					t.Errorf("GET %s: status has families %v, want %v", p.path, b.Status, tt.status)
				}
				for family, healthy := range tt.status {
					got, ok := b.Status[family]
					if !ok || got.Healthy != healthy {
						t.Errorf("GET %s: status[%s] = %+v (present %v), want healthy %v", p.path, family, got, ok, healthy)
					}
				}
			}
			if got := s.IsHealthy(); got != tt.healthy {
				t.Errorf("IsHealthy() = %v, want %v", got, tt.healthy)
			}
			if got := s.NodeEligible(); got != tt.eligible {
				t.Errorf("NodeEligible() = %v, want %v", got, tt.eligible)
			}
		})
	}
}

func TestProxierHealthBodyFormat(t *testing.T) {
	utc := time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	tests := []struct {
		name string
		path string
		prep func(s *ProxyHealthServer, c *fakeClock)
		want string
	}{
		{
			name: "healthz, healthy single-stack",
			path: "/healthz",
			prep: func(s *ProxyHealthServer, c *fakeClock) {
				s.SetNode(eligibleNode)
				s.Updated("IPv4")
				c.Step(1500 * time.Millisecond)
			},
			want: `{"lastUpdated":"2025-03-14T15:09:27.5Z","currentTime":"2025-03-14T15:09:27.5Z","nodeEligible":true,"healthy":true,` +
				`"status":{"IPv4":{"lastUpdated":"2025-03-14T15:09:26Z","healthy":true}}}`,
		},
		{
			name: "livez, dual-stack with IPv6 late",
			path: "/livez",
			prep: func(s *ProxyHealthServer, c *fakeClock) {
				s.Updated("IPv6")
				s.Updated("IPv4")
				s.QueuedUpdate("IPv6")
				c.Step(timeout)
			},
			want: `{"lastUpdated":"2025-03-14T15:09:26Z","currentTime":"2025-03-14T15:10:26Z","healthy":false,` +
				`"status":{"IPv4":{"lastUpdated":"2025-03-14T15:09:26Z","healthy":true},"IPv6":{"lastUpdated":"2025-03-14T15:09:26Z","healthy":false}}}`,
		},
		{
			name: "healthz before anything happened: no status",
			path: "/healthz",
			prep: func(*ProxyHealthServer, *fakeClock) {},
			want: `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2025-03-14T15:09:26Z","nodeEligible":false,"healthy":true}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &fakeClock{now: utc}
			s, err := NewProxyHealthServer(DefaultProxierHealthAddress, timeout, nil, WithClock(c))
			if err != nil {
				t.Fatalf("NewProxyHealthServer: %v", err)
			}
			tt.prep(s, c)
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
			if got := rec.Body.String(); got != tt.want {
				t.Errorf("body\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestProxierHealthCountsResponsesByCode(t *testing.T) {
	s, c, m := newTestServer(t)
	h := s.Handler()
	s.Updated("IPv4")

	// Node unknown: healthz 503, livez 200.
	probe(t, h, "/healthz")
	probe(t, h, "/livez")
	// Eligible and healthy: both 200, twice.
	s.SetNode(eligibleNode)
	for range 2 {
		probe(t, h, "/healthz")
		probe(t, h, "/livez")
	}
	// Late update: both 503.
	s.QueuedUpdate("IPv4")
	c.Step(timeout)
	probe(t, h, "/healthz")
	probe(t, h, "/livez")

	tests := []struct {
		name string
		vec  func() float64
		want float64
	}{
		{"healthz 200", func() float64 { return testutil.ToFloat64(m.ProxyHealthzTotal.WithLabelValues("200")) }, 2},
		{"healthz 503", func() float64 { return testutil.ToFloat64(m.ProxyHealthzTotal.WithLabelValues("503")) }, 2},
		{"livez 200", func() float64 { return testutil.ToFloat64(m.ProxyLivezTotal.WithLabelValues("200")) }, 3},
		{"livez 503", func() float64 { return testutil.ToFloat64(m.ProxyLivezTotal.WithLabelValues("503")) }, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.vec(); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestProxierHealthOnlyServesItsPaths(t *testing.T) {
	s, _, _ := newTestServer(t)
	for _, path := range []string{"/", "/metrics", "/healthz/ping", "/livez/"} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", path, rec.Code)
		}
	}
}

func TestNewProxyHealthServerRejectsNonPositiveTimeout(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := NewProxyHealthServer(DefaultProxierHealthAddress, d, nil); err == nil {
			t.Errorf("NewProxyHealthServer(timeout %v) succeeded, want an error", d)
		}
	}
}

func TestServeOverTCPUntilCancelled(t *testing.T) {
	s, _, _ := newTestServer(t)
	s.SetNode(eligibleNode)
	s.Updated("IPv4")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()

	resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz over TCP: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz over TCP: status %d, body %s", resp.StatusCode, b)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel returned %v, want nil", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Errorf("listener %s still accepts connections after Serve returned", ln.Addr())
	}
}

func TestRunReportsListenFailure(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = busy.Close() })

	s, err := NewProxyHealthServer(busy.Addr().String(), timeout, nil)
	if err != nil {
		t.Fatalf("NewProxyHealthServer: %v", err)
	}
	err = s.Run(context.Background())
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Fatalf("Run on a busy address returned %v, want a wrapped *net.OpError", err)
	}
}

func TestProxierHealthLogsTransitionsOnce(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	c := &fakeClock{now: t0}
	s, err := NewProxyHealthServer(DefaultProxierHealthAddress, timeout, nil, WithClock(c), WithLogger(zap.New(core)))
	if err != nil {
		t.Fatalf("NewProxyHealthServer: %v", err)
	}
	h := s.Handler()

	s.SetNode(eligibleNode)
	s.SetNode(eligibleNode) // no change, no log
	s.Updated("IPv4")
	s.Updated("IPv6")
	s.QueuedUpdate("IPv6")
	c.Step(timeout)
	for range 3 {
		probe(t, h, "/healthz")
		probe(t, h, "/livez")
	}
	s.Updated("IPv6")
	probe(t, h, "/livez")
	probe(t, h, "/healthz")

	type entry struct {
		level zapcore.Level
		msg   string
	}
	var got []entry
	for _, e := range logs.All() {
		got = append(got, entry{e.Level, e.Message})
	}
	want := []entry{
		{zapcore.InfoLevel, "Node eligibility for load-balancer traffic changed"},
		{zapcore.WarnLevel, "Proxier is unhealthy: queued updates not synced within the health timeout"},
		{zapcore.InfoLevel, "Proxier is healthy again"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("logged %v, want %v", got, want)
	}
	late := logs.FilterMessageSnippet("unhealthy").All()[0].ContextMap()["ipFamilies"]
	if fmt.Sprint(late) != "[IPv6]" {
		t.Errorf("unhealthy log names families %v, want [IPv6]", late)
	}
}

func TestProxierHealthConcurrentUse(t *testing.T) {
	s, c, _ := newTestServer(t)
	h := s.Handler()
	var wg sync.WaitGroup
	for i := range 4 {
		family := []string{"IPv4", "IPv6"}[i%2]
		wg.Go(func() {
			for range 200 {
				s.QueuedUpdate(family)
				s.SetNode(eligibleNode)
				s.Updated(family)
			}
		})
		wg.Go(func() {
			for range 200 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			}
		})
	}
	wg.Wait()
	c.Step(10 * timeout)
	if code, _ := probe(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("after every queued update was synced: healthz %d, want 200", code)
	}
}
