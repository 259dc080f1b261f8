package socklb_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// writeDNSManifest writes dns, a UDP Service with the pods as its
// endpoints.
func writeDNSManifest(t *testing.T, dir string, pods ...*sandbox.Pod) {
	t.Helper()
	dns := builders.Service("default", "dns", builders.ClusterIP("10.96.0.53"),
		builders.Ports(builders.Port("dns", 53, v1.ProtocolUDP, intstr.FromInt32(5353))))
	if err := builders.WriteManifest(dir, "dns.yaml", dns, builders.SliceFor(dns, podEndpoints(pods)...)); err != nil {
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
