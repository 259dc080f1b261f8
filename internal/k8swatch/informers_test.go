package k8swatch

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// deadlockGuard bounds how long a test waits for the informers. It is not a
// speed assertion: the informers take milliseconds, or a few seconds when
// they have to retry a failed list.
const deadlockGuard = time.Minute

// startWatch runs Watch against client until the test ends.
func startWatch(t *testing.T, client *fake.Clientset, tr *tracker.Tracker, r *reports) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, fakeSource{client}, "node-a", []Target{{Tracker: tr}}, WatchOptions{Invalid: r.fn})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
}

// waitFor applies the tracker's changes until cond holds for the State,
// and returns that State and every ServicePort reported changed on the way.
func waitFor(t *testing.T, tr *tracker.Tracker, what string, cond func(*model.State) bool) (*model.State, model.ChangeSet) {
	t.Helper()
	guard := time.NewTimer(deadlockGuard)
	defer guard.Stop()
	changed := model.ChangeSet{}
	for {
		up := tr.Apply()
		for n := range up.Changed {
			changed[n] = struct{}{}
		}
		if cond(up.State) {
			return up.State, changed
		}
		select {
		case <-tr.Notify():
		case <-guard.C:
			t.Fatalf("gave up waiting for %s; state:\n%v", what, describe(up.State))
		}
	}
}

func waitSynced(t *testing.T, tr *tracker.Tracker) {
	t.Helper()
	guard := time.NewTimer(deadlockGuard)
	defer guard.Stop()
	for !tr.Synced() {
		select {
		case <-tr.Notify():
		case <-guard.C:
			t.Fatal("gave up waiting for the initial lists")
		}
	}
}

func hasService(name string) func(*model.State) bool {
	return func(st *model.State) bool {
		for n := range st.Services {
			if n.String() == name {
				return true
			}
		}
		return false
	}
}

// clusterObjects are what the API server holds at the start of the tests:
// one Service for kube-proxy, one for another proxy, one headless, and two
// Nodes.
func clusterObjects() []runtime.Object {
	return []runtime.Object{
		builders.Service("ns", "web"),
		builders.EndpointSlice("ns", "web-1", "web", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.1", "node-a")}),
		builders.Service("ns", "other", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
			s.Labels = map[string]string{LabelServiceProxyName: "other-proxy"}
		}),
		builders.EndpointSlice("ns", "other-1", "other", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.2", "node-a")},
			func(es *discoveryv1.EndpointSlice) { es.Labels[LabelServiceProxyName] = "other-proxy" }),
		builders.Service("ns", "headless", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		}),
		builders.EndpointSlice("ns", "headless-1", "headless", []discoveryv1.Endpoint{builders.Endpoint("10.244.1.3", "node-a")},
			func(es *discoveryv1.EndpointSlice) { es.Labels[LabelHeadless] = "" }),
		builders.Node("node-a", builders.NodeZone("zone-a"), builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.77.10"})),
		builders.Node("node-b", builders.NodeZone("zone-b"), builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.168.77.11"})),
	}
}

const webLine = "ns/web:http/TCP 10.96.0.10:80 eps=[10.244.1.1:8080 @node-a] internal=FORWARD[10.244.1.1:8080 @node-a]"

// TestWatchSelectors checks what the informers ask the API server for:
// kube-proxy's label selector on Services and EndpointSlices, headless
// Services left out by field, and only the own Node.
func TestWatchSelectors(t *testing.T) {
	client := fake.NewClientset(clusterObjects()...)
	var mu sync.Mutex
	got := map[string][]string{}
	client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.ListAction).GetListRestrictions()
		mu.Lock()
		defer mu.Unlock()
		got[a.GetResource().Resource] = []string{r.Labels.String(), r.Fields.String()}
		return false, nil, nil
	})
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var r reports
	startWatch(t, client, tr, &r)
	waitSynced(t, tr)
	waitFor(t, tr, "the Node", func(st *model.State) bool { return st.Node.Zone != "" })

	// kube-proxy 1.37's: each label filters its own kind only.
	want := map[string][]string{
		"services":       {"!service.kubernetes.io/service-proxy-name", "spec.clusterIP!=None"},
		"endpointslices": {"!service.kubernetes.io/headless", ""},
		"nodes":          {"", "metadata.name=node-a"},
	}
	mu.Lock()
	defer mu.Unlock()
	for res, w := range want {
		if !slices.Equal(got[res], w) {
			t.Errorf("list %s with selectors %q, want %q", res, got[res], w)
		}
	}
}

// TestWatch runs the informers against a fake API server: the initial
// state, then changes as a user would make them.
func TestWatch(t *testing.T) {
	client := fake.NewClientset(clusterObjects()...)
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var r reports
	startWatch(t, client, tr, &r)
	ctx := t.Context()

	// Synced is only set once the initial objects were handed over, so the
	// first State after it is complete: nothing would be programmed from a
	// partial view.
	waitSynced(t, tr)
	checkLines(t, "state at sync", describe(tr.Apply().State), []string{webLine})
	st, _ := waitFor(t, tr, "the Node", func(st *model.State) bool { return st.Node.Zone != "" })
	if n := st.Node; n.Name != "node-a" || n.Zone != "zone-a" || len(n.Addrs) != 1 || n.Addrs[0].String() != "192.168.77.10" {
		t.Errorf("node: %+v, want node-a in zone-a at 192.168.77.10", n)
	}

	steps := []struct {
		name string
		do   func() error
		// until is the state to wait for; want is then checked exactly.
		until   func(*model.State) bool
		want    []string
		changed []string
	}{
		{
			name: "a new Service and its slice appear",
			do: func() error {
				if _, err := client.CoreV1().Services("ns").Create(ctx, builders.Service("ns", "api", func(s *v1.Service) {
					s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.12", []string{"10.96.0.12"}
				}), metav1.CreateOptions{}); err != nil {
					return err
				}
				_, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, builders.EndpointSlice("ns", "api-1", "api",
					[]discoveryv1.Endpoint{builders.Endpoint("10.244.2.1", "node-b")}), metav1.CreateOptions{})
				return err
			},
			until: func(st *model.State) bool {
				s := st.Services[spn("ns", "api", "http", model.TCP)]
				return s != nil && len(s.Endpoints) == 1
			},
			want: []string{
				"ns/api:http/TCP 10.96.0.12:80 eps=[10.244.2.1:8080 @node-b] internal=FORWARD[10.244.2.1:8080 @node-b]",
				webLine,
			},
			changed: []string{"ns/api:http/TCP"},
		},
		{
			name: "an update that changes nothing proxied is not passed on",
			do: func() error {
				svc, err := client.CoreV1().Services("ns").Get(ctx, "web", metav1.GetOptions{})
				if err != nil {
					return err
				}
				svc.Annotations = map[string]string{"owner": "team-a"}
				svc.Spec.Selector = map[string]string{"app": "web-v2"}
				if _, err := client.CoreV1().Services("ns").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
					return err
				}
				// Events of one informer arrive in order: once this marker
				// is seen, the update before it has been handled.
				_, err = client.CoreV1().Services("ns").Create(ctx, builders.Service("ns", "marker", func(s *v1.Service) {
					s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.13", []string{"10.96.0.13"}
				}), metav1.CreateOptions{})
				return err
			},
			until: hasService("ns/marker:http/TCP"),
			want: []string{
				"ns/api:http/TCP 10.96.0.12:80 eps=[10.244.2.1:8080 @node-b] internal=FORWARD[10.244.2.1:8080 @node-b]",
				"ns/marker:http/TCP 10.96.0.13:80 eps=[] internal=REJECT[]",
				webLine,
			},
			changed: []string{"ns/marker:http/TCP"},
		},
		{
			name: "a Service handed to another proxy by label disappears",
			do: func() error {
				svc, err := client.CoreV1().Services("ns").Get(ctx, "marker", metav1.GetOptions{})
				if err != nil {
					return err
				}
				svc.Labels = map[string]string{LabelServiceProxyName: "other-proxy"}
				_, err = client.CoreV1().Services("ns").Update(ctx, svc, metav1.UpdateOptions{})
				return err
			},
			until: func(st *model.State) bool { return !hasService("ns/marker:http/TCP")(st) },
			want: []string{
				"ns/api:http/TCP 10.96.0.12:80 eps=[10.244.2.1:8080 @node-b] internal=FORWARD[10.244.2.1:8080 @node-b]",
				webLine,
			},
			changed: []string{"ns/marker:http/TCP"},
		},
		{
			name: "a deleted slice takes its endpoints away",
			do: func() error {
				return client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "api-1", metav1.DeleteOptions{})
			},
			until: func(st *model.State) bool {
				s := st.Services[spn("ns", "api", "http", model.TCP)]
				return s != nil && len(s.Endpoints) == 0
			},
			want: []string{
				"ns/api:http/TCP 10.96.0.12:80 eps=[] internal=REJECT[]",
				webLine,
			},
			changed: []string{"ns/api:http/TCP"},
		},
		{
			name: "a deleted Service is gone",
			do: func() error {
				return client.CoreV1().Services("ns").Delete(ctx, "api", metav1.DeleteOptions{})
			},
			until:   func(st *model.State) bool { return !hasService("ns/api:http/TCP")(st) },
			want:    []string{webLine},
			changed: []string{"ns/api:http/TCP"},
		},
		{
			name: "the own Node's zone label is followed, other Nodes are not",
			do: func() error {
				other, err := client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
				if err != nil {
					return err
				}
				other.Labels[v1.LabelTopologyZone] = "zone-x"
				if _, err := client.CoreV1().Nodes().Update(ctx, other, metav1.UpdateOptions{}); err != nil {
					return err
				}
				n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
				if err != nil {
					return err
				}
				n.Labels[v1.LabelTopologyZone] = "zone-c"
				_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				return err
			},
			until: func(st *model.State) bool { return st.Node.Zone != "zone-a" },
			want:  []string{webLine},
			// A zone change re-selects every Service.
			changed: []string{"ns/web:http/TCP"},
		},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		st, changed := waitFor(t, tr, s.name, s.until)
		checkLines(t, s.name, describe(st), s.want)
		var names []string
		for n := range changed {
			names = append(names, n.String())
		}
		slices.Sort(names)
		checkLines(t, s.name+": changed", names, s.changed)
	}
	if z := tr.Apply().State.Node.Zone; z != "zone-c" {
		t.Errorf("node zone %q, want zone-c (node-b's change must be ignored)", z)
	}
	checkReports(t, r.take(), nil)
}

// TestWatchWaitsForAPIServer starts the informers while the API server
// refuses every request, as at node boot, and checks that nothing is
// marked synced until it answers, and that the Services are marked synced
// without waiting for the EndpointSlices.
func TestWatchWaitsForAPIServer(t *testing.T) {
	client := fake.NewClientset(clusterObjects()...)
	var servicesUp, slicesUp atomic.Bool
	refused := make(chan string, 100)
	client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		res := a.GetResource().Resource
		if (res == "services" && servicesUp.Load()) || (res == "endpointslices" && slicesUp.Load()) || res == "nodes" {
			return false, nil, nil
		}
		select {
		case refused <- res:
		default:
		}
		return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	})
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var r reports
	startWatch(t, client, tr, &r)

	// Refused lists are retried (the success later shows it); the backoff
	// makes each retry slower, so one refusal each is enough to wait for.
	seen := map[string]int{}
	guard := time.NewTimer(deadlockGuard)
	defer guard.Stop()
	for seen["services"] < 1 || seen["endpointslices"] < 1 {
		select {
		case res := <-refused:
			seen[res]++
		case <-guard.C:
			t.Fatalf("lists not retried: %v", seen)
		}
	}
	if tr.Synced() {
		t.Fatal("synced while the API server refuses every list")
	}

	servicesUp.Store(true)
	waitFor(t, tr, "the Service", hasService("ns/web:http/TCP"))
	if tr.Synced() {
		t.Fatal("synced before the EndpointSlices were listed")
	}

	slicesUp.Store(true)
	waitSynced(t, tr)
	checkLines(t, "state at sync", describe(tr.Apply().State), []string{webLine})
}

// TestWatchReportsNodeEligibility follows the own Node's deletion state and
// taints, which decide /healthz, and its disappearance.
func TestWatchReportsNodeEligibility(t *testing.T) {
	type status struct {
		known, deleting bool
		taints          string
	}
	got := make(chan status, 16)
	client := fake.NewClientset(clusterObjects()...)
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, fakeSource{client}, "node-a", []Target{{Tracker: tr}}, WatchOptions{NodeStatus: func(known, deleting bool, taints []string) {
			got <- status{known, deleting, strings.Join(taints, ",")}
		}})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	next := func(what string) status {
		t.Helper()
		select {
		case s := <-got:
			return s
		case <-time.After(deadlockGuard):
			t.Fatalf("no node status for %s", what)
			return status{}
		}
	}
	if s := next("the initial list"); s != (status{known: true}) {
		t.Errorf("initial: %+v, want known, not deleting, no taints", s)
	}
	nodes := client.CoreV1().Nodes()
	n, err := nodes.Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: v1.TaintEffectNoSchedule}}
	n.ResourceVersion = "2"
	if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := next("the taint"); s != (status{known: true, taints: "ToBeDeletedByClusterAutoscaler"}) {
		t.Errorf("after tainting: %+v", s)
	}
	if err := nodes.Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := next("the deletion"); s.known {
		t.Errorf("after deletion: %+v, want unknown", s)
	}
}

// TestWatchTellsWhenTheNodeWantsAStart: kube-proxy 1.37 exits when its
// Node's IPs change or the Node is deleted, and starts again from the new
// state; NodeChanged is told so, and not for any other change.
func TestWatchTellsWhenTheNodeWantsAStart(t *testing.T) {
	got := make(chan string, 16)
	client := fake.NewClientset(clusterObjects()...)
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, fakeSource{client}, "node-a", []Target{{Tracker: tr}}, WatchOptions{NodeChanged: func(reason string) { got <- reason }})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, tr, "the Node", func(st *model.State) bool { return st.Node.Zone != "" })
	nodes := client.CoreV1().Nodes()
	update := func(rv string, change func(*v1.Node)) {
		t.Helper()
		n, err := nodes.Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(n)
		n.ResourceVersion = rv
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	quiet := func(what string) {
		t.Helper()
		// The tracker has the change once the handler ran: nothing may
		// have been told by then.
		select {
		case r := <-got:
			t.Errorf("%s: told %q, want nothing", what, r)
		default:
		}
	}
	next := func(what string) string {
		t.Helper()
		select {
		case r := <-got:
			return r
		case <-time.After(deadlockGuard):
			t.Fatalf("%s: not told", what)
			return ""
		}
	}

	update("2", func(n *v1.Node) { n.Labels[v1.LabelTopologyZone] = "zone-b" })
	waitFor(t, tr, "the zone", func(st *model.State) bool { return st.Node.Zone == "zone-b" })
	quiet("a label changed")
	// An ExternalIP of the same family is not one of the Node's IPs.
	update("3", func(n *v1.Node) {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.10"})
	})
	update("4", func(n *v1.Node) { n.Labels[v1.LabelTopologyZone] = "zone-c" })
	waitFor(t, tr, "the zone", func(st *model.State) bool { return st.Node.Zone == "zone-c" })
	quiet("an ExternalIP added beside the InternalIP")

	update("5", func(n *v1.Node) {
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.77.99"}}
	})
	if r := next("the InternalIP changed"); r != "the Node's IPs changed from [192.168.77.10] to [192.168.77.99]" {
		t.Errorf("told %q", r)
	}
	update("6", func(n *v1.Node) {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd00:77::99"})
	})
	if r := next("an IPv6 InternalIP added"); r != "the Node's IPs changed from [192.168.77.10] to [192.168.77.99 fd00:77::99]" {
		t.Errorf("told %q", r)
	}
	if err := nodes.Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := next("the Node deleted"); r != "the Node was deleted" {
		t.Errorf("told %q", r)
	}
}
