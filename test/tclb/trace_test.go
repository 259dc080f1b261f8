package tclb_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/trace"
)

// `ebpf-proxy trace` from a client outside, against what the client's real
// connections through the agent's TC programs do in the same setup: for
// each kind of frontend and verdict the trace's explanation (frontend kind,
// verdict, rule, backend, source NAT) must match where a connection from
// the same source port goes, or how it fails.
func TestAgentTraceAgreesWithTraffic(t *testing.T) {
	e := newTopology(t)
	node := e.nodes[0]
	dir := t.TempDir()
	e.writeAgentManifests(t, dir)
	podA, podB := e.pods["pod-a"].IP, e.pods["pod-b"].IP
	http := builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http")))
	onA := builders.Endpoint(podA.String(), "node-a")
	onB := builders.Endpoint(podB.String(), "node-b")
	slice := func(svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return builders.EndpointSlice("default", svc+"-1", svc, eps)
	}
	both := builders.Service("default", "both", builders.ClusterIP("10.96.0.86"), http, builders.NodePort(30086))
	sticky := builders.Service("default", "sticky", builders.ClusterIP("10.96.0.82"), http, builders.NodePort(30082), builders.Affinity(600))
	noLocal := builders.Service("default", "no-local", builders.ClusterIP("10.96.0.84"), http, builders.NodePort(30084), builders.ExternalLocal(0))
	empty := builders.Service("default", "empty", builders.ClusterIP("10.96.0.85"), http, builders.NodePort(30085))
	ranged := builders.Service("default", "ranged", builders.ClusterIP("10.96.0.83"), http, builders.LoadBalancer(30083, rangedIP.String()),
		builders.SourceRanges(netip.PrefixFrom(e.client.IP, 32).String()))
	ext := builders.Service("default", "ext", builders.ClusterIP("10.96.0.87"), http, builders.ExternalIPs(extIP.String()))
	dual := builders.Service("default", "dual", builders.ClusterIP("10.96.0.88"), builders.DualStack("fd00:10:96::88"), http, builders.NodePort(30088))
	ipv6 := func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeIPv6 }
	dual6 := builders.EndpointSlice("default", "dual-6", "dual", []discoveryv1.Endpoint{
		builders.Endpoint(e.pods["pod-a"].IP6.String(), "node-a"), builders.Endpoint(e.pods["pod-b"].IP6.String(), "node-b")}, ipv6)
	if err := builders.WriteManifest(dir, "more.yaml",
		both, slice("both", onA, onB), sticky, slice("sticky", onA, onB), noLocal, slice("no-local", onB),
		empty, slice("empty"), ranged, slice("ranged", onB), ext, slice("ext", onB), dual, slice("dual", onA, onB), dual6); err != nil {
		t.Fatal(err)
	}
	cg, err := e.sb.AddCgroup("agent")
	if err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(e.sb.BPFFS.Path(), "agent")
	t.Cleanup(func() { agent.Cleanup(context.Background(), node.NS.Path(), bpffs) })
	sock := filepath.Join(t.TempDir(), "agent.sock")
	a := e.startAgent(t, dir, bpffs, cg, "--api-socket", sock, "--lb-algorithm", "maglev", "--maglev-table-size", "1021")
	defer a.Terminate(t, 15*time.Second)
	if err := a.WaitLog(time.Minute, []string{`"ipFamily":"IPv4","servicePorts":9`, `"ipFamily":"IPv6","servicePorts":1`}); err != nil {
		t.Fatalf("the agent never synced the IPv4 ServicePorts: %v", err)
	}

	traceFrom := func(t *testing.T, c *sandbox.Client, port uint16, to netip.AddrPort) *trace.Result {
		t.Helper()
		src := c.IP
		if to.Addr().Is6() {
			src = c.IP6
		}
		args := []string{"--api-socket", sock, "--source", src.String(), "--device", sandbox.IfaceName}
		if port != 0 {
			args = append(args, "--source-port", strconv.Itoa(int(port)))
		}
		out, errOut, err := agent.Trace(node.NS.Path(), bpffs, append(args, "-o", "json", to.String())...)
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
		if table, _, err := agent.Trace(node.NS.Path(), bpffs, append(args, to.String())...); err != nil {
			t.Error(err)
		} else {
			t.Logf("trace from %s port %d to %s:\n%s", src, port, to, table)
		}
		return &r
	}
	connect := func(t *testing.T, c *sandbox.Client, port uint16, to netip.AddrPort) sandbox.TCPResult {
		t.Helper()
		r, err := c.WithTimeout(time.Second).TCPFrom(e.ctx(), to, port)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	podNamed := map[netip.Addr]string{podA: "pod-a", podB: "pod-b", e.pods["pod-a"].IP6: "pod-a", e.pods["pod-b"].IP6: "pod-b"}
	// agree checks a forwarded trace against the connection: served by
	// the backend the trace chose, seeing the source NAT address the trace
	// gave it (or the client's own).
	agree := func(t *testing.T, r *trace.Result, c *sandbox.Client, got sandbox.TCPResult) {
		t.Helper()
		if r.Selection == nil || r.Selection.Backend == nil {
			t.Fatalf("trace chose no backend: %+v", r)
		}
		want := podNamed[r.Selection.Backend.Address]
		seen := c.IP
		if r.Destination.Addr().Is6() {
			seen = c.IP6
		}
		if r.SNAT != nil {
			seen = r.SNAT.Address
		}
		if got.Err != "" || got.Server != want || got.ClientSeen.Addr() != seen {
			t.Errorf("connection: %+v; trace said %s (%s) seeing %s", got, want, r.Selection.Method, seen)
		}
	}
	nextPort := uint16(41000)
	port := func() uint16 { nextPort++; return nextPort }

	for _, tc := range []struct {
		name    string
		client  *sandbox.Client
		to      netip.AddrPort
		kind    string
		verdict string
		rule    string
		// server is the pod a forwarded connection reaches, snat the
		// address it sees (zero: the client's).
		server string
		snat   netip.Addr
		// err is how a connection that is not forwarded fails.
		err string
	}{
		{"NodePort, backend on another node: forward with source NAT", e.client, netip.AddrPortFrom(node.IP, 30080),
			"NodePort", trace.VerdictForward, trace.RuleEndpoints, "pod-b", node.IP, ""},
		{"NodePort, externalTrafficPolicy Local: forward, the client's address kept", e.client, netip.AddrPortFrom(node.IP, 30081),
			"NodePort", trace.VerdictForward, trace.RuleEndpoints, "pod-a", netip.Addr{}, ""},
		{"externalTrafficPolicy Local without a local endpoint: drop", e.client, netip.AddrPortFrom(node.IP, 30084),
			"NodePort", trace.VerdictDrop, trace.RuleTrafficPolicyLocal, "", netip.Addr{}, "ETIMEDOUT"},
		{"no endpoints: reject", e.client, netip.AddrPortFrom(node.IP, 30085),
			"NodePort", trace.VerdictReject, trace.RuleNoEndpoints, "", netip.Addr{}, "ECONNREFUSED"},
		{"LoadBalancer IP, client within the source ranges: forward", e.client, netip.AddrPortFrom(rangedIP, 80),
			"LoadBalancer", trace.VerdictForward, trace.RuleEndpoints, "pod-b", node.IP, ""},
		{"LoadBalancer IP, client outside the source ranges: drop", e.other, netip.AddrPortFrom(rangedIP, 80),
			"LoadBalancer", trace.VerdictDrop, trace.RuleSourceRange, "", netip.Addr{}, "ETIMEDOUT"},
		{"ExternalIP: forward", e.client, netip.AddrPortFrom(extIP, 80),
			"ExternalIP", trace.VerdictForward, trace.RuleEndpoints, "pod-b", node.IP, ""},
		{"no Service on the port: untouched, the node's own stack answers", e.client, netip.AddrPortFrom(node.IP, 30099),
			"", trace.VerdictUntouched, trace.RuleNoFrontend, "", netip.Addr{}, "ECONNREFUSED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := port()
			r := traceFrom(t, tc.client, p, tc.to)
			kind := ""
			if r.Frontend != nil {
				kind = r.Frontend.Kind
			}
			if r.Path != trace.PathTC || kind != tc.kind || r.Verdict != tc.verdict || r.Rule != tc.rule || !r.Named {
				t.Errorf("trace: path %s, frontend %q, %s (%s), named %v; want tc, %q, %s (%s), named", r.Path, kind, r.Verdict, r.Rule, r.Named, tc.kind, tc.verdict, tc.rule)
			}
			got := connect(t, tc.client, p, tc.to)
			if tc.verdict != trace.VerdictForward {
				if got.Err != tc.err {
					t.Errorf("connection: %+v, want %s as trace's %s says", got, tc.err, tc.verdict)
				}
				return
			}
			if r.Selection == nil || r.Selection.Backend == nil || podNamed[r.Selection.Backend.Address] != tc.server {
				t.Errorf("trace chose %+v, want %s", r.Selection, tc.server)
			}
			if (r.SNAT == nil) != !tc.snat.IsValid() || (r.SNAT != nil && r.SNAT.Address != tc.snat) {
				t.Errorf("trace's source NAT %+v, want %v", r.SNAT, tc.snat)
			}
			agree(t, r, tc.client, got)
		})
	}

	t.Run("ClusterIP from outside: untouched, never translated", func(t *testing.T) {
		to := netip.MustParseAddrPort("10.96.0.86:80")
		r := traceFrom(t, e.client, port(), to)
		if r.Verdict != trace.VerdictUntouched || r.Rule != trace.RuleNotExternal || r.Frontend == nil || r.Frontend.Service.Name != "both" {
			t.Errorf("trace: %s (%s), frontend %+v; want untouched (%s) for both's ClusterIP", r.Verdict, r.Rule, r.Frontend, trace.RuleNotExternal)
		}
		if got := connect(t, e.client, port(), to); got.Server != "" {
			t.Errorf("connection to the ClusterIP from outside reached %s: %+v", got.Server, got)
		}
	})

	// Maglev: the table's slot for the flow's hash decides. Ports are
	// taken until each backend was predicted twice, so the test checks a
	// choice between two, whatever the hash gives.
	t.Run("Maglev: the slot of the flow's hash picks the backend, and the flow then holds it", func(t *testing.T) {
		to := netip.AddrPortFrom(node.IP, 30086)
		predicted := map[string]int{}
		for i := 0; i < 40 && (predicted["pod-a"] < 2 || predicted["pod-b"] < 2); i++ {
			p := port()
			r := traceFrom(t, e.client, p, to)
			if r.Verdict != trace.VerdictForward || r.Selection == nil || r.Selection.Method != trace.MethodMaglev ||
				r.Selection.MaglevTableSize != 1021 || r.Selection.MaglevIndex == nil || r.Selection.Backend == nil || len(r.Flows) != 0 {
				t.Fatalf("trace from port %d: %+v, want forward by a Maglev slot of 1021, no flow yet", p, r.Selection)
			}
			predicted[podNamed[r.Selection.Backend.Address]]++
			got := connect(t, e.client, p, to)
			agree(t, r, e.client, got)

			again := traceFrom(t, e.client, p, to)
			if again.Rule != trace.RuleExistingFlow || again.Selection == nil || again.Selection.Method != trace.MethodExistingFlow ||
				again.Selection.Backend == nil || podNamed[again.Selection.Backend.Address] != got.Server || len(again.Flows) != 1 {
				t.Errorf("trace of port %d after the connection: %s, %+v; want the existing flow to %s", p, again.Rule, again.Selection, got.Server)
			}
		}
		if predicted["pod-a"] < 2 || predicted["pod-b"] < 2 {
			t.Errorf("40 source ports predicted %v: want both backends", predicted)
		}
	})

	t.Run("IPv6 NodePort: the Maglev slot of the flow's hash, source NAT to the node's IPv6 address", func(t *testing.T) {
		to := netip.AddrPortFrom(node.IP6, 30088)
		predicted := map[string]int{}
		for i := 0; i < 40 && (predicted["pod-a"] < 1 || predicted["pod-b"] < 1); i++ {
			p := port()
			r := traceFrom(t, e.client, p, to)
			if r.IPFamily != "IPv6" || r.Verdict != trace.VerdictForward || r.Selection == nil || r.Selection.Method != trace.MethodMaglev ||
				r.Selection.Backend == nil || r.Frontend == nil || r.Frontend.Service.Name != "dual" {
				t.Fatalf("trace from port %d: %s %s, %+v; want dual's IPv6 NodePort forwarded by a Maglev slot", p, r.IPFamily, r.Verdict, r.Selection)
			}
			b := podNamed[r.Selection.Backend.Address]
			predicted[b]++
			if wantSNAT := b == "pod-b"; (r.SNAT != nil) != wantSNAT || wantSNAT && r.SNAT.Address != node.IP6 {
				t.Errorf("trace to %s: source NAT %+v; want %s only for the backend on node-b", b, r.SNAT, node.IP6)
			}
			agree(t, r, e.client, connect(t, e.client, p, to))
		}
		if predicted["pod-a"] < 1 || predicted["pod-b"] < 1 {
			t.Errorf("40 source ports predicted %v: want both backends", predicted)
		}
	})

	t.Run("session affinity: the client's entry decides, with its age", func(t *testing.T) {
		to := netip.AddrPortFrom(node.IP, 30082)
		p := port()
		r := traceFrom(t, e.client, p, to)
		if r.Verdict != trace.VerdictForward || r.Selection == nil || r.Selection.Method != trace.MethodMaglev ||
			r.Selection.AffinityTimeoutSeconds != 600 || r.Selection.AffinityAgeSeconds != nil {
			t.Fatalf("trace before any connection: %+v, want a Maglev choice, no affinity entry yet", r.Selection)
		}
		first := connect(t, e.client, p, to)
		agree(t, r, e.client, first)
		for range 4 {
			p := port()
			r := traceFrom(t, e.client, p, to)
			s := r.Selection
			if s == nil || s.Method != trace.MethodAffinity || s.Backend == nil || podNamed[s.Backend.Address] != first.Server ||
				s.AffinityAgeSeconds == nil || *s.AffinityAgeSeconds < 0 || *s.AffinityAgeSeconds > 60 || s.AffinityTimeoutSeconds != 600 {
				t.Fatalf("trace after a connection to %s: %+v, want its affinity entry, younger than a minute", first.Server, s)
			}
			agree(t, r, e.client, connect(t, e.client, p, to))
		}
	})

	t.Run("without a source port: the client's flows, and Maglev depends on the port", func(t *testing.T) {
		r := traceFrom(t, e.client, 0, netip.AddrPortFrom(node.IP, 30086))
		if r.Selection == nil || r.Selection.Method != trace.MethodMaglev || r.Selection.Backend != nil || len(r.Flows) == 0 {
			t.Errorf("trace without --source-port: %+v, %d flows; want a Maglev choice left open and the earlier flows", r.Selection, len(r.Flows))
		}
		for _, f := range r.Flows {
			if f.Client.Addr() != e.client.IP || !f.Backend.IsValid() {
				t.Errorf("flow %+v, want one of the client's", f)
			}
		}
	})
}
