package chaos

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// Env selects the long version of every scenario when set to "long"
// (`make chaos`); otherwise the short one runs (`make e2e`).
const Env = "EBPF_PROXY_CHAOS"

// OutDirEnv names a directory where the summary lines are also written,
// to chaos.txt, for make to print (go test shows a passing package's
// output only with -v).
const OutDirEnv = "EBPF_PROXY_E2E_OUT"

// settings are the sizes of the scenarios.
type settings struct {
	// kills SIGKILLs of the agent, at random moments of killSpan.
	kills    int
	killSpan time.Duration
	// apiDown is how long the API server is gone.
	apiDown time.Duration
	// rolling is how long endpoints are replaced, one step a second.
	rolling time.Duration
	// fullFor is how long the map stays full, the agent retrying its
	// syncs, while the clients run.
	fullFor time.Duration
	// churn is how long Services are made, changed and deleted while
	// the agent's resources are watched.
	churn time.Duration
}

var (
	short = settings{kills: 5, killSpan: 20 * time.Second, apiDown: 10 * time.Second, rolling: 15 * time.Second,
		fullFor: 5 * time.Second, churn: 30 * time.Second}
	long = settings{kills: 20, killSpan: 2 * time.Minute, apiDown: 60 * time.Second, rolling: 2 * time.Minute,
		fullFor: 30 * time.Second, churn: 10 * time.Minute}
)

func current() (settings, string) {
	if os.Getenv(Env) == "long" {
		return long, "long"
	}
	return short, "short"
}

// The ports every pod serves, and the Service ports in front of them.
const (
	podTCP = 8080
	podUDP = 8053
	svcTCP = 80
	svcUDP = 53
)

// propagation is how soon after the API server's return its changes must
// be in the maps. The agent's requests wait for the API server and are sent
// within 0.24 s of its return (k8swatch.Redial). A waiting list then
// brings the changes at once: 0.05-0.3 s in all. A waiting watch does not:
// the restarted API server's watch cache begins after the changes made
// while it was away, so it answers the old resource version with 410 Gone,
// and client-go's reflector relists only after its backoff, 0.8-1.6 s,
// which an informer cannot shorten (kube-proxy waits the same). Which of
// the two waits depends on where each reflector was when the node was cut
// off; both were seen, the second in about two runs of three on a busy
// two-core machine (1.1-1.8 s). With a list and a sync on such a machine
// (0.3 s) and the probe's attempt timeout, 2.5 s.
const propagation = 2500 * time.Millisecond

// TestChaos runs every scenario on one control plane, each on a testbed of
// its own.
func TestChaos(t *testing.T) {
	s, version := current()
	c := cluster.StartT(t, cluster.Options{})
	t.Logf("chaos: %s version: %+v", version, s)
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *env, settings)
	}{
		{"kill", testKill},
		{"apiserver", testAPIServerGone},
		{"rolling", testRolling},
		{"mapfull", testMapFull},
		{"pins", testPinsRemoved},
		{"churn", testChurn},
	} {
		t.Run(sc.name, func(t *testing.T) {
			sc.run(t, newEnv(t, c, sc.name), s)
		})
	}
}

// env is one scenario's world: a node with pods, its own namespace in the
// API server, and the summary it reports.
type env struct {
	c    *cluster.Cluster
	cs   kubernetes.Interface
	tb   *testbed.Testbed
	node *testbed.Node
	ns   string
	name string
}

// podNames are the pods of every scenario's node.
var podNames = []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}

func newEnv(t *testing.T, c *cluster.Cluster, scenario string) *env {
	tb := testbed.New(t, c, testbed.Options{
		Nodes:    []testbed.NodeSpec{{Name: "node-a", Pods: podNames}},
		TCPPorts: []uint16{podTCP},
		UDPPorts: []uint16{podUDP},
	})
	e := &env{c: c, cs: c.Clientset(), tb: tb, node: tb.Nodes[0], ns: "chaos-" + scenario, name: scenario}
	if err := builders.CreateNamespace(t.Context(), e.cs, e.ns); err != nil {
		t.Fatal(err)
	}
	// No namespace controller runs: the scenario's objects go one by one,
	// so that the next scenario's agent does not see them.
	t.Cleanup(func() {
		ctx := context.Background()
		_ = e.cs.DiscoveryV1().EndpointSlices(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		svcs, err := e.cs.CoreV1().Services(e.ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, svc := range svcs.Items {
				_ = e.cs.CoreV1().Services(e.ns).Delete(ctx, svc.Name, metav1.DeleteOptions{})
			}
		}
	})
	return e
}

// pod returns pod i of the node.
func (e *env) pod(i int) *sandbox.Pod { return e.node.Pods[i%len(e.node.Pods)] }

// startAgent starts ebpf-proxy on the node and waits for its first sync.
func (e *env) startAgent(t *testing.T, args ...string) *testbed.Proxy {
	t.Helper()
	return e.tb.StartProxy(t, e.node, testbed.ProxyOptions{Kind: testbed.EbpfProxy, Args: args})
}

// createService creates Service name at ClusterIP ip (the API server
// allocates one when ip is the zero Addr) with a TCP and a UDP port, and
// its EndpointSlice with the pods as ready endpoints.
func (e *env) createService(ctx context.Context, name string, ip netip.Addr, pods ...*sandbox.Pod) error {
	clusterIP := ""
	if ip.IsValid() {
		clusterIP = ip.String()
	}
	svc := builders.Service(e.ns, name, builders.ClusterIP(clusterIP), builders.Ports(
		builders.Port("tcp", svcTCP, corev1.ProtocolTCP, intstr.FromInt32(podTCP)),
		builders.Port("udp", svcUDP, corev1.ProtocolUDP, intstr.FromInt32(podUDP))))
	_, err := builders.CreateService(ctx, e.cs, svc, e.slice(name, pods, nil))
	return err
}

// slice renders the EndpointSlice of Service svc: ready are ready
// endpoints, terminating are serving and terminating ones.
func (e *env) slice(svc string, ready, terminating []*sandbox.Pod) *discoveryv1.EndpointSlice {
	var eps []discoveryv1.Endpoint
	for _, p := range ready {
		eps = append(eps, builders.Endpoint(p.IP.String(), e.node.Spec.Name))
	}
	for _, p := range terminating {
		eps = append(eps, builders.Endpoint(p.IP.String(), e.node.Spec.Name, builders.Terminating))
	}
	return builders.EndpointSlice(e.ns, svc+"-1", svc, eps, builders.SlicePorts(
		builders.SlicePort("tcp", podTCP, corev1.ProtocolTCP),
		builders.SlicePort("udp", podUDP, corev1.ProtocolUDP)))
}

// setEndpoints replaces the endpoints of Service svc.
func (e *env) setEndpoints(ctx context.Context, svc string, ready, terminating []*sandbox.Pod) error {
	slices := e.cs.DiscoveryV1().EndpointSlices(e.ns)
	cur, err := slices.Get(ctx, svc+"-1", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get endpoints of %s: %w", svc, err)
	}
	next := e.slice(svc, ready, terminating)
	next.ResourceVersion = cur.ResourceVersion
	if _, err := slices.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update endpoints of %s: %w", svc, err)
	}
	return nil
}

// deleteService deletes Service name and its EndpointSlice.
func (e *env) deleteService(ctx context.Context, name string) error {
	if err := e.cs.CoreV1().Services(e.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete service %s: %w", name, err)
	}
	err := e.cs.DiscoveryV1().EndpointSlices(e.ns).Delete(ctx, name+"-1", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete endpoints of %s: %w", name, err)
	}
	return nil
}

// Bounds of the waits; they are not speed assertions.
const waitBound = 60 * time.Second

// waitServes waits, bounded, until server answers TCP on ip from the
// node's client pod.
func (e *env) waitServes(ctx context.Context, ip netip.Addr, server string) error {
	return e.node.Client.AwaitServer(ctx, netip.AddrPortFrom(ip, svcTCP), sandbox.WaitOptions{Server: server,
		Timeout: time.Second, Interval: 5 * time.Millisecond, MaxDuration: waitBound})
}

// waitAttached waits, bounded, until agent has attached its TC programs.
// They attach at the sync that first knows the node's addresses, which may
// follow the one that serves (the Node arriving after the Services): a
// scenario that counts what the agent holds, or removes it, starts once it
// is settled.
func waitAttached(t *testing.T, agent *testbed.Proxy) {
	t.Helper()
	if err := testbed.Poll(t.Context(), "the agent attaches its TC programs", waitBound, func() (bool, error) {
		return strings.Contains(agent.Log(), "TC programs attached"), nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, agent.LogTail(20))
	}
}

// load is a scenario's clients: a TCP and a UDP loop from the node's
// client pod to one Service, a new connection (a new socket) each attempt.
type load struct {
	tcp, udp *sandbox.Loop
	start    time.Time
}

// Each loop's pause between attempts, and the bound of each attempt: an
// answer later than this counts as a failure.
const (
	loopInterval = 10 * time.Millisecond
	loopTimeout  = 2 * time.Second
)

// startLoad starts the clients of Service ip, bounded by max.
func (e *env) startLoad(t *testing.T, ip netip.Addr, max time.Duration) *load {
	t.Helper()
	ctx := t.Context()
	l := &load{start: time.Now()}
	var err error
	opts := sandbox.LoopOptions{Interval: loopInterval, Timeout: loopTimeout, MaxDuration: max}
	if l.tcp, err = e.node.Client.StartLoop(ctx, netip.AddrPortFrom(ip, svcTCP), opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = l.tcp.Stop() })
	opts.UDP = true
	if l.udp, err = e.node.Client.StartLoop(ctx, netip.AddrPortFrom(ip, svcUDP), opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = l.udp.Stop() })
	return l
}

// result is what the clients of a scenario saw.
type result struct {
	tcp, udp sandbox.LoopResult
}

func (r result) attempts() int { return r.tcp.Attempts + r.udp.Attempts }
func (r result) failed() int   { return r.tcp.Failures + r.udp.Failures }

// stop stops both loops and returns what they saw.
func (l *load) stop(t *testing.T) result {
	t.Helper()
	var r result
	var err error
	if r.tcp, err = l.tcp.Stop(); err != nil {
		t.Fatal(err)
	}
	if r.udp, err = l.udp.Stop(); err != nil {
		t.Fatal(err)
	}
	return r
}

// summaries collects the summary lines of the run for OutDirEnv.
var summaries struct {
	mu    sync.Mutex
	lines []string
}

// report prints the scenario's summary line and fails the test if a client
// failed, unless failures are allowed (the pin removal reports its cost),
// or if the clients made no attempt at all. extra is appended to the line
// ("key=value ...").
func (e *env) report(t *testing.T, r result, allowFailures bool, extra string) {
	t.Helper()
	line := fmt.Sprintf("chaos: scenario=%s attempts=%d failed=%d tcp=%d/%d udp=%d/%d", e.name, r.attempts(), r.failed(),
		r.tcp.Attempts, r.tcp.Failures, r.udp.Attempts, r.udp.Failures)
	if extra != "" {
		line += " " + extra
	}
	if t.Failed() {
		line += " (scenario failed)"
	}
	t.Log(line)
	fmt.Println(line)
	summaries.mu.Lock()
	summaries.lines = append(summaries.lines, line)
	lines := strings.Join(summaries.lines, "\n") + "\n"
	summaries.mu.Unlock()
	if dir := os.Getenv(OutDirEnv); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "chaos.txt"), []byte(lines), 0o644); err != nil {
			t.Errorf("write summary: %v", err)
		}
	}
	if r.tcp.Attempts == 0 || r.udp.Attempts == 0 {
		t.Errorf("the clients made no attempt: tcp %d, udp %d", r.tcp.Attempts, r.udp.Attempts)
	}
	if r.failed() != 0 && !allowFailures {
		t.Errorf("%d of %d connections failed (tcp %v, udp %v); want none", r.failed(), r.attempts(), r.tcp.Errors, r.udp.Errors)
	}
	if r.failed() != 0 {
		t.Logf("errors: tcp %v, udp %v", r.tcp.Errors, r.udp.Errors)
	}
	t.Logf("answers: tcp %v, udp %v", r.tcp.Servers, r.udp.Servers)
}
