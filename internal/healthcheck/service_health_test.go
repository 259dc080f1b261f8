package healthcheck_test

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/healthcheck"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

const thisNode = "node-a"

// lbLocal makes svc a LoadBalancer with externalTrafficPolicy=Local and
// healthCheckNodePort port, as the API server allocates it.
func lbLocal(port int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = port
		s.Spec.Ports[0].NodePort = 30080
	}
}

// withSecondPort adds port "https" 443 -> 8443.
func withSecondPort(s *v1.Service) {
	p := builders.Port("https", 443, v1.ProtocolTCP, intstr.FromInt32(8443))
	p.NodePort = 30443
	builders.AddPort(p)(s)
}

type epState int

const (
	readyEp epState = iota
	notReadyEp
	servingTerminatingEp
	unsetEp
)

type ep struct {
	ip    string
	node  string
	state epState
}

// states maps the table's endpoint states to the builders' options.
var states = map[epState]builders.EndpointOption{
	notReadyEp:           builders.NotReady,
	servingTerminatingEp: builders.Terminating,
	unsetEp:              func(e *discoveryv1.Endpoint) { e.Conditions = discoveryv1.EndpointConditions{} },
}

// makeSlice builds the EndpointSlice ns/name of Service svc with the named
// TCP ports ("https" at 8443, any other at 8080) and the endpoints eps.
func makeSlice(svc, name string, ports []string, eps ...ep) *discoveryv1.EndpointSlice {
	var sp []discoveryv1.EndpointPort
	for _, p := range ports {
		num := int32(8080)
		if p == "https" {
			num = 8443
		}
		sp = append(sp, builders.SlicePort(p, num, v1.ProtocolTCP))
	}
	var out []discoveryv1.Endpoint
	for _, e := range eps {
		out = append(out, builders.Endpoint(e.ip, e.node, states[e.state]))
	}
	return builders.EndpointSlice("ns", name, svc, out, builders.SlicePorts(sp...))
}

// cluster feeds Kubernetes objects through the translator and the change
// tracker, as the agent does, and hands the updates to a server.
type cluster struct {
	t  *testing.T
	tl k8swatch.Translator
	tr *tracker.Tracker
}

// newCluster returns a source for this node, whose health check node
// ports listen where nodePorts (--nodeport-addresses) says among the node's
// addresses: 127.0.0.1 only. No value listens on every address.
func newCluster(t *testing.T, nodePorts ...string) *cluster {
	spec, err := model.ParseNodePortSpec(nodePorts, false, false)
	if err != nil {
		t.Fatal(err)
	}
	tr := tracker.New(thisNode, model.DefaultOptions, spec)
	tr.SetLocalAddrs([]netip.Addr{netip.MustParseAddr("127.0.0.1")})
	return &cluster{t: t, tl: k8swatch.Translator{Invalid: func(kind, ns, name, reason string) {
		t.Errorf("translator rejected %s %s/%s: %s", kind, ns, name, reason)
	}}, tr: tr}
}

func (c *cluster) apply(objs ...any) model.Update {
	c.t.Helper()
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			c.tr.UpdateService(k8swatch.ServiceName(o), c.tl.ServicePorts(o))
		case *discoveryv1.EndpointSlice:
			c.tr.UpdateEndpointSlice(c.tl.EndpointSlice(o))
		case deleted:
			c.tr.DeleteService(model.ServiceName{Namespace: "ns", Name: string(o)})
		default:
			c.t.Fatalf("unexpected object %T", o)
		}
	}
	return c.tr.Apply()
}

// deleted names a Service to delete.
type deleted string

type fakeProxier struct{ unhealthy atomic.Bool }

func (f *fakeProxier) IsHealthy() bool { return !f.unhealthy.Load() }

func svcName(name string) model.ServiceName { return model.ServiceName{Namespace: "ns", Name: name} }

// TestLocalEndpointCount checks, without opening ports (the listen
// addresses match nothing, as when --nodeport-addresses names no local
// address), which Services get a health check and what count it reports.
func TestLocalEndpointCount(t *testing.T) {
	tests := []struct {
		name string
		objs []any
		want map[model.ServiceName]healthcheck.ServiceHealthStatus
	}{
		{
			name: "two ready endpoints here, one elsewhere: count 2",
			objs: []any{builders.Service("ns", "web", lbLocal(32000)), makeSlice("web", "web-1", []string{"http"},
				ep{"10.244.1.1", thisNode, readyEp}, ep{"10.244.1.2", thisNode, readyEp}, ep{"10.244.2.1", "node-b", readyEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{svcName("web"): {Port: 32000, LocalEndpoints: 2}},
		},
		{
			name: "unset conditions count as ready",
			objs: []any{builders.Service("ns", "web", lbLocal(32000)), makeSlice("web", "web-1", []string{"http"}, ep{"10.244.1.1", thisNode, unsetEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{svcName("web"): {Port: 32000, LocalEndpoints: 1}},
		},
		{
			name: "only a serving-terminating endpoint here: count 0, the node drains",
			objs: []any{builders.Service("ns", "web", lbLocal(32000)), makeSlice("web", "web-1", []string{"http"},
				ep{"10.244.1.1", thisNode, servingTerminatingEp}, ep{"10.244.2.1", "node-b", readyEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{svcName("web"): {Port: 32000, LocalEndpoints: 0}},
		},
		{
			name: "not-ready endpoint and one without a node: count 0",
			objs: []any{builders.Service("ns", "web", lbLocal(32000)), makeSlice("web", "web-1", []string{"http"},
				ep{"10.244.1.1", thisNode, notReadyEp}, ep{"10.244.1.9", "", readyEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{svcName("web"): {Port: 32000, LocalEndpoints: 0}},
		},
		{
			name: "no EndpointSlice at all: served with count 0",
			objs: []any{builders.Service("ns", "web", lbLocal(32000))},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{svcName("web"): {Port: 32000, LocalEndpoints: 0}},
		},
		{
			name: "two ports: a pod behind both counts once, pods behind one port count too",
			objs: []any{builders.Service("ns", "web", lbLocal(32000), withSecondPort),
				makeSlice("web", "web-1", []string{"http", "https"}, ep{"10.244.1.1", thisNode, readyEp}),
				makeSlice("web", "web-2", []string{"https"}, ep{"10.244.1.2", thisNode, readyEp}, ep{"10.244.1.1", thisNode, readyEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{svcName("web"): {Port: 32000, LocalEndpoints: 2}},
		},
		{
			name: "externalTrafficPolicy=Cluster LoadBalancer: no health check",
			objs: []any{builders.Service("ns", "web", lbLocal(32000), func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
				s.Spec.HealthCheckNodePort = 0
			}), makeSlice("web", "web-1", []string{"http"}, ep{"10.244.1.1", thisNode, readyEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{},
		},
		{
			name: "NodePort with externalTrafficPolicy=Local: no health check",
			objs: []any{builders.Service("ns", "web", lbLocal(32000), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.HealthCheckNodePort = 0
			}), makeSlice("web", "web-1", []string{"http"}, ep{"10.244.1.1", thisNode, readyEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{},
		},
		{
			name: "two Services, each its own port and count",
			objs: []any{builders.Service("ns", "web", lbLocal(32000)), builders.Service("ns", "api", lbLocal(32001)),
				makeSlice("web", "web-1", []string{"http"}, ep{"10.244.1.1", thisNode, readyEp}),
				makeSlice("api", "api-1", []string{"http"}, ep{"10.244.2.1", "node-b", readyEp})},
			want: map[model.ServiceName]healthcheck.ServiceHealthStatus{
				svcName("web"): {Port: 32000, LocalEndpoints: 1},
				svcName("api"): {Port: 32001, LocalEndpoints: 0},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, healthcheck.ServiceHealthConfig{})
			s.Sync(newCluster(t, nowhere).apply(tc.objs...))
			if got := s.Status(); !maps.Equal(got, tc.want) {
				t.Errorf("status = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPartialSyncsTrackChanges follows one Service through partial
// updates and checks that only what changed is touched.
func TestPartialSyncsTrackChanges(t *testing.T) {
	c := newCluster(t, nowhere)
	s := newServer(t, healthcheck.ServiceHealthConfig{})
	status := func() map[model.ServiceName]healthcheck.ServiceHealthStatus { return s.Status() }
	one := func(port uint16, n int) map[model.ServiceName]healthcheck.ServiceHealthStatus {
		return map[model.ServiceName]healthcheck.ServiceHealthStatus{svcName("web"): {Port: port, LocalEndpoints: n}}
	}
	steps := []struct {
		name string
		objs []any
		want map[model.ServiceName]healthcheck.ServiceHealthStatus
	}{
		{"ClusterIP Service: nothing", []any{builders.Service("ns", "web")}, map[model.ServiceName]healthcheck.ServiceHealthStatus{}},
		{"becomes LoadBalancer Local", []any{builders.Service("ns", "web", lbLocal(32000))}, one(32000, 0)},
		{"a local ready endpoint", []any{makeSlice("web", "web-1", []string{"http"}, ep{"10.244.1.1", thisNode, readyEp})}, one(32000, 1)},
		{"another Service changes: web untouched", []any{builders.Service("ns", "api")}, one(32000, 1)},
		{"second local endpoint in a second slice", []any{makeSlice("web", "web-2", []string{"http"}, ep{"10.244.1.2", thisNode, readyEp})}, one(32000, 2)},
		{"port changes", []any{builders.Service("ns", "web", lbLocal(32005))}, one(32005, 2)},
		{"second port added", []any{builders.Service("ns", "web", lbLocal(32005), withSecondPort)}, one(32005, 2)},
		{"policy Cluster", []any{builders.Service("ns", "web", lbLocal(0), func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		})}, map[model.ServiceName]healthcheck.ServiceHealthStatus{}},
		{"back to Local", []any{builders.Service("ns", "web", lbLocal(32006))}, one(32006, 2)},
		{"Service deleted", []any{deleted("web")}, map[model.ServiceName]healthcheck.ServiceHealthStatus{}},
	}
	for _, st := range steps {
		s.Sync(c.apply(st.objs...))
		if got := status(); !maps.Equal(got, st.want) {
			t.Fatalf("%s: status = %v, want %v", st.name, got, st.want)
		}
	}
}

func newServer(t *testing.T, cfg healthcheck.ServiceHealthConfig) *healthcheck.ServiceHealthServer {
	t.Helper()
	if cfg.NodeName == "" {
		cfg.NodeName = thisNode
	}
	if cfg.Proxier == nil {
		cfg.Proxier = &fakeProxier{}
	}
	s, err := healthcheck.NewServiceHealthServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// freePorts returns n TCP ports free on 127.0.0.1 right now.
func freePorts(t *testing.T, n int) []int32 {
	t.Helper()
	var out []int32
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, int32(ln.Addr().(*net.TCPAddr).Port))
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

type response struct {
	status  int
	weight  string
	ctype   string
	nosniff string
	body    string
	err     error
}

func get(port int32, path string) response {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(int(port)) + path)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, weight: resp.Header.Get("X-Load-Balancing-Endpoint-Weight"),
		ctype: resp.Header.Get("Content-Type"), nosniff: resp.Header.Get("X-Content-Type-Options"), body: string(b), err: err}
}

// upstreamBody is kube-proxy's response body, spelled out.
func upstreamBody(name string, n int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %t\n}", name, n, healthy)
}

// TestHealthCheckOverHTTP serves real ports on loopback and checks what a
// load balancer's probe sees.
func TestHealthCheckOverHTTP(t *testing.T) {
	ports := freePorts(t, 2)
	web, api := ports[0], ports[1]
	proxier := &fakeProxier{}
	s := newServer(t, healthcheck.ServiceHealthConfig{Proxier: proxier})
	c := newCluster(t, loopbackOnly)
	s.Sync(c.apply(builders.Service("ns", "web", lbLocal(web)), builders.Service("ns", "api", lbLocal(api)),
		makeSlice("web", "web-1", []string{"http"}, ep{"10.244.1.1", thisNode, readyEp}, ep{"10.244.1.2", thisNode, readyEp},
			ep{"10.244.2.1", "node-b", readyEp}),
		makeSlice("api", "api-1", []string{"http"}, ep{"10.244.1.3", thisNode, servingTerminatingEp})))

	check := func(t *testing.T, r response, status int, weight, body string) {
		t.Helper()
		if r.err != nil {
			t.Fatalf("GET: %v", r.err)
		}
		if r.status != status || r.weight != weight || r.body != body {
			t.Errorf("got %d, weight %q, body %q; want %d, weight %q, body %q", r.status, r.weight, r.body, status, weight, body)
		}
		if r.ctype != "application/json" || r.nosniff != "nosniff" {
			t.Errorf("headers Content-Type %q, X-Content-Type-Options %q; want application/json, nosniff", r.ctype, r.nosniff)
		}
	}
	t.Run("local ready endpoints: 200 with their count, any path", func(t *testing.T) {
		check(t, get(web, "/"), 200, "2", upstreamBody("web", 2, true))
		check(t, get(web, "/healthz"), 200, "2", upstreamBody("web", 2, true))
	})
	t.Run("only a serving-terminating endpoint: 503", func(t *testing.T) {
		check(t, get(api, "/"), 503, "0", upstreamBody("api", 0, true))
	})
	t.Run("proxier unhealthy: 503 despite endpoints", func(t *testing.T) {
		proxier.unhealthy.Store(true)
		t.Cleanup(func() { proxier.unhealthy.Store(false) })
		check(t, get(web, "/"), 503, "2", upstreamBody("web", 2, false))
	})
	t.Run("endpoint becomes ready: 200 after the next sync", func(t *testing.T) {
		s.Sync(c.apply(makeSlice("api", "api-1", []string{"http"}, ep{"10.244.1.3", thisNode, readyEp})))
		check(t, get(api, "/"), 200, "1", upstreamBody("api", 1, true))
	})
	t.Run("Service deleted: its port is closed, the other stays", func(t *testing.T) {
		s.Sync(c.apply(deleted("api")))
		if r := get(api, "/"); !errors.Is(r.err, syscall.ECONNREFUSED) {
			t.Errorf("GET after delete: %+v, want connection refused", r)
		}
		check(t, get(web, "/"), 200, "2", upstreamBody("web", 2, true))
	})
	t.Run("port changed: old closed, new served", func(t *testing.T) {
		moved := freePorts(t, 1)[0]
		s.Sync(c.apply(builders.Service("ns", "web", lbLocal(moved))))
		if r := get(web, "/"); !errors.Is(r.err, syscall.ECONNREFUSED) {
			t.Errorf("GET on the old port: %+v, want connection refused", r)
		}
		check(t, get(moved, "/"), 200, "2", upstreamBody("web", 2, true))
	})
	t.Run("Close closes every port", func(t *testing.T) {
		s.Close()
		for _, p := range []int32{web, api} {
			if r := get(p, "/"); !errors.Is(r.err, syscall.ECONNREFUSED) {
				t.Errorf("GET %d after Close: %+v, want connection refused", p, r)
			}
		}
	})
}

// TestPortTakenBySomeoneElse checks that a port another process holds is
// reported (metric, log with the stable keys) and retried, and that it does
// not keep other Services from being served.
func TestPortTakenBySomeoneElse(t *testing.T) {
	ports := freePorts(t, 2)
	taken, free := ports[0], ports[1]
	squatter, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(int(taken)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { squatter.Close() })

	core, logs := observer.New(zapcore.DebugLevel)
	m := metrics.New(metrics.IPv4)
	var events []string
	s := newServer(t, healthcheck.ServiceHealthConfig{Metrics: m, Logger: zap.New(core),
		OnListenFailure: func(svc model.ServiceName, port uint16, msg string) {
			events = append(events, fmt.Sprintf("%s %d", svc, port))
		},
	})
	c := newCluster(t, loopbackOnly)
	s.Sync(c.apply(builders.Service("ns", "blocked", lbLocal(taken)), builders.Service("ns", "web", lbLocal(free)),
		makeSlice("web", "web-1", []string{"http"}, ep{"10.244.1.1", thisNode, readyEp}),
		makeSlice("blocked", "blocked-1", []string{"http"}, ep{"10.244.1.2", thisNode, readyEp})))

	if r := get(free, "/"); r.err != nil || r.status != 200 {
		t.Errorf("the other Service: %+v, want 200", r)
	}
	if got := testutil.ToFloat64(m.HealthCheckListenFailuresTotal); got != 1 {
		t.Errorf("listen failures = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.HealthCheckNodePorts.WithLabelValues("failed", "IPv4")); got != 1 {
		t.Errorf("failed gauge = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.HealthCheckNodePorts.WithLabelValues("serving", "IPv4")); got != 1 {
		t.Errorf("serving gauge = %v, want 1", got)
	}
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errs) != 1 {
		t.Fatalf("error logs = %v, want one", errs)
	}
	fields := errs[0].ContextMap()
	if fields["service"] != "ns/blocked" || fields["port"] != uint16(taken) {
		t.Errorf("error log fields = %v, want service ns/blocked, port %d", fields, taken)
	}
	if len(events) != 1 || events[0] != fmt.Sprintf("ns/blocked %d", taken) {
		t.Errorf("events = %v", events)
	}

	// Every sync retries, even one that changes nothing for this Service;
	// the error is logged once, not on every retry.
	s.Sync(c.apply(builders.Service("ns", "other")))
	if got := testutil.ToFloat64(m.HealthCheckListenFailuresTotal); got != 2 {
		t.Errorf("listen failures after a retry = %v, want 2", got)
	}
	if n := logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
		t.Errorf("error logs after a retry = %d, want still 1", n)
	}

	squatter.Close()
	s.Sync(c.apply(builders.Service("ns", "other2")))
	if r := get(taken, "/"); r.err != nil || r.status != 200 || r.body != upstreamBody("blocked", 1, true) {
		t.Errorf("after the port was freed: %+v, want 200 for blocked", r)
	}
	if got := testutil.ToFloat64(m.HealthCheckNodePorts.WithLabelValues("failed", "IPv4")); got != 0 {
		t.Errorf("failed gauge = %v, want 0", got)
	}
}

// TestListenAddressesFollowTheNode checks that the server listens where
// the State's NodePort addresses say, and moves when the node gains one.
func TestListenAddressesFollowTheNode(t *testing.T) {
	port := freePorts(t, 1)[0]
	s := newServer(t, healthcheck.ServiceHealthConfig{})
	c := newCluster(t, loopbackOnly)
	c.tr.SetLocalAddrs([]netip.Addr{})
	s.Sync(c.apply(builders.Service("ns", "web", lbLocal(port))))
	if r := get(port, "/"); !errors.Is(r.err, syscall.ECONNREFUSED) {
		t.Fatalf("no address in --nodeport-addresses yet: GET = %+v, want connection refused", r)
	}
	c.tr.SetLocalAddrs([]netip.Addr{netip.MustParseAddr("127.0.0.1")})
	s.Sync(c.apply())
	if r := get(port, "/"); r.err != nil || r.status != 503 {
		t.Errorf("after the node gains 127.0.0.1: GET = %+v, want 503", r)
	}
	s.Sync(c.apply(builders.Service("ns", "api")))
	if r := get(port, "/"); r.err != nil || r.status != 503 {
		t.Errorf("after another Service changed: GET = %+v, want 503", r)
	}
}

// --nodeport-addresses values for the tests: the node's loopback address,
// and a CIDR holding none of its addresses.
const (
	loopbackOnly = "127.0.0.0/8"
	nowhere      = "192.0.2.0/24"
)
