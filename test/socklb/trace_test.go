package socklb_test

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/trace"
)

// `ebpf-proxy trace` from a pod (its IP and network namespace) and from the
// node, against what their real connections through the agent's socket
// programs do in the same setup: for each kind of frontend and verdict the
// trace's explanation must match where the connections go, or how they
// fail.
func TestAgentTraceAgreesWithTraffic(t *testing.T) {
	e := newSandbox(t, 2)
	dir := t.TempDir()
	http := builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http")))
	pods := podEndpoints(e.pods)
	var pods6 []discoveryv1.Endpoint
	for _, p := range e.pods {
		pods6 = append(pods6, builders.Endpoint(p.IP6.String(), nodeName))
	}
	ipv6 := func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeIPv6 }
	elsewhere := []discoveryv1.Endpoint{builders.Endpoint("10.244.9.9", "node-b")}
	var (
		web6VIP   = netip.MustParseAddrPort("[fd00:10:96::80]:80")
		stickyVIP = netip.MustParseAddrPort("10.96.0.81:80")
		emptyVIP  = netip.MustParseAddrPort("10.96.0.82:80")
		localVIP  = netip.MustParseAddrPort("10.96.0.83:80")
		rangedOut = netip.MustParseAddrPort("198.19.0.40:80")
		rangedIn  = netip.MustParseAddrPort("198.19.0.41:80")
		nothing   = netip.MustParseAddrPort("10.96.0.99:80")
	)
	svc := func(name string, opts ...builders.ServiceOption) *v1.Service {
		return builders.Service("default", name, append([]builders.ServiceOption{http}, opts...)...)
	}
	slice := func(name string, eps []discoveryv1.Endpoint, opts ...builders.SliceOption) *discoveryv1.EndpointSlice {
		return builders.EndpointSlice("default", name+"-1", name, eps, opts...)
	}
	if err := builders.WriteManifest(dir, "services.yaml",
		svc("web", builders.ClusterIP(webVIP.Addr().String()), builders.DualStack(web6VIP.Addr().String())),
		slice("web", pods), builders.EndpointSlice("default", "web-6", "web", pods6, ipv6),
		svc("sticky", builders.ClusterIP(stickyVIP.Addr().String()), builders.Affinity(600)), slice("sticky", pods),
		svc("empty", builders.ClusterIP(emptyVIP.Addr().String())), slice("empty", nil),
		svc("local", builders.ClusterIP(localVIP.Addr().String()), builders.InternalLocal()), slice("local", elsewhere),
		svc("ranged-out", builders.ClusterIP("10.96.0.84"), builders.LoadBalancer(30084, rangedOut.Addr().String()),
			builders.SourceRanges("203.0.113.0/24")), slice("ranged-out", pods),
		svc("ranged-in", builders.ClusterIP("10.96.0.85"), builders.LoadBalancer(30085, rangedIn.Addr().String()),
			builders.SourceRanges(netip.PrefixFrom(e.client.IP, 32).String())), slice("ranged-in", pods),
	); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	a := e.startAgent(t, dir, "--api-socket", sock)
	if err := a.WaitLog(time.Minute, []string{`"ipFamily":"IPv4","servicePorts":6`, `"ipFamily":"IPv6","servicePorts":1`}); err != nil {
		t.Fatalf("the agent never synced the ServicePorts: %v", err)
	}

	node := e.sb.ClientAt(e.node.Host)
	clientOf := map[*sandbox.Client][]string{
		e.client: {"--pod", e.client.IP.String(), "--netns", e.client.NS.Path()},
		node:     {"--node"},
	}
	traceFrom := func(t *testing.T, c *sandbox.Client, to netip.AddrPort) *trace.Result {
		t.Helper()
		args := append([]string{"--api-socket", sock}, clientOf[c]...)
		if to.Addr().Is6() {
			args = []string{"--api-socket", sock, "--pod", e.client.IP6.String(), "--netns", e.client.NS.Path()}
		}
		out, errOut, err := agent.Trace(e.node.NS.Path(), e.bpffs, append(args, "-o", "json", to.String())...)
		if err != nil {
			t.Fatal(err)
		}
		if errOut != "" {
			t.Errorf("trace with the agent up said on stderr: %s", errOut)
		}
		var r trace.Result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("trace -o json: %v\n%s", err, out)
		}
		if table, _, err := agent.Trace(e.node.NS.Path(), e.bpffs, append(args, to.String())...); err != nil {
			t.Error(err)
		} else {
			t.Logf("trace from %s to %s:\n%s", c.Name, to, table)
		}
		if r.Path != trace.PathSocket || !r.Named {
			t.Errorf("trace: path %s, named %v; want the socket programs, named", r.Path, r.Named)
		}
		return &r
	}
	podNamed := map[netip.Addr]string{}
	for _, p := range e.pods {
		podNamed[p.IP], podNamed[p.IP6] = p.Name, p.Name
	}
	// candidates are the pods trace lists as the frontend's backends.
	candidates := func(r *trace.Result) []string {
		var out []string
		for _, b := range r.Candidates {
			out = append(out, podNamed[b.Address])
		}
		slices.Sort(out)
		return out
	}
	// reached are the pods n connections from c to to reach; each must
	// succeed.
	reached := func(t *testing.T, c *sandbox.Client, to netip.AddrPort, n int) []string {
		t.Helper()
		got := map[string]bool{}
		for s := range e.tcpServers(t, c, to, netip.Addr{}, n) {
			got[s] = true
		}
		var out []string
		for s := range got {
			out = append(out, s)
		}
		slices.Sort(out)
		return out
	}
	// refused connects once from c to to and returns how it failed.
	refused := func(t *testing.T, c *sandbox.Client, to netip.AddrPort) sandbox.TCPResult {
		t.Helper()
		rep, err := c.WithTimeout(time.Second).TCP(e.ctx(), to, 1)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Results[0]
	}
	both := []string{e.pods[0].Name, e.pods[1].Name}

	for _, tc := range []struct {
		name    string
		client  *sandbox.Client
		to      netip.AddrPort
		kind    string
		verdict string
		rule    string
		// err is how a refused connect() fails, and fast whether at once.
		err  string
		fast bool
	}{
		{"ClusterIP: forward to a random backend", e.client, webVIP, "ClusterIP", trace.VerdictForward, trace.RuleEndpoints, "", false},
		{"IPv6 ClusterIP: forward to a random backend", e.client, web6VIP, "ClusterIP", trace.VerdictForward, trace.RuleEndpoints, "", false},
		{"the node's own socket: forward", node, webVIP, "ClusterIP", trace.VerdictForward, trace.RuleEndpoints, "", false},
		{"no endpoints: reject", e.client, emptyVIP, "ClusterIP", trace.VerdictReject, trace.RuleNoEndpoints, "ECONNREFUSED", true},
		{"internalTrafficPolicy Local without a local endpoint: drop", e.client, localVIP, "ClusterIP", trace.VerdictDrop,
			trace.RuleTrafficPolicyLocal, "ETIMEDOUT", true},
		{"LoadBalancer IP, pod outside the source ranges: drop", e.client, rangedOut, "LoadBalancer", trace.VerdictDrop,
			trace.RuleSourceRange, "ETIMEDOUT", false},
		{"LoadBalancer IP, pod within the source ranges: forward", e.client, rangedIn, "LoadBalancer", trace.VerdictForward,
			trace.RuleEndpoints, "", false},
		{"no Service: untouched", e.client, nothing, "", trace.VerdictUntouched, trace.RuleNoFrontend, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := traceFrom(t, tc.client, tc.to)
			kind := ""
			if r.Frontend != nil {
				kind = r.Frontend.Kind
			}
			if kind != tc.kind || r.Verdict != tc.verdict || r.Rule != tc.rule {
				t.Errorf("trace: frontend %q, %s (%s); want %q, %s (%s)", kind, r.Verdict, r.Rule, tc.kind, tc.verdict, tc.rule)
			}
			switch {
			case tc.verdict == trace.VerdictForward:
				if r.Selection == nil || r.Selection.Method != trace.MethodRandom || r.Selection.Backend != nil || r.SNAT != nil {
					t.Errorf("trace: selection %+v, source NAT %+v; want a random choice, no source NAT", r.Selection, r.SNAT)
				}
				if want, got := candidates(r), reached(t, tc.client, tc.to, 30); !slices.Equal(want, both) || !slices.Equal(got, want) {
					t.Errorf("trace's candidates %v, 30 connections reached %v; want both pods for both", want, got)
				}
			case tc.verdict == trace.VerdictUntouched:
				if got := refused(t, tc.client, tc.to); got.Server != "" {
					t.Errorf("connection to %s (no Service) reached %s", tc.to, got.Server)
				}
			default:
				got := refused(t, tc.client, tc.to)
				if got.Err != tc.err || tc.fast && got.Elapsed > 500*time.Millisecond {
					t.Errorf("connection: %+v; want %s (at once: %v) as trace's %s says", got, tc.err, tc.fast, tc.verdict)
				}
			}
		})
	}

	t.Run("a pod by its network namespace alone: its address from its route", func(t *testing.T) {
		out, _, err := agent.Trace(e.node.NS.Path(), e.bpffs, "--api-socket", sock, "--netns", e.client.NS.Path(), "-o", "json", rangedOut.String())
		if err != nil {
			t.Fatal(err)
		}
		var r trace.Result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("trace -o json: %v\n%s", err, out)
		}
		if r.Client.Kind != trace.ClientPod || r.Client.Address != e.client.IP || r.Client.NetnsCookie == 0 || r.Rule != trace.RuleSourceRange {
			t.Errorf("client %+v, %s (%s); want the pod %s found by its route, dropped by the source ranges", r.Client, r.Verdict, r.Rule, e.client.IP)
		}
	})

	t.Run("session affinity: the pod's entry decides, with its age", func(t *testing.T) {
		r := traceFrom(t, e.client, stickyVIP)
		if r.Selection == nil || r.Selection.Method != trace.MethodRandom || r.Selection.AffinityTimeoutSeconds != 600 || r.Selection.AffinityAgeSeconds != nil {
			t.Fatalf("trace before any connection: %+v, want a random choice, no entry yet", r.Selection)
		}
		first := reached(t, e.client, stickyVIP, 1)
		r = traceFrom(t, e.client, stickyVIP)
		s := r.Selection
		if s == nil || s.Method != trace.MethodAffinity || s.Backend == nil || s.AffinityAgeSeconds == nil ||
			*s.AffinityAgeSeconds < 0 || *s.AffinityAgeSeconds > 60 || s.AffinityTimeoutSeconds != 600 {
			t.Fatalf("trace after a connection: %+v, want the pod's affinity entry, younger than a minute", s)
		}
		if got := reached(t, e.client, stickyVIP, 20); !slices.Equal(got, []string{podNamed[s.Backend.Address]}) || !slices.Equal(first, got) {
			t.Errorf("trace said affinity to %s; the first connection reached %v, 20 more %v", podNamed[s.Backend.Address], first, got)
		}
		// The node is another client: no entry of its own yet.
		if r := traceFrom(t, node, stickyVIP); r.Selection == nil || r.Selection.Method != trace.MethodRandom {
			t.Errorf("trace from the node: %+v, want a random choice (the pod's entry is the pod's)", r.Selection)
		}
	})

	// What the connections above did, counted by the programs and named
	// by dump counters.
	t.Run("dump counters names what the programs counted", func(t *testing.T) {
		out, errOut, err := agent.DumpWith(e.bpffs, "counters", "-o", "json")
		if err != nil || errOut != "" {
			t.Fatalf("dump counters: %v %s", err, errOut)
		}
		var r dump.CountersReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("dump counters -o json: %v\n%s", err, out)
		}
		got := map[string]uint64{}
		for _, c := range r.Counters {
			if c.Description == "" {
				t.Errorf("counter %s has no description", c.Event)
			}
			got[c.Event] = c.Count
		}
		if len(r.Counters) != len(loader.CounterNames) {
			t.Errorf("%d counters, want %d", len(r.Counters), len(loader.CounterNames))
		}
		for _, ev := range []string{"translated_tcp", "rejected_no_endpoints", "dropped_no_local_endpoints", "sock_dropped_source_range", "affinity_hit"} {
			if got[ev] == 0 {
				t.Errorf("%s counted 0 after the connections above:\n%s", ev, out)
			}
		}
		table, _, err := agent.DumpWith(e.bpffs, "counters")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("dump counters:\n%s", table)
		if !strings.Contains(table, "translated_tcp") || strings.Contains(table, "tc_reset_failed") || !strings.Contains(table, "-o wide shows them") {
			t.Errorf("dump counters table: want the events that happened only, and a note on the others:\n%s", table)
		}
	})

	// The agent gone, trace reads the same maps and shows the ids, saying
	// why on one line of stderr.
	t.Run("without the agent: the maps' ids", func(t *testing.T) {
		a.Terminate(t, 15*time.Second)
		out, errOut, err := agent.Trace(e.node.NS.Path(), e.bpffs, "--api-socket", sock, "--pod", e.client.IP.String(), "-o", "json", emptyVIP.String())
		if err != nil {
			t.Fatal(err)
		}
		var r trace.Result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("trace -o json: %v\n%s", err, out)
		}
		if r.Named || r.Frontend == nil || r.Frontend.Service.Name != "" || r.Frontend.Service.ServiceID == 0 || r.Verdict != trace.VerdictReject {
			t.Errorf("trace without the agent: named %v, frontend %+v, %s; want empty's reject under its id", r.Named, r.Frontend, r.Verdict)
		}
		if !strings.Contains(errOut, "no agent answered on "+sock) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("stderr %q, want one line saying no agent answered", errOut)
		}
	})
}
