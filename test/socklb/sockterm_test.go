package socklb_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// writeDualStackManifests writes web and dns as dual-stack Services (their
// IPv6 ClusterIPs are web6VIP's and dns6VIP's) with the pods as their
// endpoints in both families.
func writeDualStackManifests(t *testing.T, dir string, pods ...*sandbox.Pod) {
	t.Helper()
	writeDualStackManifestsWebPort(t, dir, webVIP.Port(), pods...)
}

// writeDualStackManifestsWebPort is writeDualStackManifests with web's
// Service port webPort.
func writeDualStackManifestsWebPort(t *testing.T, dir string, webPort uint16, pods ...*sandbox.Pod) {
	t.Helper()
	var eps6 []discoveryv1.Endpoint
	for _, p := range pods {
		eps6 = append(eps6, builders.Endpoint(p.IP6.String(), nodeName))
	}
	web := builders.Service("default", "web", builders.ClusterIP(webVIP.Addr().String()), builders.DualStack(web6VIP.Addr().String()),
		builders.Ports(builders.Port("http", int32(webPort), v1.ProtocolTCP, intstr.FromInt32(tcpPort))))
	dns := builders.Service("default", "dns", builders.ClusterIP(dnsVIP.Addr().String()), builders.DualStack(dns6VIP.Addr().String()),
		builders.Ports(builders.Port("dns", 53, v1.ProtocolUDP, intstr.FromInt32(udpPort))))
	var objs []runtime.Object
	for _, svc := range []*v1.Service{web, dns} {
		slice4, slice6 := builders.SliceFor(svc, podEndpoints(pods)...), builders.SliceFor(svc, eps6...)
		slice6.Name, slice6.AddressType = svc.Name+"-ipv6", discoveryv1.AddressTypeIPv6
		objs = append(objs, svc, slice4, slice6)
	}
	if err := builders.WriteManifest(dir, "services.yaml", objs...); err != nil {
		t.Fatal(err)
	}
}

// TestRemovedBackendsSocketsAreEnded: when a backend is removed, a TCP
// connection made to it through a Service is aborted rather than left to
// hang, and a long-lived connected UDP client (a resolver) is moved off it
// and answered by a live backend; connections to the remaining backend are
// left alone. Clients of all kinds: over IPv4, over IPv6 to the Services'
// IPv6 ClusterIPs, and dual-stack clients (AF_INET6 sockets) to the IPv4
// ClusterIPs' IPv4-mapped addresses.
func TestRemovedBackendsSocketsAreEnded(t *testing.T) {
	for _, tt := range []struct {
		name     string
		web, dns netip.AddrPort
	}{
		{"IPv4", webVIP, dnsVIP},
		{"IPv6", web6VIP, dns6VIP},
		{"IPv4-mapped on AF_INET6 sockets", mapped(webVIP), mapped(dnsVIP)},
	} {
		t.Run(tt.name, func(t *testing.T) { testRemovedBackendsSocketsAreEnded(t, tt.web, tt.dns) })
	}
}

func testRemovedBackendsSocketsAreEnded(t *testing.T, webVIP, dnsVIP netip.AddrPort) {
	e := newSandbox(t, 2)
	dir := t.TempDir()
	writeDualStackManifests(t, dir, e.pods[0], e.pods[1])
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
	writeDualStackManifests(t, dir, survivor)
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

// TestPeerStaysTheFrontendConnectedTo: a connection made through a
// Service's port goes on when the Service's port is renumbered (its
// endpoints unchanged), and getpeername() keeps showing the ClusterIP and
// port it was connected to, as with kube-proxy, whose conntrack entry keeps
// translating the connection while the socket's peer is the address it
// connected to. New connections use the new port.
func TestPeerStaysTheFrontendConnectedTo(t *testing.T) {
	for _, tt := range []struct {
		name string
		web  netip.AddrPort
	}{
		{"IPv4", webVIP},
		{"IPv6", web6VIP},
		{"IPv4-mapped on AF_INET6 sockets", mapped(webVIP)},
	} {
		t.Run(tt.name, func(t *testing.T) { testPeerStaysTheFrontendConnectedTo(t, tt.web) })
	}
}

func testPeerStaysTheFrontendConnectedTo(t *testing.T, web netip.AddrPort) {
	e := newSandbox(t, 1)
	dir := t.TempDir()
	writeDualStackManifestsWebPort(t, dir, web.Port(), e.pods[0])
	e.startAgent(t, dir)

	h, err := e.client.Hold(e.ctx(), web)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if h.First.Err != "" || h.First.Peer != web {
		t.Fatalf("connection through %s: %+v, want it connected with that peer", web, h.First)
	}

	renumbered := netip.AddrPortFrom(web.Addr(), web.Port()+1)
	writeDualStackManifestsWebPort(t, dir, renumbered.Port(), e.pods[0])
	if err := testbed.Poll(e.ctx(), "the renumbered port "+renumbered.String()+" answers", 15*time.Second, func() (bool, error) {
		rep, err := e.client.TCP(e.ctx(), renumbered, 1)
		if err != nil {
			return false, err
		}
		if r := rep.Results[0]; r.Err != "" {
			return false, fmt.Errorf("%+v", r)
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	peer, err := h.Peer()
	if err != nil {
		t.Fatalf("the connection made through %s broke when the port was renumbered: %v", web, err)
	}
	if peer != web {
		t.Errorf("getpeername() of the connection made through %s says %s after the port was renumbered, want %s", web, peer, web)
	}
}

// TestUDPSocketConnectedStraightToItsBackendSeesTheBackend: a UDP socket
// that was connected to a ClusterIP, then is connected straight to the pod
// behind it, talks to the pod as itself: getpeername() and the replies'
// source are the pod's address, as with kube-proxy, where nothing of the
// earlier connect outlives it. Connected to the ClusterIP again, it sees
// the ClusterIP again.
func TestUDPSocketConnectedStraightToItsBackendSeesTheBackend(t *testing.T) {
	for _, tt := range []struct {
		name    string
		dns     netip.AddrPort
		backend func(*sandbox.Pod) netip.AddrPort
	}{
		{"IPv4", dnsVIP, func(p *sandbox.Pod) netip.AddrPort { return netip.AddrPortFrom(p.IP, udpPort) }},
		{"IPv6", dns6VIP, func(p *sandbox.Pod) netip.AddrPort { return netip.AddrPortFrom(p.IP6, udpPort) }},
		{"IPv4-mapped on AF_INET6 sockets", mapped(dnsVIP), func(p *sandbox.Pod) netip.AddrPort { return mapped(netip.AddrPortFrom(p.IP, udpPort)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newSandbox(t, 1)
			dir := t.TempDir()
			writeDualStackManifests(t, dir, e.pods[0])
			e.startAgent(t, dir)

			steps := []netip.AddrPort{tt.dns, tt.backend(e.pods[0]), tt.dns}
			rep, err := e.client.UDPReconnects(e.ctx(), steps)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range rep.Results {
				if r.Err != "" || r.Server != e.pods[0].Name || r.Peer != steps[i] || r.From != steps[i] {
					t.Errorf("connected to %s (step %d of %v): %+v, want %s's answer with peer and source %s",
						steps[i], i+1, steps, r, e.pods[0].Name, steps[i])
				}
			}
		})
	}
}
