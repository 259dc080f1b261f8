package tclb_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestAgentTranslatesOptedOutPodsPerPacket: under --socket-lb-scope=all (the
// default), a pod of a namespace annotated ebpf-proxy.io/socket-lb=disabled
// is left alone by the socket hooks and translated per packet at its
// device: its sidecar sees the ClusterIP, its connection reaches the
// backend, it reaches itself through its Service. A pod of another
// namespace on the same node keeps the socket hooks (its sidecar is told
// the backend, the known limit). Once the annotation goes, the opted-out
// pod's sockets are translated at connect() again.
func TestAgentTranslatesOptedOutPodsPerPacket(t *testing.T) {
	e := newTopology(t)
	a := e.nodes[0]
	podA := e.pods["pod-a"]
	podC, err := e.sb.AddServingPod(a.Node, "pod-c", netip.Addr{}, tcpPort, udpPort)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e.writeAgentManifests(t, dir)
	writePods := func(meshed bool) {
		t.Helper()
		mesh := &v1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: "mesh"}}
		if meshed {
			mesh.Annotations = map[string]string{k8swatch.SocketLBAnnotation: k8swatch.SocketLBDisabled}
		}
		objs := []runtime.Object{mesh, podObject("mesh", podA), podObject("default", podC)}
		if err := builders.WriteManifest(dir, "pods.yaml", objs...); err != nil {
			t.Fatal(err)
		}
	}
	writePods(true)
	cg, err := e.sb.AddCgroup("agent")
	if err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(e.sb.BPFFS.Path(), "agent")
	t.Cleanup(func() { agent.Cleanup(context.Background(), a.NS.Path(), bpffs) })
	proc := e.startAgent(t, dir, bpffs, cg)
	if err := proc.WaitLog(time.Minute, []string{`pods opted out of the socket hooks`, `"devices":["` + podA.HostVeth + `"]`}); err != nil {
		t.Fatalf("agent did not opt pod-a out through its device %s: %v\n%s", podA.HostVeth, err, proc.Logs())
	}
	proxyA, err := podA.StartRedirectProxy(meshPort, meshMark)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxyA.Close() })
	proxyC, err := podC.StartRedirectProxy(meshPort, meshMark)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxyC.Close() })

	remote := netip.MustParseAddrPort("10.96.0.80:80")
	own := netip.MustParseAddrPort("10.96.0.81:80")
	backend := netip.AddrPortFrom(e.pods["pod-b"].IP, tcpPort)
	e.expectAnswers(e.sb.ClientAt(podA.Host).InCgroup(cg), remote, "pod-b", podA.IP)
	expectTold(t, proxyA, 0, remote)
	e.expectAnswers(e.sb.ClientAt(podC.Host).InCgroup(cg), remote, "pod-b", podC.IP)
	expectTold(t, proxyC, 0, backend)
	e.expectAnswers(e.sb.ClientAt(podA.Host).InCgroup(cg), own, "pod-a", a.Gateway)

	// The namespace opts back in: pod-a's sockets are translated again.
	writePods(false)
	if err := proc.WaitLog(time.Minute, []string{`pods opted out of the socket hooks`, `"removed":1`}); err != nil {
		t.Fatalf("agent did not opt pod-a back in: %v\n%s", err, proc.Logs())
	}
	since := len(proxyA.Originals())
	e.expectAnswers(e.sb.ClientAt(podA.Host).InCgroup(cg), remote, "pod-b", podA.IP)
	expectTold(t, proxyA, since, backend)
	if logs := proc.Logs(); strings.Contains(logs, `"msg":"pods opted out of the socket hooks","node":"node-a","error"`) {
		t.Errorf("the agent could not opt every pod out:\n%s", logs)
	}
	proc.Terminate(t, 15*time.Second)
}

// podObject is the Pod of the sandbox's pod p on node-a, in namespace ns,
// running with p's addresses.
func podObject(ns string, p *sandbox.Pod) *v1.Pod {
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name},
		Spec:       v1.PodSpec{NodeName: "node-a", Containers: []v1.Container{{Name: "app", Image: "app"}}},
		Status:     v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: p.IP.String()}, {IP: p.IP6.String()}}},
	}
}
