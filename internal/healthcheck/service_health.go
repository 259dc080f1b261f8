package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// HealthReporter is what the service health server asks of the proxier
// health server: whether the sync loops keep up. *ProxyHealthServer
// implements it.
type HealthReporter interface {
	IsHealthy() bool
}

// ListenFailureRecorder is told when a Service's health check node port
// cannot be bound, so that the agent can raise kube-proxy's Warning event
// FailedToStartServiceHealthcheck on the Service. msg is kube-proxy's
// event note.
type ListenFailureRecorder func(svc model.ServiceName, port uint16, msg string)

// ServiceHealthConfig configures a ServiceHealthServer.
type ServiceHealthConfig struct {
	// NodeName is this node's name: endpoints whose nodeName equals it are
	// local.
	NodeName string
	// Proxier reports the proxier's health; a Service is only healthy when
	// the proxier is (serviceProxyHealthy). Required.
	Proxier HealthReporter
	// Metrics receives the listen failure counter and the serving gauge;
	// nil records nothing.
	Metrics *metrics.Metrics
	// Logger logs opened and closed ports at debug level and listen
	// failures as errors; nil discards.
	Logger *zap.Logger
	// OnListenFailure, if set, is called for every failed listen.
	OnListenFailure ListenFailureRecorder
	// IPv6 makes this the IPv6 family's server: a dual-stack node runs one
	// per family, as kube-proxy does, each fed by its family's sync loop
	// (whose endpoints it counts) and listening on that family's
	// addresses only. False is IPv4.
	IPv6 bool
}

// ServiceHealthServer serves kube-proxy's health check node ports: for every
// Service with a healthCheckNodePort (type=LoadBalancer with
// externalTrafficPolicy=Local), an HTTP server on that port that answers
// any request with 200 while this node has a ready endpoint of the Service
// and the proxier is healthy, else 503, so that the cloud load balancer
// sends traffic only to nodes that can serve it locally. The count is the
// number of distinct ready endpoint IPs on this node over all the Service's
// ports (kube-proxy's LocalReadyEndpoints): terminating endpoints that still
// serve traffic do not count, so a draining node fails its check.
//
// Sync is called by the sync loop after every successful sync, from one
// goroutine; requests are served concurrently. Listeners are opened and
// closed as Services come and go; a port that cannot be bound is logged,
// counted and retried on the next sync, and never affects other Services.
type ServiceHealthServer struct {
	cfg ServiceHealthConfig
	log *zap.Logger

	// syncMu serialises Sync and Close and guards what follows.
	syncMu      sync.Mutex
	closed      bool
	resolved    bool
	listenAddrs []netip.Addr
	// members indexes the ServicePorts of each Service in the State that
	// has a health check node port (a Service field: all of its ports
	// carry it or none does), so that a partial sync revisits only the
	// Services it changed. The others, most Services, are not indexed:
	// a set per Service costs half a kilobyte.
	members map[model.ServiceName]map[model.ServicePortName]struct{}
	// wanted is the health check node port of every Service that has one.
	wanted map[model.ServiceName]uint16
	// failed are wanted Services whose port could not be bound.
	failed map[model.ServiceName]uint16

	mu sync.RWMutex
	// serving are the Services being served.
	serving map[model.ServiceName]*hcInstance
}

// hcInstance is one Service's health check: its listeners and the count it
// reports.
type hcInstance struct {
	name    model.ServiceName
	port    uint16
	servers []*http.Server
	// endpoints is read by request handlers while Sync updates it.
	endpoints atomic.Int64
}

// NewServiceHealthServer returns a server that serves nothing until the
// first Sync.
func NewServiceHealthServer(cfg ServiceHealthConfig) (*ServiceHealthServer, error) {
	if cfg.Proxier == nil {
		return nil, errors.New("service health server: no proxier health given")
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &ServiceHealthServer{
		cfg:     cfg,
		log:     log,
		members: map[model.ServiceName]map[model.ServicePortName]struct{}{},
		wanted:  map[model.ServiceName]uint16{},
		failed:  map[model.ServiceName]uint16{},
		serving: map[model.ServiceName]*hcInstance{},
	}, nil
}

// Sync brings the health checks in line with up.State: it opens ports for
// new Services, closes those of Services gone or no longer needing one
// (and reopens on a port change), updates every count, and retries ports
// that failed before. A partial update touches only the Services named in
// up.Changed. The State must be the one the dataplane just applied.
func (s *ServiceHealthServer) Sync(up model.Update) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.closed {
		return
	}
	st := up.State
	affected := map[model.ServiceName]struct{}{}
	s.resolveListenAddrs(&st.Node.NodePorts)
	if up.Full {
		for name := range s.wanted {
			affected[name] = struct{}{}
		}
		clear(s.members)
		for spn, svc := range st.Services {
			s.setMember(spn, svc)
			affected[spn.ServiceName] = struct{}{}
		}
	} else {
		for spn := range up.Changed {
			s.setMember(spn, st.Services[spn])
			affected[spn.ServiceName] = struct{}{}
		}
	}

	for name := range affected {
		port, count := s.desired(st, name)
		s.apply(name, port, count)
	}
	for name, port := range s.failed {
		if _, done := affected[name]; !done {
			s.apply(name, port, s.localReady(st, name))
		}
	}
	s.recordGauges()
}

// setMember indexes spn as svc (nil: gone from the State) has it: when it
// has a health check node port, else not at all.
func (s *ServiceHealthServer) setMember(spn model.ServicePortName, svc *model.Service) {
	m := s.members[spn.ServiceName]
	if svc == nil || svc.Port.HealthCheckNodePort == 0 {
		if m != nil {
			delete(m, spn)
			if len(m) == 0 {
				delete(s.members, spn.ServiceName)
			}
		}
		return
	}
	if m == nil {
		m = map[model.ServicePortName]struct{}{}
		s.members[spn.ServiceName] = m
	}
	m[spn] = struct{}{}
}

// desired returns the health check node port of Service name in st (0 for
// none) and its count of local ready endpoints. Every port of a Service
// carries the same healthCheckNodePort, since it is a Service field.
func (s *ServiceHealthServer) desired(st *model.State, name model.ServiceName) (uint16, int) {
	var port uint16
	for spn := range s.members[name] {
		if svc := st.Services[spn]; svc != nil && svc.Port.HealthCheckNodePort != 0 {
			port = svc.Port.HealthCheckNodePort
			break
		}
	}
	if port == 0 {
		return 0, 0
	}
	return port, s.localReady(st, name)
}

// localReady counts the distinct IPs of ready endpoints on this node over
// every port of the Service: a pod serving two ports is one endpoint.
func (s *ServiceHealthServer) localReady(st *model.State, name model.ServiceName) int {
	if s.cfg.NodeName == "" {
		return 0
	}
	ips := map[netip.Addr]struct{}{}
	for spn := range s.members[name] {
		svc := st.Services[spn]
		if svc == nil {
			continue
		}
		for i := range svc.Endpoints {
			ep := &svc.Endpoints[i]
			if ep.Ready && ep.NodeName == s.cfg.NodeName {
				ips[ep.Addr] = struct{}{}
			}
		}
	}
	return len(ips)
}

// apply makes Service name served on port (0: not at all) with count.
func (s *ServiceHealthServer) apply(name model.ServiceName, port uint16, count int) {
	if port == 0 {
		delete(s.wanted, name)
		delete(s.failed, name)
	} else {
		s.wanted[name] = port
	}
	s.mu.RLock()
	inst := s.serving[name]
	s.mu.RUnlock()
	if inst != nil && inst.port != port {
		s.close(inst, "closing health check")
		inst = nil
	}
	if port == 0 {
		return
	}
	if inst != nil {
		inst.endpoints.Store(int64(count))
		return
	}
	s.open(name, port, count)
}

// open starts serving name on port on every listen address. On failure
// whatever was opened is closed again, so that a retry, or another owner
// of the port, starts clean.
func (s *ServiceHealthServer) open(name model.ServiceName, port uint16, count int) {
	inst := &hcInstance{name: name, port: port}
	inst.endpoints.Store(int64(count))
	var lc net.ListenConfig
	network := "tcp4"
	if s.cfg.IPv6 {
		// IPV6_V6ONLY: the IPv4 family's server has IPv4.
		network = "tcp6"
	}
	for _, ip := range s.listenAddrs {
		addr := net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))
		ln, err := lc.Listen(context.Background(), network, addr)
		if err != nil {
			for _, srv := range inst.servers {
				_ = srv.Close()
			}
			s.listenFailed(name, port, err)
			return
		}
		srv := &http.Server{
			Handler: s.handler(inst),
			// Load balancers probe with tiny requests; a client that
			// never finishes its headers must not hold a goroutine.
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          zap.NewStdLog(s.log),
		}
		inst.servers = append(inst.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("health check server stopped", zap.Stringer("service", name),
					zap.Uint16("port", port), zap.Error(err))
			}
		}()
	}
	_, retried := s.failed[name]
	delete(s.failed, name)
	s.mu.Lock()
	s.serving[name] = inst
	s.mu.Unlock()
	if retried {
		s.log.Info("opened health check after earlier failures", zap.Stringer("service", name), zap.Uint16("port", port))
	} else {
		s.log.Debug("opened health check", zap.Stringer("service", name), zap.Uint16("port", port),
			zap.Int("localEndpoints", count))
	}
}

func (s *ServiceHealthServer) listenFailed(name model.ServiceName, port uint16, err error) {
	prev, failedBefore := s.failed[name]
	s.failed[name] = port
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.HealthCheckListenFailuresTotal.Inc()
	}
	msg := fmt.Sprintf("node %s failed to start healthcheck %q on port %d: %v", s.cfg.NodeName, name.String(), port, err)
	if s.cfg.OnListenFailure != nil {
		s.cfg.OnListenFailure(name, port, msg)
	}
	// Every sync retries; one error line per failing port, not per retry.
	if failedBefore && prev == port {
		s.log.Debug("health check node port still cannot be bound", zap.Stringer("service", name),
			zap.Uint16("port", port), zap.Error(err))
		return
	}
	s.log.Error("cannot serve health check node port; retrying on every sync", zap.Stringer("service", name),
		zap.Uint16("port", port), zap.Error(err))
}

func (s *ServiceHealthServer) close(inst *hcInstance, why string) {
	s.mu.Lock()
	if s.serving[inst.name] == inst {
		delete(s.serving, inst.name)
	}
	s.mu.Unlock()
	for _, srv := range inst.servers {
		if err := srv.Close(); err != nil {
			s.log.Error("closing health check server", zap.Stringer("service", inst.name),
				zap.Uint16("port", inst.port), zap.Error(err))
		}
	}
	s.log.Debug(why, zap.Stringer("service", inst.name), zap.Uint16("port", inst.port))
}

// resolveListenAddrs works out where to listen: where NodePorts are served
// (--nodeport-addresses, resolved in the State), the unspecified address
// when that is every address. When it changes, every open health check is
// closed and reopened on the new addresses (kube-proxy restarts when the
// node's IPs change, with the same effect).
func (s *ServiceHealthServer) resolveListenAddrs(np *model.NodePortAddresses) {
	addrs := np.Addrs
	if np.All {
		addrs = []netip.Addr{netip.IPv4Unspecified()}
		if s.cfg.IPv6 {
			addrs = []netip.Addr{netip.IPv6Unspecified()}
		}
	}
	first := !s.resolved
	s.resolved = true
	if !first && slices.Equal(addrs, s.listenAddrs) {
		return
	}
	s.listenAddrs = slices.Clone(addrs)
	s.log.Info("health check node ports listen addresses", zap.Stringers("addresses", addrs))
	s.mu.RLock()
	open := make([]*hcInstance, 0, len(s.serving))
	for _, inst := range s.serving {
		open = append(open, inst)
	}
	s.mu.RUnlock()
	for _, inst := range open {
		s.close(inst, "closing health check to move it")
		s.failed[inst.name] = inst.port
	}
}

func (s *ServiceHealthServer) recordGauges() {
	if s.cfg.Metrics == nil {
		return
	}
	s.mu.RLock()
	serving := len(s.serving)
	s.mu.RUnlock()
	family := metrics.IPv4
	if s.cfg.IPv6 {
		family = metrics.IPv6
	}
	s.cfg.Metrics.HealthCheckNodePorts.WithLabelValues("serving", family).Set(float64(serving))
	s.cfg.Metrics.HealthCheckNodePorts.WithLabelValues("failed", family).Set(float64(len(s.failed)))
}

// Close stops serving every health check node port; later Syncs do
// nothing.
func (s *ServiceHealthServer) Close() {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.closed = true
	s.mu.RLock()
	open := make([]*hcInstance, 0, len(s.serving))
	for _, inst := range s.serving {
		open = append(open, inst)
	}
	s.mu.RUnlock()
	for _, inst := range open {
		s.close(inst, "closing health check")
	}
	clear(s.failed)
	clear(s.wanted)
	clear(s.members)
	s.recordGauges()
}

// ServiceHealthStatus is what the health check of one Service reports.
type ServiceHealthStatus struct {
	// Port is the healthCheckNodePort being served.
	Port uint16
	// LocalEndpoints is the count in the response: the Service's ready
	// endpoint IPs on this node.
	LocalEndpoints int
}

// Status returns what every served Service's health check reports; a
// Service whose port could not be bound is absent.
func (s *ServiceHealthServer) Status() map[model.ServiceName]ServiceHealthStatus {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[model.ServiceName]ServiceHealthStatus, len(s.serving))
	for name, inst := range s.serving {
		out[name] = ServiceHealthStatus{Port: inst.port, LocalEndpoints: int(inst.endpoints.Load())}
	}
	return out
}

// handler answers every method and path, as kube-proxy does: load
// balancers are configured with whatever path they like.
func (s *ServiceHealthServer) handler(inst *hcInstance) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.RLock()
		live := s.serving[inst.name] == inst
		s.mu.RUnlock()
		count := int(inst.endpoints.Load())
		if !live {
			// A request racing with the close of its port: never tell a
			// load balancer to use a node that stopped checking.
			count = 0
		}
		writeServiceHealth(w, inst.name, count, s.cfg.Proxier.IsHealthy())
	})
}

// writeServiceHealth writes kube-proxy's response byte for byte: probes
// and tooling match on the header and the body (a tab-indented JSON
// object without a trailing newline).
func writeServiceHealth(w http.ResponseWriter, name model.ServiceName, count int, proxyHealthy bool) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if count != 0 && proxyHealthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		name.Namespace, name.Name, count, proxyHealthy)
}
