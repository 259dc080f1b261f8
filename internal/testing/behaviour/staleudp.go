package behaviour

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Bounds of the stale UDP flow tests.
const (
	// staleQueryInterval is the resolver's query rate.
	staleQueryInterval = 50 * time.Millisecond
	// staleWatch is how long after the sync the resolver is watched.
	staleWatch = 3 * time.Second
	// staleAnswersWanted are the answers from the live endpoint that
	// must come, for queries sent after the sync, within staleWatch.
	staleAnswersWanted = 10
)

// StaleUDPFlows runs a resolver (one connected UDP socket that keeps
// sending, kubernetes#125467's kind) from pod-a on node-a through
// ClusterIPs of e's dataplanes, in e's family, as subtests:
//
//   - its endpoint is removed while the pod still answers: every query
//     sent after the sync must be answered by the other endpoint. Where the
//     translation lives in a conntrack entry that nobody deletes, the entry
//     keeps the DNAT to the removed endpoint and the resolver stays with
//     it, which the test reports.
//   - it queries a Service before the Service is programmed, and the
//     datagrams leave the node untranslated into a black hole (the router
//     drops them); once the Service is synced with an endpoint, queries
//     must be answered. An untranslated conntrack entry that nobody
//     deletes lasts as long as the resolver keeps sending, and so does the
//     black hole.
//   - it queries a Service without endpoints (refused), which then gains
//     one: queries must be answered.
//
// It changes e's Sources and syncs: run it on an Env of its own.
func StaleUDPFlows(t *testing.T, e *Env) {
	twin := func(a netip.Addr) netip.Addr {
		if e.IPv6 {
			return sandbox.IPv6Of(a)
		}
		return a
	}
	client := e.Clients[ClientPodA]
	t.Run("endpoint removed", func(t *testing.T) {
		testEndpointRemoved(t, e, client, twin)
	})
	t.Run("blackholed, then programmed", func(t *testing.T) {
		testFirstEndpoint(t, e, client, twin, "blackholed", "10.96.0.19", true)
	})
	t.Run("refused, then an endpoint", func(t *testing.T) {
		testFirstEndpoint(t, e, client, twin, "refused", "10.96.0.20", false)
	})
}

func testEndpointRemoved(t *testing.T, e *Env, client *sandbox.Client, twin func(netip.Addr) netip.Addr) {
	dns := exampleService(t, e, "dns")
	vip := netip.AddrPortFrom(twin(netip.MustParseAddr("10.96.0.17")), 53)
	stream, err := client.StartUDPStream(Context(t), []netip.AddrPort{vip}, sandbox.UDPStreamOptions{Interval: staleQueryInterval, MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Stop() })
	if stream.First.Err != "" {
		t.Fatalf("first query to %s: %+v", vip, stream.First)
	}
	victim := stream.First.Server
	survivor, survivorIP := "b1", twin(example.PodB1)
	if victim == "b1" {
		survivor, survivorIP = "a1", twin(example.PodA1)
	}
	e.Each(func(s *example.Source) { s.SetSlice(example.SliceFor(dns, example.EndpointsOn(survivorIP)...)) })
	e.Sync(false)
	watchAnswers(t, stream, time.Now(), survivor, victim)
}

// testFirstEndpoint: Service name at clusterIP (or its IPv6 twin) queried
// first without being programmed (blackholed: its datagrams are routed off
// the node and dropped by the router) or without endpoints (refused), then
// synced with endpoint a1.
func testFirstEndpoint(t *testing.T, e *Env, client *sandbox.Client, twin func(netip.Addr) netip.Addr, name, clusterIP string, blackholed bool) {
	vip := netip.AddrPortFrom(twin(netip.MustParseAddr(clusterIP)), 53)
	svc := example.Service(name, vip.Addr().String(), example.UDPPort())
	if e.IPv6 {
		svc = example.Service6(name, vip.Addr().String(), example.UDPPort())
	}
	if blackholed {
		bits := 32
		if e.IPv6 {
			bits = 128
		}
		drop := &netlink.Route{Dst: &net.IPNet{IP: vip.Addr().AsSlice(), Mask: net.CIDRMask(bits, bits)}, Type: unix.RTN_BLACKHOLE}
		if err := e.SB.Router.NS.Netlink().RouteAdd(drop); err != nil {
			t.Fatalf("black hole for %s in the router: %v", vip.Addr(), err)
		}
	} else {
		e.Each(func(s *example.Source) { s.SetService(svc) })
		e.Sync(false)
	}
	stream, err := client.StartUDPStream(Context(t), []netip.AddrPort{vip},
		sandbox.UDPStreamOptions{Interval: staleQueryInterval, Timeout: 200 * time.Millisecond, MaxDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Stop() })
	if stream.First.Err == "" {
		t.Fatalf("first query to %s was answered before the Service had an endpoint: %+v", vip, stream.First)
	}
	// A few more unanswered queries on the same flow.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		q, err := stream.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if q.Err == "" {
			t.Fatalf("query to %s was answered before the Service had an endpoint: %+v", vip, q)
		}
	}
	e.Each(func(s *example.Source) {
		s.SetService(svc)
		s.SetSlice(example.SliceFor(svc, example.EndpointsOn(twin(example.PodA1))...))
	})
	e.Sync(false)
	watchAnswers(t, stream, time.Now(), "a1", "")
}

// watchAnswers reads the stream's queries until staleAnswersWanted sent
// after synced were answered by want, failing on any sent after synced
// that was answered by another server (stale, when named) or that is still
// unanswered after staleWatch.
func watchAnswers(t *testing.T, stream *sandbox.UDPStream, synced time.Time, want, stale string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), staleWatch+5*time.Second)
	defer cancel()
	got := 0
	var last sandbox.UDPQuery
	for got < staleAnswersWanted {
		q, err := stream.Next(ctx)
		if err != nil {
			t.Fatalf("%d of %d answers from %s after the sync; last query %+v: %v", got, staleAnswersWanted, want, last, err)
		}
		last = q
		if !q.Sent.After(synced) {
			continue
		}
		switch {
		case q.Err == "" && q.Server == want:
			got++
		case q.Err == "" && stale != "" && q.Server == stale:
			t.Fatalf("query %d, sent %v after the sync, was answered by %s, whose endpoint was removed: the flow stayed pinned", q.Seq, q.Sent.Sub(synced), q.Server)
		case q.Err == "":
			t.Fatalf("query %d answered by %s, want %s", q.Seq, q.Server, want)
		case q.Sent.Sub(synced) > staleWatch:
			t.Fatalf("query %d, sent %v after the sync, failed (%s, retries %v): the flow is still not translated to %s", q.Seq, q.Sent.Sub(synced), q.Err, q.Retries, want)
		}
	}
}

// exampleService returns the example cluster's Service name, of the Env's
// family.
func exampleService(t *testing.T, e *Env, name string) *v1.Service {
	t.Helper()
	for _, p := range e.Example {
		if p.Service.Name == name {
			return p.Service
		}
	}
	t.Fatalf("the example cluster has no Service %s", name)
	return nil
}
