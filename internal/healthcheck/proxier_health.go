package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// DefaultProxierHealthAddress is kube-proxy's default healthzBindAddress (IPv4 form).
const DefaultProxierHealthAddress = "0.0.0.0:10256"

// ToBeDeletedTaint is the taint key the Cluster Autoscaler puts on a Node it
// is about to delete; /healthz fails on such a node so that load balancers
// drain it first (KEP-3836).
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// shutdownGrace bounds how long Serve waits for in-flight probes once its
// context is cancelled; probes are tiny, so this only matters for stuck clients.
const shutdownGrace = 5 * time.Second

// Clock tells the time. Tests inject a fake one; production uses the wall clock.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// NodeStatus is what the proxier health server needs to know about this
// node's Node object. The caller fills it from the informer's Node.
type NodeStatus struct {
	// Deleting is true when the Node has a metadata.deletionTimestamp.
	Deleting bool
	// TaintKeys are the keys of the Node's spec.taints.
	TaintKeys []string
}

// Eligible reports whether the node should receive load-balancer traffic:
// the Node object is known (n is not nil), is not being deleted, and does
// not carry ToBeDeletedTaint.
func (n *NodeStatus) Eligible() bool {
	return n != nil && !n.Deleting && !slices.Contains(n.TaintKeys, ToBeDeletedTaint)
}

// ProxierHealth is the health of the sync loop of one IP family, as reported
// under "status" in the /healthz and /livez bodies.
type ProxierHealth struct {
	// LastUpdated is the family's latest successful sync (or sync loop start).
	LastUpdated time.Time `json:"lastUpdated"`
	// Healthy is false iff an update has been pending for healthTimeout or longer.
	Healthy bool `json:"healthy"`
}

// ProxyHealth is the JSON body of /healthz and /livez. Field names, order and
// omission rules are kube-proxy's, because probes and tooling parse them.
type ProxyHealth struct {
	// LastUpdated is the latest successful sync of any family; responses with
	// status 200 replace it with the current time, as kube-proxy does for
	// compatibility with releases where it meant "sync loop is alive".
	LastUpdated time.Time `json:"lastUpdated"`
	// CurrentTime is the server's time when the response was built.
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set only in /healthz responses.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when no family has an update pending for healthTimeout
	// or longer. It ignores node eligibility even in /healthz responses.
	Healthy bool `json:"healthy"`
	// Status holds the health of each family whose sync loop has started,
	// keyed by "IPv4" / "IPv6".
	Status map[string]ProxierHealth `json:"status,omitempty"`
}

// ProxyHealthServer tracks whether the sync loops keep up with the changes
// queued for them and serves kube-proxy's /healthz and /livez from that:
//
//   - QueuedUpdate(family) is called whenever a sync is requested; it records
//     the time of the oldest request not yet synced.
//   - Updated(family) is called after every successful sync and once when the
//     sync loop starts, so that a freshly started agent is healthy.
//   - A family is unhealthy iff it has an update pending for healthTimeout or
//     longer. An idle agent stays healthy no matter how long ago it synced.
//   - /livez is 200 iff every family is healthy; /healthz additionally
//     requires the node to be eligible (see SetNode). Otherwise 503.
//
// All methods are safe for concurrent use.
type ProxyHealthServer struct {
	addr          string
	healthTimeout time.Duration
	clock         Clock
	logger        *zap.Logger

	// healthzTotal and livezTotal count responses by code; nil without metrics.
	healthzTotal *prometheus.CounterVec
	livezTotal   *prometheus.CounterVec

	mu                  sync.RWMutex
	lastUpdated         map[string]time.Time
	oldestPendingQueued map[string]time.Time
	nodeEligible        bool

	// reportedHealthy is the proxier health last logged, so that a probe
	// every few seconds logs only changes.
	reportedHealthy atomic.Bool
}

// Option configures a ProxyHealthServer.
type Option func(*ProxyHealthServer)

// WithClock replaces the wall clock, for tests.
func WithClock(c Clock) Option {
	return func(s *ProxyHealthServer) { s.clock = c }
}

// WithLogger sets the logger for start-up, shutdown and health transitions.
// The default (and a nil logger) discards everything.
func WithLogger(l *zap.Logger) Option {
	return func(s *ProxyHealthServer) {
		if l != nil {
			s.logger = l
		}
	}
}

// NewProxyHealthServer returns a server that will listen on addr (see Run).
// healthTimeout is how long an update may stay pending before the agent is
// unhealthy; kube-proxy uses twice its sync period. Responses are counted in
// m's kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total; m may be
// nil when metrics are not wanted.
//
// It returns an error if healthTimeout is not positive, since every queued
// update would then make the agent unhealthy at once.
func NewProxyHealthServer(addr string, healthTimeout time.Duration, m *metrics.Metrics, opts ...Option) (*ProxyHealthServer, error) {
	if healthTimeout <= 0 {
		return nil, fmt.Errorf("proxier health timeout must be positive, got %v", healthTimeout)
	}
	s := &ProxyHealthServer{
		addr:                addr,
		healthTimeout:       healthTimeout,
		clock:               realClock{},
		logger:              zap.NewNop(),
		lastUpdated:         make(map[string]time.Time),
		oldestPendingQueued: make(map[string]time.Time),
	}
	if m != nil {
		s.healthzTotal, s.livezTotal = m.ProxyHealthzTotal, m.ProxyLivezTotal
	}
	for _, opt := range opts {
		opt(s)
	}
	s.reportedHealthy.Store(true)
	return s, nil
}

// QueuedUpdate records that the sync loop of ipFamily was asked to sync.
// Only the oldest request since the last successful sync counts, so a steady
// stream of changes cannot hide a stuck loop.
func (s *ProxyHealthServer) QueuedUpdate(ipFamily string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, pending := s.oldestPendingQueued[ipFamily]; !pending {
		s.oldestPendingQueued[ipFamily] = s.clock.Now()
	}
}

// Updated records a successful sync of ipFamily (or the start of its sync
// loop): nothing is pending any more and lastUpdated is now.
func (s *ProxyHealthServer) Updated(ipFamily string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.oldestPendingQueued, ipFamily)
	s.lastUpdated[ipFamily] = s.clock.Now()
}

// SetNode records the state of this node's Node object; nil means the Node
// is not known (not yet seen, or the caller saw it deleted). Until the first
// call the node is not eligible, as in kube-proxy, so /healthz fails until
// the Node has been seen.
func (s *ProxyHealthServer) SetNode(node *NodeStatus) {
	eligible := node.Eligible()
	s.mu.Lock()
	changed := eligible != s.nodeEligible
	s.nodeEligible = eligible
	s.mu.Unlock()
	if changed {
		s.logger.Info("Node eligibility for load-balancer traffic changed",
			zap.Bool("eligible", eligible),
			zap.Bool("nodeKnown", node != nil),
			zap.Bool("deleting", node != nil && node.Deleting),
			zap.Bool("toBeDeletedTaint", node != nil && slices.Contains(node.TaintKeys, ToBeDeletedTaint)))
	}
}

// NodeEligible reports whether the node is eligible for load-balancer
// traffic as of the last SetNode call.
func (s *ProxyHealthServer) NodeEligible() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.nodeEligible
}

// Health returns the proxier health, ignoring node eligibility (so
// NodeEligible is nil). Families whose sync loop never called Updated are
// not reported and cannot make the agent unhealthy, as in kube-proxy: the
// loop calls Updated before anything can be queued for it.
func (s *ProxyHealthServer) Health() ProxyHealth {
	s.mu.RLock()
	defer s.mu.RUnlock()

	now := s.clock.Now()
	health := ProxyHealth{
		CurrentTime: now,
		Healthy:     true,
		Status:      make(map[string]ProxierHealth, len(s.lastUpdated)),
	}
	for family, updated := range s.lastUpdated {
		if updated.After(health.LastUpdated) {
			health.LastUpdated = updated
		}
		healthy := true
		if queued, pending := s.oldestPendingQueued[family]; pending && now.Sub(queued) >= s.healthTimeout {
			healthy = false
			health.Healthy = false
		}
		health.Status[family] = ProxierHealth{LastUpdated: updated, Healthy: healthy}
	}
	return health
}

// IsHealthy reports the proxier health as /livez does, ignoring the node.
func (s *ProxyHealthServer) IsHealthy() bool {
	return s.Health().Healthy
}

// Handler returns the mux of the proxier health server: /healthz and /livez,
// any method; other paths get 404.
func (s *ProxyHealthServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", s.serveHealthz)
	mux.HandleFunc("/livez", s.serveLivez)
	return mux
}

func (s *ProxyHealthServer) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	health := s.Health()
	s.noteHealth(health)
	eligible := s.NodeEligible()
	health.NodeEligible = &eligible
	s.respond(w, health, health.Healthy && eligible, s.healthzTotal)
}

func (s *ProxyHealthServer) serveLivez(w http.ResponseWriter, _ *http.Request) {
	health := s.Health()
	s.noteHealth(health)
	s.respond(w, health, health.Healthy, s.livezTotal)
}

func (s *ProxyHealthServer) respond(w http.ResponseWriter, health ProxyHealth, healthy bool, counter *prometheus.CounterVec) {
	code := http.StatusServiceUnavailable
	if healthy {
		code = http.StatusOK
		// kube-proxy reports "now" on success for compatibility with
		// releases where lastUpdated meant "the sync loop is alive".
		health.LastUpdated = s.clock.Now()
	}
	if counter != nil {
		counter.WithLabelValues(strconv.Itoa(code)).Inc()
	}
	body, err := json.Marshal(health)
	if err != nil {
		// Only time values outside year 0-9999 can fail to marshal.
		s.logger.Error("Encoding proxier health failed", zap.Error(err))
		http.Error(w, "encoding health failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// noteHealth logs when the proxier health changes, naming the families that
// are late, since the probe that notices it only sees a 503.
func (s *ProxyHealthServer) noteHealth(health ProxyHealth) {
	if s.reportedHealthy.Swap(health.Healthy) == health.Healthy {
		return
	}
	if health.Healthy {
		s.logger.Info("Proxier is healthy again")
		return
	}
	var late []string
	for family, st := range health.Status {
		if !st.Healthy {
			late = append(late, family)
		}
	}
	slices.Sort(late)
	s.logger.Warn("Proxier is unhealthy: queued updates not synced within the health timeout",
		zap.Strings("ipFamilies", late), zap.Duration("healthTimeout", s.healthTimeout))
}

// Run listens on the configured address and serves until ctx is cancelled
// (then it returns nil) or serving fails. A listen failure is returned
// wrapped with the address; kube-proxy retries it every 5s unless
// bindAddressHardFail is set, which is the caller's decision.
func (s *ProxyHealthServer) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen for proxier health on %s: %w", s.addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled (then it shuts down gracefully
// and returns nil) or serving fails. It closes ln.
func (s *ProxyHealthServer) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(s.logger),
	}
	s.logger.Info("Starting proxier health server", zap.String("address", ln.Addr().String()))

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err := <-served:
		return fmt.Errorf("proxier health server on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down proxier health server on %s: %w", ln.Addr(), err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("proxier health server on %s: %w", ln.Addr(), err)
	}
	return nil
}
