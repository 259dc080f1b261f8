package behaviour

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Source expectations.
const (
	// AnySource does not check the client address the server saw.
	AnySource = iota
	// Preserved: the server saw the client's own address.
	Preserved
	// Masqueraded: the server saw another address (the node's).
	Masqueraded
)

// Want is the expected outcome of a behaviour row.
type Want struct {
	// Verdict is model.Forward (connections reach Servers), model.Reject
	// (refused at once) or model.Drop (no answer).
	Verdict model.Action
	// Servers are the pods that answer, every one of them and no other.
	Servers []string
	// Source is what the servers saw as the client address.
	Source int
	// Sticky: every connection reaches the same one of Servers.
	Sticky bool
}

// Case is one row: a client connects to a destination.
type Case struct {
	Name string
	From string
	To   netip.AddrPort
	UDP  bool
	Want Want
	// Modes lists the dataplanes whose Want differs, by dataplane Name.
	Modes map[string]Want
}

func ap(ip netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(ip, port) }

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func forward(source int, servers ...string) Want {
	return Want{Verdict: model.Forward, Servers: servers, Source: source}
}

var (
	rejected = Want{Verdict: model.Reject}
	dropped  = Want{Verdict: model.Drop}
)

// ModeIPVS is the IPVS dataplane's name. Like upstream's IPVS mode it
// keys a virtual server on the destination alone, so it cannot send pods
// and the node to all endpoints of an externalTrafficPolicy=Local frontend
// while outside clients get the local ones (model.Service.ShortCircuit):
// every client gets the External verdict. The rows that differ say so.
const ModeIPVS = "ipvs"

// ModeEBPF is the BPF dataplane's name. Its socket hooks translate a pod's
// or the node's connection before any packet exists, so the client's
// address is kept where kube-proxy masquerades (a pod reaching its own
// Service, a pod reaching a NodePort): there is nothing to masquerade and
// the reply path is the ordinary one, as with Cilium's socket load
// balancer. The rows that differ say so.
const ModeEBPF = "ebpf"

// ModeEBPFPods is the BPF dataplane translating only the node's own
// sockets (--socket-lb-scope=node): its pods' packets are translated at
// their devices, and masqueraded where kube-proxy masquerades them. Rows
// whose Modes name ModeEBPF alone take their Want here (RunAs).
const ModeEBPFPods = "ebpf-pods"

// Cases is the behaviour table for the example cluster. It is kube-proxy's
// contract, re-expressed with real traffic: which pods a client reaches
// through each frontend, whether the connection is refused or dropped, and
// whether the pod sees the client's address.
func Cases() []Case {
	nodeA, nodeB := example.NodeAIP, example.NodeBIP
	all := []string{"a1", "a2", "b1"}
	return []Case{
		// ClusterIP, policy Cluster.
		{Name: "pod to ClusterIP reaches every endpoint with its own address", From: ClientPodA, To: ap(ip("10.96.0.10"), 80), Want: forward(Preserved, all...)},
		{Name: "pod on the other node to ClusterIP reaches every endpoint", From: ClientPodB, To: ap(ip("10.96.0.10"), 80), Want: forward(Preserved, all...)},
		{Name: "node to ClusterIP reaches every endpoint", From: ClientNodeA, To: ap(ip("10.96.0.10"), 80), Want: forward(AnySource, all...)},
		{Name: "UDP to ClusterIP reaches every endpoint", From: ClientPodA, To: ap(ip("10.96.0.17"), 53), UDP: true, Want: forward(Preserved, "a1", "b1")},
		{Name: "second port of a Service reaches the same endpoints", From: ClientPodA, To: ap(ip("10.96.0.17"), 80), Want: forward(Preserved, "a1", "b1")},
		{Name: "endpoint to its own Service is masqueraded (hairpin)", From: ClientA1, To: ap(ip("10.96.0.18"), 80), Want: forward(Masqueraded, "a1"),
			Modes: map[string]Want{ModeEBPF: forward(Preserved, "a1")}},
		{Name: "ClientIP affinity keeps a client on one endpoint", From: ClientPodA, To: ap(ip("10.96.0.14"), 80), Want: Want{Verdict: model.Forward, Servers: all, Source: Preserved, Sticky: true}},

		// NodePort and ExternalIP, policy Cluster.
		{Name: "external client to NodePort reaches every endpoint, masqueraded", From: ClientExternal, To: ap(nodeA, 30010), Want: forward(Masqueraded, all...)},
		{Name: "external client to NodePort of the other node", From: ClientExternal, To: ap(nodeB, 30010), Want: forward(Masqueraded, all...)},
		{Name: "pod to NodePort reaches every endpoint", From: ClientPodA, To: ap(nodeA, 30010), Want: forward(Masqueraded, all...),
			Modes: map[string]Want{ModeEBPF: forward(Preserved, all...)}},
		{Name: "external client to ExternalIP reaches every endpoint, masqueraded", From: ClientExternal, To: ap(ip("198.19.0.10"), 80), Want: forward(Masqueraded, all...)},

		// externalTrafficPolicy Local.
		{Name: "external client to LB IP (eTP=Local) reaches the local endpoint with its own address", From: ClientExternal, To: ap(ip("198.19.0.11"), 80), Want: forward(Preserved, "a1")},
		{Name: "external client to NodePort (eTP=Local) reaches the local endpoint", From: ClientExternal, To: ap(nodeA, 30011), Want: forward(Preserved, "a1")},
		{Name: "external client to NodePort (eTP=Local) of the other node reaches its endpoint", From: ClientExternal, To: ap(nodeB, 30011), Want: forward(Preserved, "b1")},
		{Name: "pod to LB IP (eTP=Local) is short-circuited to every endpoint", From: ClientPodA, To: ap(ip("198.19.0.11"), 80), Want: forward(Preserved, "a1", "b1"),
			Modes: map[string]Want{ModeIPVS: forward(Preserved, "a1")}},
		{Name: "node to LB IP (eTP=Local) is short-circuited to every endpoint", From: ClientNodeA, To: ap(ip("198.19.0.11"), 80), Want: forward(AnySource, "a1", "b1"),
			Modes: map[string]Want{ModeIPVS: forward(AnySource, "a1")}},
		{Name: "external client to LB IP (eTP=Local) without local endpoint is dropped", From: ClientExternal, To: ap(ip("198.19.0.12"), 80), Want: dropped},
		{Name: "external client to NodePort (eTP=Local) without local endpoint is dropped", From: ClientExternal, To: ap(nodeA, 30012), Want: dropped},
		{Name: "pod to LB IP (eTP=Local) without local endpoint is short-circuited", From: ClientPodA, To: ap(ip("198.19.0.12"), 80), Want: forward(Preserved, "b1"),
			Modes: map[string]Want{ModeIPVS: dropped}},
		{Name: "node to LB IP (eTP=Local) without local endpoint is short-circuited", From: ClientNodeA, To: ap(ip("198.19.0.12"), 80), Want: forward(AnySource, "b1"),
			Modes: map[string]Want{ModeIPVS: dropped}},

		// loadBalancerSourceRanges.
		{Name: "client inside the source ranges reaches the LB IP", From: ClientExternal, To: ap(ip("198.19.0.13"), 80), Want: forward(Masqueraded, "a2")},
		{Name: "client outside the source ranges is dropped at the LB IP", From: ClientBlocked, To: ap(ip("198.19.0.13"), 80), Want: dropped},
		{Name: "NodePort bypasses the source ranges", From: ClientBlocked, To: ap(nodeA, 30013), Want: forward(Masqueraded, "a2")},
		{Name: "pod outside the source ranges is dropped at the LB IP", From: ClientPodA, To: ap(ip("198.19.0.13"), 80), Want: dropped},

		// internalTrafficPolicy Local.
		{Name: "ClusterIP (iTP=Local) without local endpoint is dropped", From: ClientPodA, To: ap(ip("10.96.0.15"), 80), Want: dropped},
		{Name: "ClusterIP (iTP=Local) reaches the local endpoint on its node", From: ClientPodB, To: ap(ip("10.96.0.15"), 80), Want: forward(Preserved, "b1")},

		// No endpoints.
		{Name: "ClusterIP without endpoints is refused", From: ClientPodA, To: ap(ip("10.96.0.16"), 80), Want: rejected},
		{Name: "node to ClusterIP without endpoints is refused", From: ClientNodeA, To: ap(ip("10.96.0.16"), 80), Want: rejected},
		{Name: "NodePort without endpoints is refused", From: ClientExternal, To: ap(nodeA, 30016), Want: rejected},
		{Name: "ExternalIP without endpoints is refused", From: ClientExternal, To: ap(ip("198.19.0.16"), 80), Want: rejected},
	}
}

// Run checks every row of cases against the environment's dataplanes.
// Rows run in parallel: each is a handful of subprocesses.
func Run(t *testing.T, e *Env, cases []Case) {
	t.Helper()
	RunAs(t, e, cases, e.Dataplanes[example.NodeA].Name())
}

// RunAs is Run with the rows' Want for mode, whatever the dataplanes'
// names.
func RunAs(t *testing.T, e *Env, cases []Case, mode string) {
	t.Helper()
	t.Run(mode, func(t *testing.T) {
		for _, tc := range cases {
			want := tc.Want
			if w, ok := tc.Modes[mode]; ok {
				want = w
			}
			t.Run(tc.Name, func(t *testing.T) {
				t.Parallel()
				e.Check(t, tc, want)
			})
		}
	})
}

// Check runs one row; in an IPv6 Env against the IPv6 twin of its
// destination, expecting the client's IPv6 address where it is kept.
func (e *Env) Check(t *testing.T, tc Case, want Want) {
	t.Helper()
	client := e.Clients[tc.From]
	if client == nil {
		t.Fatalf("no client %q", tc.From)
	}
	to := tc.To
	if e.IPv6 {
		if to = netip.AddrPortFrom(sandbox.IPv6Of(to.Addr()), to.Port()); !to.Addr().IsValid() {
			t.Fatalf("%s has no IPv6 twin in the address plan", tc.To.Addr())
		}
		tc.To = to
	}
	ctx := Context(t)
	attempts := 2
	switch {
	case want.Sticky:
		attempts = 10
	case want.Verdict == model.Forward:
		// Enough that every endpoint answers at least once with
		// probability above 1-1e-6 under random selection.
		attempts = 12 * len(want.Servers)
	}
	if want.Verdict == model.Drop {
		// A drop shows as a timeout; a short one keeps the table quick.
		client = client.WithTimeout(time.Second)
	}
	var answers []answer
	if tc.UDP {
		rep, err := client.UDP(ctx, tc.To, attempts)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			answers = append(answers, answer{server: r.Server, seen: r.ClientSeen, err: r.Err})
		}
	} else {
		rep, err := client.TCP(ctx, tc.To, attempts)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			answers = append(answers, answer{server: r.Server, seen: r.ClientSeen, err: r.Err})
		}
	}
	clientIP := client.IP
	if e.IPv6 {
		clientIP = client.IP6
	}
	checkAnswers(t, clientIP, tc, want, answers)
}

type answer struct {
	server string
	seen   netip.AddrPort
	err    string
}

func checkAnswers(t *testing.T, clientIP netip.Addr, tc Case, want Want, answers []answer) {
	t.Helper()
	switch want.Verdict {
	case model.Reject, model.Drop:
		wantErr := "ECONNREFUSED"
		if want.Verdict == model.Drop {
			wantErr = "ETIMEDOUT"
		}
		for _, a := range answers {
			if a.err != wantErr {
				t.Errorf("%s -> %s: got %s, want %s (%s)", tc.From, tc.To, describe(a), wantErr, want.Verdict)
			}
		}
		return
	}
	seen := map[string]int{}
	for _, a := range answers {
		if a.err != "" || !slices.Contains(want.Servers, a.server) {
			t.Errorf("%s -> %s: got %s, want an answer from one of %v", tc.From, tc.To, describe(a), want.Servers)
			continue
		}
		seen[a.server]++
		switch want.Source {
		case Preserved:
			if a.seen.Addr() != clientIP {
				t.Errorf("%s -> %s: %s saw client address %s, want the client's own %s", tc.From, tc.To, a.server, a.seen.Addr(), clientIP)
			}
		case Masqueraded:
			if a.seen.Addr() == clientIP {
				t.Errorf("%s -> %s: %s saw the client's own address %s, want it masqueraded", tc.From, tc.To, a.server, clientIP)
			}
		}
	}
	if want.Sticky {
		if len(seen) != 1 {
			t.Errorf("%s -> %s: with ClientIP affinity, connections reached %v, want a single endpoint", tc.From, tc.To, seen)
		}
		return
	}
	for _, s := range want.Servers {
		if seen[s] == 0 {
			t.Errorf("%s -> %s: %s never answered in %d attempts (answers: %v)", tc.From, tc.To, s, len(answers), counts(seen))
		}
	}
}

func describe(a answer) string {
	if a.err != "" {
		return a.err
	}
	return fmt.Sprintf("an answer from %s (saw %s)", a.server, a.seen)
}

func counts(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
