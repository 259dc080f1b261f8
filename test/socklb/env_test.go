package socklb_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

func TestMain(m *testing.M) { agent.Main(m) }

const nodeName = "node-a"

// env is one node with pods running servers, a client pod, and the socket
// programs attached to the sandbox's cgroup, driven through the same
// translation, tracker and writer as the agent.
type env struct {
	t      testing.TB
	sb     *sandbox.Sandbox
	node   *sandbox.Node
	pods   []*sandbox.Pod
	client *sandbox.Client
	loaded *loader.Loaded
	bpffs  string
	tr     *tracker.Tracker
	w      *maps.Writer
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

func (e *env) attach() {
	t := e.t
	t.Helper()
	var err error
	var nodeNetns uint64
	if err := e.node.NS.Do(func() (err error) { nodeNetns, err = loader.NetnsCookie(); return err }); err != nil {
		t.Fatal(err)
	}
	e.loaded, err = loader.Load(loader.Config{BPFFSPath: e.bpffs, CgroupPath: e.sb.Cgroup.Path(), NodeNetnsCookie: nodeNetns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.loaded.Close()
		if err := loader.Cleanup(e.bpffs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	e.w, err = maps.NewWriter(maps.KernelMaps(&e.loaded.Objects.SockMaps), maps.Limits{Backends: e.loaded.Sizes.Backends, RevNat: e.loaded.Sizes.RevNat})
	if err != nil {
		t.Fatal(err)
	}
	e.tr = tracker.New(nodeName, model.DefaultOptions, everyAddress)
	e.tr.SetServicesSynced()
	e.tr.SetEndpointSlicesSynced()
	e.tl.Invalid = func(kind, ns, name, reason string) { t.Errorf("invalid %s %s/%s: %s", kind, ns, name, reason) }
}

// sync programs everything recorded so far, attaching the source range
// check around it as the agent does.
func (e *env) sync() {
	e.t.Helper()
	up := e.tr.Apply()
	up.Full = up.Full || !e.synced
	if maps.WantsSourceRangeCheck(up) {
		if err := e.loaded.SetSourceRangeCheck(true); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.w.Sync(up); err != nil {
		e.t.Fatalf("sync: %v", err)
	}
	if !e.w.HasSourceRanges() {
		if err := e.loaded.SetSourceRangeCheck(false); err != nil {
			e.t.Fatal(err)
		}
	}
	e.synced = true
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
