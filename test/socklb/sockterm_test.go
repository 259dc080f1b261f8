package socklb_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

const dnsManifest = `apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: UDP, targetPort: 5353}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: default
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
ports: [{name: dns, port: 5353, protocol: UDP}]
endpoints:
%s`

func writeDNSManifest(t *testing.T, dir string, pods ...*sandbox.Pod) {
	t.Helper()
	var eps strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&eps, "  - {addresses: [%s], conditions: {ready: true}, nodeName: %s}\n", p.IP, nodeName)
	}
	tmp := filepath.Join(dir, ".dns.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf(dnsManifest, eps.String())), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "dns.yaml")); err != nil {
		t.Fatal(err)
	}
}

// TestRemovedBackendsSocketsAreEnded: when a backend is removed, a TCP
// connection made to it through a Service is aborted rather than left to
// hang, and a long-lived connected UDP client (a resolver) is moved off it
// and answered by a live backend; connections to the remaining backend are
// left alone.
func TestRemovedBackendsSocketsAreEnded(t *testing.T) {
	e := newSandbox(t, 2)
	dir := t.TempDir()
	writeManifests(t, dir, e.pods[0], e.pods[1])
	writeDNSManifest(t, dir, e.pods[0], e.pods[1])
	e.startAgent(t, dir)

	// Hold TCP connections until one lands on each pod.
	held := map[string]*sandbox.Held{}
	for i := 0; len(held) < 2 && i < 50; i++ {
		h, err := e.client.Hold(e.ctx(), webVIP)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		if _, dup := held[h.First.Server]; h.First.Err == "" && !dup {
			held[h.First.Server] = h
		} else {
			h.Close()
		}
	}
	if len(held) != 2 {
		t.Fatalf("could not hold a connection to each pod: %v", held)
	}
	stream, err := e.client.StartUDPStream(e.ctx(), []netip.AddrPort{dnsVIP}, sandbox.UDPStreamOptions{Interval: 50 * time.Millisecond, MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Stop() })
	if stream.First.Err != "" {
		t.Fatalf("first query: %+v", stream.First)
	}
	victim := stream.First.Server
	var survivor *sandbox.Pod
	for _, p := range e.pods {
		if p.Name != victim {
			survivor = p
		}
	}

	// Remove the pod the resolver uses from both Services.
	writeManifests(t, dir, survivor)
	writeDNSManifest(t, dir, survivor)
	removed := time.Now()

	deadline := time.Now().Add(15 * time.Second)
	for {
		err := held[victim].Ping()
		if err != nil {
			if !strings.Contains(err.Error(), "ECONNABORTED") && !strings.Contains(err.Error(), "ECONNRESET") {
				t.Errorf("connection to the removed backend failed with %v, want it aborted", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the TCP connection to the removed backend was not ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := held[survivor.Name].Ping(); err != nil {
		t.Errorf("connection to the remaining backend broke: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		q, err := stream.Next(ctx)
		if err != nil {
			t.Fatalf("the resolver never reached a live backend: %v", err)
		}
		if q.Server == survivor.Name && q.Sent.After(removed) {
			t.Logf("first answer from %s for a query sent %v after the removal (retries %v)", q.Server, q.Sent.Sub(removed), q.Retries)
			break
		}
	}
}
