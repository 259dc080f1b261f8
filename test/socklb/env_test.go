package socklb_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

func TestMain(m *testing.M) { agent.Main(m) }

const nodeName = "node-a"

// env is one node with pods running servers, a client pod, and the BPF
// dataplane's socket programs attached to the sandbox's cgroup (bpf.New
// without TC), driven through the same translation, tracker and
// dataplane as the agent.
type env struct {
	t      testing.TB
	sb     *sandbox.Sandbox
	node   *sandbox.Node
	pods   []*sandbox.Pod
	client *sandbox.Client
	d      *bpf.Dataplane
	// loaded are d's programs and maps, for the tests that run the
	// programs or read their counters.
	loaded *loader.Loaded
	bpffs  string
	tr     *tracker.Tracker
	tl     k8swatch.Translator
	synced bool
}

// Ports every pod serves.
const (
	tcpPort = 8080
	udpPort = 5353
)

// newEnv builds the sandbox and attaches the programs in-process.
func newEnv(t testing.TB, pods int) *env {
	t.Helper()
	e := newSandbox(t, pods)
	e.attach()
	return e
}

// newSandbox builds the node, its pods and the client, attaching nothing.
func newSandbox(t testing.TB, pods int) *env {
	t.Helper()
	sb := sandbox.ForTest(t)
	e := &env{t: t, sb: sb}
	var err error
	if e.node, err = sb.AddNode(nodeName); err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		p, err := sb.AddServingPod(e.node, fmt.Sprintf("pod-%d", i), netip.Addr{}, tcpPort, udpPort)
		if err != nil {
			t.Fatal(err)
		}
		e.pods = append(e.pods, p)
	}
	if e.client, err = sb.AddClient(e.node, "client", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	e.bpffs = filepath.Join(sb.BPFFS.Path(), "ebpf-proxy")
	return e
}

// attach starts the BPF dataplane as the agent does, in the node's
// namespace (whose cookie the programs know as the node's), with its
// socket programs alone: no device of the sandbox gets TC programs.
func (e *env) attach() {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	err := e.node.NS.Do(func() (err error) {
		e.d, err = bpf.New(ctx, bpf.Config{CgroupPath: e.sb.Cgroup.Path(), BPFFSPath: e.bpffs, NoTC: true,
			Metrics: metrics.New(metrics.IPv4)})
		return err
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		e.d.Close()
		if err := loader.Cleanup(e.bpffs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	e.loaded = e.d.Loaded()
	e.tr = tracker.New(nodeName, model.DefaultOptions, everyAddress)
	e.tr.SetServicesSynced()
	e.tr.SetEndpointSlicesSynced()
	e.tl.Invalid = func(kind, ns, name, reason string) { t.Errorf("invalid %s %s/%s: %s", kind, ns, name, reason) }
}

// sync programs everything recorded so far through the dataplane, which
// attaches the source range check around it.
func (e *env) sync() {
	e.t.Helper()
	e.syncFamily("sync", e.tr, e.d, &e.synced)
}

// syncFamily hands d, the dataplane of a family, what tr has recorded
// since the last call (all of it while *synced is false, which it then
// sets), as the agent's sync loop does. what starts the message of a
// failed sync ("sync", "sync IPv6").
func (e *env) syncFamily(what string, tr *tracker.Tracker, d dataplane.Dataplane, synced *bool) {
	e.t.Helper()
	up := tr.Apply()
	up.Full = up.Full || !*synced
	if err := d.Sync(up); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	*synced = true
}

// setNodeAddrs gives the node addrs, which are all its addresses: each
// gets NodePorts (a loopback one for the node's own sockets), as with the
// agent's defaults.
func (e *env) setNodeAddrs(addrs ...netip.Addr) {
	e.tr.UpdateNode(model.Node{Name: nodeName, Addrs: addrs})
	e.tr.SetLocalAddrs(addrs)
}

// everyAddress is --nodeport-addresses unset, with
// --iptables-localhost-nodeports (the agent's defaults).
var everyAddress, _ = model.ParseNodePortSpec(nil, false, true)

func (e *env) setService(svc *v1.Service) {
	e.tr.UpdateService(k8swatch.ServiceName(svc), e.tl.ServicePorts(svc))
}

func (e *env) setSlice(es *discoveryv1.EndpointSlice) {
	e.tr.UpdateEndpointSlice(e.tl.EndpointSlice(es))
}

func (e *env) deleteSlice(es *discoveryv1.EndpointSlice) {
	svc, _ := k8swatch.EndpointSliceService(es)
	e.tr.DeleteEndpointSlice(svc, es.Name)
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	e.t.Cleanup(cancel)
	return ctx
}

// makeService builds a ClusterIP Service in "default" of one port "p".
func makeService(name, clusterIP string, port int32, proto v1.Protocol, target intstr.IntOrString, opts ...builders.ServiceOption) *v1.Service {
	base := []builders.ServiceOption{builders.ClusterIP(clusterIP), builders.Ports(builders.Port("p", port, proto, target))}
	return builders.Service("default", name, append(base, opts...)...)
}

type epState int

const (
	ready epState = iota
	terminating
	notReady
)

// states maps endpoint states to the builders' options (ready is theirs).
var states = map[epState]builders.EndpointOption{terminating: builders.Terminating, notReady: builders.NotReady}

type ep struct {
	ip    netip.Addr
	state epState
}

// makeSlice builds the EndpointSlice of a Service with one port named "p".
func makeSlice(svc, name string, port int32, proto v1.Protocol, eps ...ep) *discoveryv1.EndpointSlice {
	var out []discoveryv1.Endpoint
	for _, e := range eps {
		out = append(out, builders.Endpoint(e.ip.String(), nodeName, states[e.state]))
	}
	return builders.EndpointSlice("default", name, svc, out, builders.SlicePorts(builders.SlicePort("p", port, proto)))
}

func (e *env) podEPs(idx ...int) []ep {
	var out []ep
	for _, i := range idx {
		out = append(out, ep{ip: e.pods[i].IP})
	}
	return out
}

// counters reads the programs' event counters by name.
func (e *env) counters() map[string]uint64 {
	e.t.Helper()
	c, err := e.loaded.Counters()
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]uint64{}
	for i, v := range c {
		out[loader.CounterNames[i]] = v
	}
	return out
}

// expectUDPReplies sends n datagrams from the client pod to vip, each from an
// unconnected socket of its own, and checks that every one is answered from
// vip itself (what names it in failures: "the ClusterIP", "the mapped
// ClusterIP"), reaches its pod from clientIP unless that is the zero Addr,
// and that the answers came from exactly backends pods.
func (e *env) expectUDPReplies(t testing.TB, vip netip.AddrPort, what string, clientIP netip.Addr, n, backends int) {
	t.Helper()
	rep, err := e.client.UDP(e.ctx(), vip, n)
	if err != nil {
		t.Fatal(err)
	}
	servers := map[string]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Fatalf("no reply from %s: %+v", vip, r)
		}
		if r.From != vip {
			t.Errorf("reply came from %s, want %s %s", r.From, what, vip)
		}
		if clientIP.IsValid() && r.ClientSeen.Addr() != clientIP {
			t.Errorf("server saw client %s, want %s", r.ClientSeen, clientIP)
		}
		servers[r.Server]++
	}
	if len(servers) != backends {
		t.Errorf("datagrams to %s reached %v, want %d backends", vip, servers, backends)
	}
}

// expectUDPConnectedReplies sends n datagrams from the client pod to vip
// through connected sockets and checks that every one is answered, and that
// both the socket's peer and the reply's source are vip itself (what names
// it in failures, as for expectUDPReplies).
func (e *env) expectUDPConnectedReplies(t testing.TB, vip netip.AddrPort, what string, n int) {
	t.Helper()
	rep, err := e.client.UDPConnected(e.ctx(), vip, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Fatalf("no reply from %s: %+v", vip, r)
		}
		if r.Peer != vip || r.From != vip {
			t.Errorf("getpeername() = %s, reply from %s; want %s %s for both", r.Peer, r.From, what, vip)
		}
	}
}

// udpOneSocketServers sends n datagrams to vip from one unconnected socket of
// the client pod and returns how many each pod answered; every datagram must
// be answered from vip itself.
func (e *env) udpOneSocketServers(t testing.TB, vip netip.AddrPort, n int) map[string]int {
	t.Helper()
	rep, err := e.client.UDPOneSocket(e.ctx(), vip, n)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range rep.Results {
		if r.Err != "" || r.From != vip {
			t.Fatalf("datagram: %+v, want a reply from %s", r, vip)
		}
		got[r.Server]++
	}
	return got
}

// expectUDPFromTheClusterIP runs the subtests of the UDP ClusterIP tests of
// both families: 40 unconnected datagrams from the client pod to vip are
// answered from vip by exactly backends pods, which see the client as
// clientIP unless that is the zero Addr, and 10 datagrams of connected
// sockets are answered from vip, their sockets' peer.
func (e *env) expectUDPFromTheClusterIP(t *testing.T, vip netip.AddrPort, clientIP netip.Addr, backends int) {
	t.Helper()
	t.Run("unconnected sendto", func(t *testing.T) {
		e.expectUDPReplies(t, vip, "the ClusterIP", clientIP, 40, backends)
	})
	t.Run("connected send", func(t *testing.T) {
		e.expectUDPConnectedReplies(t, vip, "the ClusterIP", 10)
	})
}

// expectTCPRefused connects n times from the client pod to addr and checks
// that every connect() is refused (ECONNREFUSED comes from connect() itself:
// a timeout would be reported as ETIMEDOUT after the probe's 2s); what says
// what addr is in failures.
func (e *env) expectTCPRefused(t testing.TB, addr netip.AddrPort, n int, what string) {
	t.Helper()
	rep, err := e.client.TCP(e.ctx(), addr, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Err != "ECONNREFUSED" {
			t.Errorf("connect to %s (%s): %+v, want ECONNREFUSED", addr, what, r)
		}
		t.Logf("refused after %v", r.Elapsed)
	}
}

// tcpServers connects n times from c to addr and returns which pods
// answered; every connection must succeed, show addr as its peer and reach
// the pod with clientIP as its source (any source when clientIP is the zero
// Addr: the node's sockets take the address of the route to the pod).
func (e *env) tcpServers(t testing.TB, c *sandbox.Client, addr netip.AddrPort, clientIP netip.Addr, n int) map[string]int {
	t.Helper()
	rep, err := c.TCP(e.ctx(), addr, n)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Fatalf("connection to %s from %s failed: %+v", addr, c.Name, r)
		}
		if r.Peer != addr {
			t.Errorf("getpeername() = %s, want the frontend %s", r.Peer, addr)
		}
		if clientIP.IsValid() && r.ClientSeen.Addr() != clientIP {
			t.Errorf("server saw client %s, want %s", r.ClientSeen, clientIP)
		}
		got[r.Server]++
	}
	return got
}

// followEndpointChanges runs the steps of the endpoint change tests of
// either family on the Service at vip, whose pods have the addresses ip
// gives: for each, set programs the endpoints the change leaves, and 60 new
// connections of the client pod (seen by the pods as clientIP) must reach
// exactly the pods the step wants (ready ones first, serving-terminating
// ones when none is ready, never not-ready ones) while the connection hold
// opened before keeps working.
func (e *env) followEndpointChanges(t *testing.T, vip netip.AddrPort, clientIP netip.Addr, hold *held, ip func(i int) netip.Addr, set func(eps []ep)) {
	t.Helper()
	eps := func(idx ...int) []ep {
		var out []ep
		for _, i := range idx {
			out = append(out, ep{ip: ip(i)})
		}
		return out
	}
	steps := []struct {
		name string
		eps  []ep
		want []string
	}{
		{"endpoint added", eps(0, 1, 2), e.podNames(0, 1, 2)},
		{"endpoint removed", eps(1, 2), e.podNames(1, 2)},
		{"one turns terminating: ready ones only", []ep{{ip(1), terminating}, {ip(2), ready}}, e.podNames(2)},
		{"not-ready endpoints are never used", []ep{{ip(0), notReady}, {ip(1), terminating}, {ip(2), ready}}, e.podNames(2)},
		{"all terminating: serving-terminating fallback", []ep{{ip(1), terminating}, {ip(2), terminating}}, e.podNames(1, 2)},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			set(step.eps)
			got := e.tcpServers(t, e.client, vip, clientIP, 60)
			var names []string
			for n := range got {
				names = append(names, n)
			}
			slices.Sort(names)
			if !slices.Equal(names, step.want) {
				t.Errorf("60 new connections to %s reached %v, want exactly %v", vip, names, step.want)
			}
			hold.check(t)
		})
	}
}

// expectEvenSpread checks that n connections, of which perPod says how many
// each pod took, reached exactly the three pods named and each about a
// third: 100 +- 40 of 300 is five standard deviations, so a fair random
// choice fails this about once in 10^6.
func expectEvenSpread(t testing.TB, perPod map[string]int, n int, names []string) {
	t.Helper()
	for _, name := range names {
		if c := perPod[name]; c < n/5 || c > n*7/15 {
			t.Errorf("%s got %d of %d connections, want about %d: %v", name, c, n, n/3, perPod)
		}
	}
	if len(perPod) != 3 {
		t.Errorf("connections reached %v, want exactly the three backends", perPod)
	}
}
