package proxier

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// fakeDataplane records the updates it gets and fails while told to.
type fakeDataplane struct {
	mu      sync.Mutex
	updates []model.Update
	fail    int
}

func (f *fakeDataplane) Name() string { return "fake" }

func (f *fakeDataplane) Sync(up model.Update) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.updates = append(f.updates, up)
	if f.fail > 0 {
		f.fail--
		return errors.New("injected failure")
	}
	return nil
}

func (f *fakeDataplane) last() model.Update {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.updates[len(f.updates)-1]
}

type fakeHealth struct {
	mu              sync.Mutex
	queued, updated int
}

func (h *fakeHealth) QueuedUpdate(string) { h.mu.Lock(); h.queued++; h.mu.Unlock() }
func (h *fakeHealth) Updated(string)      { h.mu.Lock(); h.updated++; h.mu.Unlock() }

func service(name string, eps ...string) ([]*model.ServicePort, *model.EndpointSlice) {
	sp := builders.ModelServicePort("ns", name, model.TCP, netip.MustParseAddr("10.96.0.1"), 80,
		func(sp *model.ServicePort) { sp.InternalPolicy = model.PolicyLocal })
	es := &model.EndpointSlice{Service: sp.Name.ServiceName, Name: name + "-1", Ports: []model.EndpointPort{{Port: 8080, Protocol: model.TCP}}}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, builders.ModelEndpoint(netip.AddrPortFrom(netip.MustParseAddr(e), 0), "node-b"))
	}
	return []*model.ServicePort{sp}, es
}

type loop struct {
	tr *tracker.Tracker
	dp *fakeDataplane
	// synced gets one value per sync that reached the dataplane, once the
	// loop has recorded it.
	synced chan struct{}
	health *fakeHealth
	m      *metrics.Metrics
	p      *Proxier
}

func start(t *testing.T, cfg Config) *loop {
	t.Helper()
	l := &loop{
		tr:     tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{}),
		dp:     &fakeDataplane{},
		synced: make(chan struct{}, 100),
		health: &fakeHealth{},
		m:      metrics.New(metrics.IPv4),
	}
	l.p = New(cfg, l.tr, l.dp, l.m, l.health, zap.NewNop())
	l.p.afterSync = func() { l.synced <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

func (l *loop) waitSync(t *testing.T) model.Update {
	t.Helper()
	select {
	case <-l.synced:
		return l.dp.last()
	case <-time.After(10 * time.Second):
		t.Fatal("no sync")
		return model.Update{}
	}
}

func (l *loop) noSync(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-l.synced:
		t.Fatalf("unexpected sync: %+v", l.dp.last())
	case <-time.After(d):
	}
}

// firstSync gives the loop one Service and its slice as the initial state
// and waits for the first sync.
func (l *loop) firstSync(t *testing.T, sp []*model.ServicePort, es *model.EndpointSlice) {
	t.Helper()
	l.tr.UpdateService(sp[0].Name.ServiceName, sp)
	l.tr.UpdateEndpointSlice(es)
	l.tr.SetServicesSynced()
	l.tr.SetEndpointSlicesSynced()
	l.waitSync(t)
}

func TestNothingIsProgrammedBeforeBothSourcesSynced(t *testing.T) {
	l := start(t, Config{SyncPeriod: time.Hour})
	sp, es := service("a", "10.0.0.1")
	l.tr.UpdateService(sp[0].Name.ServiceName, sp)
	l.tr.UpdateEndpointSlice(es)
	l.tr.SetServicesSynced()
	l.noSync(t, 200*time.Millisecond)
	l.tr.SetEndpointSlicesSynced()
	up := l.waitSync(t)
	if !up.Full || len(up.State.Services) != 1 {
		t.Errorf("first sync: full=%v with %d service ports, want a full sync of 1", up.Full, len(up.State.Services))
	}
	if n := testutil.ToFloat64(l.m.NoLocalEndpointsInternal); n != 1 {
		t.Errorf("no_local_endpoints_total{internal} = %v, want 1", n)
	}
	// Changes after that are partial and name what changed.
	sp2, es2 := service("b", "10.0.0.2")
	l.tr.UpdateService(sp2[0].Name.ServiceName, sp2)
	l.tr.UpdateEndpointSlice(es2)
	up = l.waitSync(t)
	for up.Full || len(up.Changed) == 0 {
		up = l.waitSync(t)
	}
	if _, ok := up.Changed[sp2[0].Name]; !ok || len(up.Changed) != 1 {
		t.Errorf("partial sync changed %v, want only b", up.Changed)
	}
	if got := testutil.CollectAndCount(l.m.Registry(), "kubeproxy_sync_proxy_rules_duration_seconds"); got == 0 {
		t.Error("sync duration not recorded")
	}
}

func TestFailedSyncIsRetriedAsAFullSync(t *testing.T) {
	l := start(t, Config{SyncPeriod: time.Hour})
	l.dp.fail = 1
	l.tr.SetServicesSynced()
	l.tr.SetEndpointSlicesSynced()
	l.waitSync(t) // fails
	// The retry comes by itself after the backoff, full.
	up := l.waitSync(t)
	if !up.Full {
		t.Error("retry after a failure was not a full sync")
	}
	if n := testutil.ToFloat64(l.m.SyncErrorsTotal.WithLabelValues("fake")); n != 1 {
		t.Errorf("ebpfproxy_sync_errors_total = %v, want 1", n)
	}
	l.health.mu.Lock()
	defer l.health.mu.Unlock()
	if l.health.updated < 2 {
		t.Errorf("health updated %d times, want at loop start and after the successful sync", l.health.updated)
	}
}

func TestLatencyIsObservedOnlyForChangesAfterStart(t *testing.T) {
	l := start(t, Config{SyncPeriod: time.Hour})
	sp, es := service("a", "10.0.0.1")
	es.TriggerTime = time.Now().Add(-time.Hour) // initial state, older than the agent
	l.firstSync(t, sp, es)
	count := func() uint64 {
		return histogramCount(t, l.m, "kubeproxy_network_programming_duration_seconds")
	}
	if c := count(); c != 0 {
		t.Errorf("%d latency observations for the initial state, want 0", c)
	}
	es2 := *es
	es2.TriggerTime = time.Now()
	es2.Endpoints = append(es2.Endpoints, model.Endpoint{Addr: netip.MustParseAddr("10.0.0.9"), Ready: true, Serving: true})
	l.tr.UpdateEndpointSlice(&es2)
	l.waitSync(t)
	if c := count(); c != 1 {
		t.Errorf("%d latency observations after one change, want 1", c)
	}
}

// TestLatencyOfASliceThatCameBeforeItsService checks the case the watches'
// order makes common for a new Service: its EndpointSlice, with a trigger
// time, comes before the Service. The change is observed once, when the
// Service, and so the slice's endpoints, are programmed.
func TestLatencyOfASliceThatCameBeforeItsService(t *testing.T) {
	l := start(t, Config{SyncPeriod: time.Hour})
	l.tr.SetServicesSynced()
	l.tr.SetEndpointSlicesSynced()
	l.waitSync(t)
	sp, es := service("a", "10.0.0.1")
	es.TriggerTime = time.Now()
	l.tr.UpdateEndpointSlice(es)
	// Nothing to program yet: the loop takes the change without a sync.
	if err := pollUntil(10*time.Second, func() bool { _, eps := l.tr.Pending(); return eps == 0 }); err != nil {
		t.Fatalf("the slice's change was not taken: %v", err)
	}
	l.noSync(t, 100*time.Millisecond)
	if c := histogramCount(t, l.m, "kubeproxy_network_programming_duration_seconds"); c != 0 {
		t.Errorf("%d latency observations before the Service came, want 0", c)
	}
	time.Sleep(20 * time.Millisecond)
	l.tr.UpdateService(sp[0].Name.ServiceName, sp)
	up := l.waitSync(t)
	if _, ok := up.Changed[sp[0].Name]; !ok {
		t.Fatalf("the sync after the Service came changed %v, not the Service", up.Changed)
	}
	if c := histogramCount(t, l.m, "kubeproxy_network_programming_duration_seconds"); c != 1 {
		t.Fatalf("%d latency observations once the Service is programmed, want 1", c)
	}
	if sum := histogramSum(t, l.m, "kubeproxy_network_programming_duration_seconds"); sum < 0.02 {
		t.Errorf("observed %.3fs, want at least the 20ms the Service came after the slice's trigger time", sum)
	}
}

// TestLatencyOfAFailedSyncIsObservedByItsRetry checks that a change whose
// sync failed is observed when the retry programs it, counting from its
// trigger time.
func TestLatencyOfAFailedSyncIsObservedByItsRetry(t *testing.T) {
	l := start(t, Config{SyncPeriod: time.Hour})
	sp, es := service("a", "10.0.0.1")
	l.firstSync(t, sp, es)
	l.dp.mu.Lock()
	l.dp.fail = 1
	l.dp.mu.Unlock()
	es2 := *es
	es2.TriggerTime = time.Now()
	es2.Endpoints = append(es2.Endpoints, model.Endpoint{Addr: netip.MustParseAddr("10.0.0.9"), Ready: true, Serving: true})
	l.tr.UpdateEndpointSlice(&es2)
	l.waitSync(t) // fails
	if c := histogramCount(t, l.m, "kubeproxy_network_programming_duration_seconds"); c != 0 {
		t.Errorf("%d latency observations after the failed sync, want 0: nothing was programmed", c)
	}
	if up := l.waitSync(t); !up.Full {
		t.Fatal("the retry was not a full sync")
	}
	if c := histogramCount(t, l.m, "kubeproxy_network_programming_duration_seconds"); c != 1 {
		t.Errorf("%d latency observations after the retry programmed the change, want 1", c)
	}
}

// pollUntil calls cond until it holds or d has passed.
func pollUntil(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func histogramSum(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, s := range mf.GetMetric() {
				sum += s.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum
}

func TestPeriodicFullSync(t *testing.T) {
	l := start(t, Config{SyncPeriod: 100 * time.Millisecond})
	l.tr.SetServicesSynced()
	l.tr.SetEndpointSlicesSynced()
	l.waitSync(t)
	if up := l.waitSync(t); !up.Full {
		t.Error("the periodic sync was not full")
	}
}

func histogramCount(t *testing.T, m *metrics.Metrics, name string) uint64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var n uint64
			for _, s := range mf.GetMetric() {
				n += s.GetHistogram().GetSampleCount()
			}
			return n
		}
	}
	return 0
}

// fakeServiceHealth records the updates the loop hands the health check
// node port server.
// It notes how many dataplane syncs had happened when it was called.
type fakeServiceHealth struct {
	dp  *fakeDataplane
	got chan model.Update
	at  chan int
}

func (f *fakeServiceHealth) Sync(up model.Update) {
	f.dp.mu.Lock()
	n := len(f.dp.updates)
	f.dp.mu.Unlock()
	f.at <- n
	f.got <- up
}

func TestServiceHealthSeesOnlyAppliedUpdates(t *testing.T) {
	sh := &fakeServiceHealth{got: make(chan model.Update, 10), at: make(chan int, 10)}
	l := start(t, Config{SyncPeriod: time.Hour, ServiceHealth: sh})
	sh.dp = l.dp
	l.dp.fail = 1
	sp, es := service("a", "10.0.0.1")
	l.tr.UpdateService(sp[0].Name.ServiceName, sp)
	l.tr.UpdateEndpointSlice(es)
	l.tr.SetServicesSynced()
	l.tr.SetEndpointSlicesSynced()
	l.waitSync(t) // fails: nothing is programmed, so nothing to report
	l.waitSync(t) // the full retry succeeds
	select {
	case up := <-sh.got:
		if n := <-sh.at; n != 2 {
			t.Errorf("service health got an update after dataplane sync %d, want only after the successful second", n)
		}
		if !up.Full || up.State.Services[sp[0].Name] == nil {
			t.Errorf("service health got full=%v with %d service ports, want the full State", up.Full, len(up.State.Services))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("service health never got an update")
	}
	// A partial sync is handed on with its change set.
	sp2, es2 := service("b", "10.0.0.2")
	l.tr.UpdateService(sp2[0].Name.ServiceName, sp2)
	l.tr.UpdateEndpointSlice(es2)
	for {
		select {
		case up := <-sh.got:
			<-sh.at
			if _, ok := up.Changed[sp2[0].Name]; ok && !up.Full {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("service health never got the partial update")
		}
	}
}

// The local API's recorder (Config.Applied) is told only what a
// dataplane applied, as the health check node ports are.
func TestAppliedSeesOnlyAppliedUpdates(t *testing.T) {
	rec := &fakeServiceHealth{got: make(chan model.Update, 10), at: make(chan int, 10)}
	l := start(t, Config{SyncPeriod: time.Hour, Applied: rec})
	rec.dp = l.dp
	l.dp.fail = 1
	sp, es := service("a", "10.0.0.1")
	l.tr.UpdateService(sp[0].Name.ServiceName, sp)
	l.tr.UpdateEndpointSlice(es)
	l.tr.SetServicesSynced()
	l.tr.SetEndpointSlicesSynced()
	l.waitSync(t) // fails
	l.waitSync(t) // the full retry succeeds
	select {
	case up := <-rec.got:
		if n := <-rec.at; n != 2 {
			t.Errorf("Applied got an update after dataplane sync %d, want only after the successful second", n)
		}
		if !up.Full || up.State.Services[sp[0].Name] == nil {
			t.Errorf("Applied got full=%v with %d service ports, want the full State", up.Full, len(up.State.Services))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Applied never got an update")
	}
}
