package agent

import (
	"errors"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// agentUser is the identity the agent runs as in TestAgentAgainstTheAPIServer:
// a user bound to nothing but the ClusterRole of deploy/rbac.yaml.
const agentUser = "ebpf-proxy-e2e"

// How long the agent is watched while the API server is down: long enough
// for several of its retries, short enough for the suite.
const apiDownFor = 3 * time.Second

// TestAgentAgainstTheAPIServer runs the agent as a cluster operator would,
// with the ClusterRole deploy/rbac.yaml ships, through the API server's
// life: started before the API server is up, it waits and then programs
// what it finds; across an API server restart it keeps serving every
// connection, resumes its watches and programs the changes made afterwards.
func TestAgentAgainstTheAPIServer(t *testing.T) {
	c := cluster.StartT(t, cluster.Options{Users: []cluster.User{{Name: agentUser}}})
	admin := c.Clientset()
	ctx := t.Context()
	bindDeployedRole(t, admin)
	kubeconfig, err := c.Kubeconfig(agentUser)
	if err != nil {
		t.Fatal(err)
	}
	tb := testbed.New(t, c, oneNode())
	node := tb.Nodes[0]
	a1, a2 := node.Pods[0], node.Pods[1]
	ensureNamespace(t, admin)

	// Written while the API server is up: the agent must find it later.
	early := netip.AddrPortFrom(netip.MustParseAddr("10.96.201.1"), 80)
	if err := createService(ctx, admin, "early", early.Addr()); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice("early", nil, a1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	c.StopAPIServer()
	// Started with this test's t, so that it lives through the subtests.
	agent := tb.StartProxy(t, node, testbed.ProxyOptions{Kind: testbed.EbpfProxy, Kubeconfig: kubeconfig, NoWait: true})
	t.Run("started before the API server, it waits and then programs", func(t *testing.T) {
		time.Sleep(apiDownFor)
		if err := agent.ExitError(); err != nil {
			t.Fatalf("agent gave up while the API server was down: %v\n%s", err, agent.LogTail(20))
		}
		if ts, err := agent.LastSync(ctx); err == nil && !ts.IsZero() {
			t.Errorf("agent reports a sync at %v before it could list anything", ts)
		}
		rep, err := node.Client.TCP(ctx, early, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Results[0]; r.Err == "" {
			t.Errorf("the ClusterIP answered (%s) before the agent could know the Service", r.Server)
		}
		if err := c.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitAnswer(ctx, node.Client, early, a1.Name+":8080"); err != nil {
			t.Fatalf("after the API server came up: %v\n%s", err, agent.LogTail(20))
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("an API server restart loses no connection and the watches resume", func(t *testing.T) {
		loop, err := node.Client.StartLoop(ctx, early, sandbox.LoopOptions{Interval: 5 * time.Millisecond, MaxDuration: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = loop.Stop() })
		pid := agent.PID()
		restartStart := time.Now()
		if err := c.RestartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("API server restarted in %s", time.Since(restartStart).Round(time.Millisecond))

		// Changes after the restart: a new Service, and new endpoints for
		// the one the loop uses.
		late := netip.AddrPortFrom(netip.MustParseAddr("10.96.201.2"), 80)
		if err := createService(ctx, admin, "late", late.Addr()); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice("late", nil, a2), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := waitAnswer(ctx, node.Client, late, a2.Name+":8080"); err != nil {
			t.Errorf("Service created after the restart: %v\n%s", err, agent.LogTail(20))
		}
		cur, err := admin.DiscoveryV1().EndpointSlices(namespace).Get(ctx, "early-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// A rolling update's step: a1 terminating (still serving), a2
		// ready. a1 stays in the slice, so the connections in flight to
		// it are drained, not ended (an endpoint that leaves the slices
		// has its connections ended: docs/architecture/differences.md).
		next := slice("early", nil, a2, a1)
		builders.Terminating(&next.Endpoints[1])
		next.ResourceVersion = cur.ResourceVersion
		if _, err := admin.DiscoveryV1().EndpointSlices(namespace).Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := waitAnswer(ctx, node.Client, early, a2.Name+":8080"); err != nil {
			t.Errorf("endpoints changed after the restart: %v", err)
		}

		res, err := loop.Stop()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("connection loop through the restart: %d attempts, answers %v", res.Attempts, res.Servers)
		if res.Attempts == 0 || res.Failures != 0 {
			t.Errorf("connection loop through the API server restart: %d of %d attempts failed (%v), want none",
				res.Failures, res.Attempts, res.Errors)
		}
		if res.Servers[a2.Name+":8080"] == 0 {
			t.Errorf("the loop never reached the new endpoint: answers %v", res.Servers)
		}
		if err := agent.ExitError(); err != nil || agent.PID() != pid {
			t.Errorf("agent did not survive the restart: %v", err)
		}
	})

	t.Run("the deployed RBAC rules are enough", func(t *testing.T) {
		// The agent's identity has those rules and nothing else.
		cs, err := c.ClientsetFor(agentUser)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s lists secrets: %v; want Forbidden", agentUser, err)
		}
		// The agent said nothing about being refused anything.
		for _, line := range strings.Split(agent.Log(), "\n") {
			if strings.Contains(strings.ToLower(line), "forbidden") {
				t.Errorf("agent log: %s", line)
			}
		}
	})

	t.Run("its Node's IP changing ends it with status 1, as kube-proxy 1.37, and the Services stay served", func(t *testing.T) {
		loop, err := node.Client.StartLoop(ctx, early, sandbox.LoopOptions{Interval: 5 * time.Millisecond, MaxDuration: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = loop.Stop() })
		n, err := admin.CoreV1().Nodes().Get(ctx, node.Spec.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.77"}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitExit(t, agent, "its Node's IP changed", "the Node's IPs changed from [", "to [192.0.2.77]")
		// What it programmed serves on until the kubelet starts it again.
		time.Sleep(time.Second)
		res, err := loop.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if res.Attempts == 0 || res.Failures != 0 {
			t.Errorf("connection loop through the agent's exit: %d of %d attempts failed (%v), want none", res.Failures, res.Attempts, res.Errors)
		}
	})
}

// nodeChangeGrace bounds how long the agent may take to see its Node's
// change and stop: one watch event and the sync loops' end.
const nodeChangeGrace = 30 * time.Second

// waitExit waits for agent to end, after what, with status 1 and a log
// holding every one of says.
func waitExit(t *testing.T, agent *testbed.Proxy, what string, says ...string) {
	t.Helper()
	select {
	case <-agent.Exited():
	case <-time.After(nodeChangeGrace):
		t.Fatalf("the agent still runs %s after %s\n%s", nodeChangeGrace, what, agent.LogTail(20))
	}
	var exit *exec.ExitError
	if err := agent.ExitError(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("after %s the agent ended with %v, want exit status 1", what, err)
	}
	for _, say := range says {
		if !strings.Contains(agent.Log(), say) {
			t.Errorf("after %s the agent's log does not say %q:\n%s", what, say, agent.LogTail(10))
		}
	}
}

// TestAgentStopsWhenItsNodeIsDeleted: kube-proxy 1.37 exits when its Node
// object is deleted, to start again from the Node's new state; so does the
// agent, and what it programmed keeps serving.
func TestAgentStopsWhenItsNodeIsDeleted(t *testing.T) {
	c := cluster.StartT(t, cluster.Options{})
	admin := c.Clientset()
	ctx := t.Context()
	tb := testbed.New(t, c, oneNode())
	node := tb.Nodes[0]
	ensureNamespace(t, admin)
	svc := netip.AddrPortFrom(netip.MustParseAddr("10.96.201.3"), 80)
	if err := createService(ctx, admin, "stays", svc.Addr()); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice("stays", nil, node.Pods[0]), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agent := tb.StartProxy(t, node, testbed.ProxyOptions{Kind: testbed.EbpfProxy})
	if err := waitAnswer(ctx, node.Client, svc, node.Pods[0].Name+":8080"); err != nil {
		t.Fatalf("%v\n%s", err, agent.LogTail(20))
	}
	if err := admin.CoreV1().Nodes().Delete(ctx, node.Spec.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitExit(t, agent, "its Node was deleted", "the Node was deleted")
	if err := waitAnswer(ctx, node.Client, svc, node.Pods[0].Name+":8080"); err != nil {
		t.Errorf("after the agent stopped: %v", err)
	}
}

// bindDeployedRole creates the ClusterRole of deploy/rbac.yaml, exactly as
// shipped, and binds it to agentUser; the user has no other rights. It also
// checks that the role grants no more than a proxy needs.
func bindDeployedRole(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	role, err := cluster.BindDeployedRole(t.Context(), admin, agentUser)
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range role.Rules {
		for _, verb := range rule.Verbs {
			switch verb {
			case "get", "list", "watch":
			case "create", "patch", "update":
				if !isEvents(rule) {
					t.Errorf("deploy/rbac.yaml lets the agent %s %v: a proxy only reads, and writes events", verb, rule.Resources)
				}
			default:
				t.Errorf("deploy/rbac.yaml grants %q on %v", verb, rule.Resources)
			}
		}
	}
}

func isEvents(r rbacv1.PolicyRule) bool {
	for _, res := range r.Resources {
		if res != "events" {
			return false
		}
	}
	return len(r.Resources) > 0
}
