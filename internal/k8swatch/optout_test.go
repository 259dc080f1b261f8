package k8swatch

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

func optOutTestPod(ns, name, node, setting string, ips ...string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "x"}},
		Spec:       v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "c", Image: "i"}}},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
	if setting != "" {
		p.Annotations = map[string]string{SocketLBAnnotation: setting, "other": "x"}
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, v1.PodIP{IP: ip})
	}
	return p
}

func optOutTestNamespace(name, setting string) *v1.Namespace {
	n := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if setting != "" {
		n.Annotations = map[string]string{SocketLBAnnotation: setting}
	}
	return n
}

func ipList(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// Which pods of the node opt out: by their own annotation, else their
// namespace's; never a pod of another node, a host-network pod, a
// finished one or one without an address.
func TestOptedOutAddrs(t *testing.T) {
	pods := map[objectID]optOutPod{}
	add := func(p *v1.Pod) {
		if op, ok := podForOptOut(p, "node-a"); ok {
			pods[objectID{p.Namespace, p.Name}] = op
		}
	}
	add(optOutTestPod("mesh", "inherits", "node-a", "", "10.244.1.5", "fd00::5"))
	add(optOutTestPod("mesh", "keeps", "node-a", SocketLBEnabled, "10.244.1.6"))
	add(optOutTestPod("default", "own", "node-a", SocketLBDisabled, "10.244.1.7"))
	add(optOutTestPod("default", "plain", "node-a", "", "10.244.1.8"))
	add(optOutTestPod("default", "typo", "node-a", "off", "10.244.1.9"))
	add(optOutTestPod("mesh", "typo-in-mesh", "node-a", "off", "10.244.1.10"))
	add(optOutTestPod("default", "elsewhere", "node-b", SocketLBDisabled, "10.244.2.7"))
	add(optOutTestPod("default", "no-ip", "node-a", SocketLBDisabled))
	host := optOutTestPod("default", "host", "node-a", SocketLBDisabled, "192.168.1.10")
	host.Spec.HostNetwork = true
	add(host)
	done := optOutTestPod("default", "done", "node-a", SocketLBDisabled, "10.244.1.11")
	done.Status.Phase = v1.PodSucceeded
	add(done)
	got := optedOutAddrs(pods, map[string]string{"mesh": SocketLBDisabled, "default": SocketLBEnabled})
	want := ipList("10.244.1.5", "10.244.1.7", "10.244.1.10", "fd00::5")
	if !slices.Equal(got, want) {
		t.Errorf("opted out %v, want %v", got, want)
	}
	if got := optedOutAddrs(pods, nil); !slices.Equal(got, ipList("10.244.1.7")) {
		t.Errorf("without namespace annotations: %v, want only the pod annotated itself", got)
	}
}

func TestStripForOptOutKeepsWhatItReads(t *testing.T) {
	p := optOutTestPod("mesh", "a", "node-a", SocketLBDisabled, "10.244.1.5")
	p.Spec.HostNetwork = true
	p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady}}
	for range 2 { // idempotent
		if _, err := stripForOptOut(p); err != nil {
			t.Fatal(err)
		}
	}
	if len(p.Labels) != 0 || len(p.Annotations) != 1 || p.Annotations[SocketLBAnnotation] != SocketLBDisabled ||
		len(p.Spec.Containers) != 0 || !p.Spec.HostNetwork || p.Spec.NodeName != "node-a" ||
		len(p.Status.Conditions) != 0 || p.Status.Phase != v1.PodRunning || len(p.Status.PodIPs) != 1 {
		t.Errorf("stripped pod %+v", p)
	}
}

// WatchOptOut tells the set once listed, then at each change, and says
// which annotation values it does not know.
func TestWatchOptOutFollowsThePodsAndNamespaces(t *testing.T) {
	c := fake.NewClientset(
		optOutTestNamespace("mesh", SocketLBDisabled),
		optOutTestPod("mesh", "a", "node-a", "", "10.244.1.5"),
		optOutTestPod("default", "b", "node-a", "", "10.244.1.6"),
	)
	var mu sync.Mutex
	var sets [][]netip.Addr
	var invalid []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- WatchOptOut(ctx, fakeSource{c}, "node-a", func(a []netip.Addr) {
			mu.Lock()
			sets = append(sets, a)
			mu.Unlock()
		}, OptOutOptions{Invalid: func(kind, ns, name, reason string) {
			mu.Lock()
			invalid = append(invalid, kind+" "+ns+"/"+name)
			mu.Unlock()
		}})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor := func(want []netip.Addr) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			last := []netip.Addr{{}}
			if len(sets) > 0 {
				last = sets[len(sets)-1]
			}
			mu.Unlock()
			if slices.Equal(last, want) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("sets told %v, want the last %v", sets, want)
	}
	waitFor(ipList("10.244.1.5"))
	pods := c.CoreV1().Pods("default")
	b := optOutTestPod("default", "b", "node-a", SocketLBDisabled, "10.244.1.6")
	if _, err := pods.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ipList("10.244.1.5", "10.244.1.6"))
	if _, err := c.CoreV1().Namespaces().Update(ctx, optOutTestNamespace("mesh", "off"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ipList("10.244.1.6"))
	if err := pods.Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(nil)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(invalid, []string{"Namespace /mesh"}) {
		t.Errorf("invalid %v, want the namespace's unknown value", invalid)
	}
	for i := 1; i < len(sets); i++ {
		if slices.Equal(sets[i], sets[i-1]) {
			t.Errorf("set told the same addresses twice in a row: %v", sets)
		}
	}
}

// The manifests source reads the opt-out from the directory's Pods and
// Namespaces, and says when it changes.
func TestManifestsReadTheOptOut(t *testing.T) {
	dir := t.TempDir()
	var told [][]netip.Addr
	m := mustManifests(t, dir, tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{}), ManifestOptions{
		OptedOut: func(a []netip.Addr) { told = append(told, a) },
	})
	writeFiles(t, dir, map[string]string{
		"ns.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: mesh\n  annotations:\n    ebpf-proxy.io/socket-lb: disabled\n",
		"pods.yaml": "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  namespace: mesh\nspec:\n  nodeName: node-a\n  containers: [{name: c, image: i}]\nstatus:\n  phase: Running\n  podIPs: [{ip: 10.244.1.5}]\n" +
			"---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: b\nspec:\n  nodeName: node-a\n  containers: [{name: c, image: i}]\nstatus:\n  phase: Running\n  podIPs: [{ip: 10.244.1.6}]\n",
	})
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{"ns.yaml": ""})
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	if want := [][]netip.Addr{ipList("10.244.1.5"), nil}; !reflect.DeepEqual(told, want) {
		t.Errorf("told %v, want %v", told, want)
	}
}

// An identity that may not list pods is said so once, and WatchOptOut
// returns without watching.
func TestWatchOptOutSaysWhenForbidden(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("list", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no"))
	})
	var forbidden []string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := WatchOptOut(ctx, fakeSource{c}, "node-a", func([]netip.Addr) { t.Error("set called") },
		OptOutOptions{Forbidden: func(resource string, err error) { forbidden = append(forbidden, resource) }})
	if err != nil || ctx.Err() != nil {
		t.Fatalf("WatchOptOut: %v (context %v); want it to return at once", err, ctx.Err())
	}
	if !slices.Equal(forbidden, []string{ResourcePods}) {
		t.Errorf("forbidden %v, want pods once", forbidden)
	}
}
