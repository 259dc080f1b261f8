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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
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
		p, err := sb.AddPod(e.node, fmt.Sprintf("pod-%d", i), netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.StartTCPServer(tcpPort); err != nil {
			t.Fatal(err)
		}
		if _, err := p.StartUDPServer(udpPort); err != nil {
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
	e.tr = tracker.New(nodeName, model.DefaultOptions)
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

// makeService builds a ClusterIP Service of one port.
func makeService(name, clusterIP string, port int32, proto v1.Protocol, target intstr.IntOrString, opts ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "p", Port: port, Protocol: proto, TargetPort: target}},
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

type epState int

const (
	ready epState = iota
	terminating
	notReady
)

type ep struct {
	ip    netip.Addr
	state epState
}

// makeSlice builds the EndpointSlice of a Service with one port named "p".
func makeSlice(svc, name string, port int32, proto v1.Protocol, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("p"), Port: ptr(port), Protocol: ptr(proto)}},
	}
	for _, e := range eps {
		c := discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}
		switch e.state {
		case terminating:
			c = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
		case notReady:
			c = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false), Terminating: ptr(false)}
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip.String()}, Conditions: c, NodeName: ptr(nodeName)})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

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
