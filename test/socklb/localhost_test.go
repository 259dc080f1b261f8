package socklb_test

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestLocalhostNodePorts: with 127.0.0.1 among the NodePort addresses
// (kube-proxy's iptables mode by default), the node's own processes reach a
// NodePort on 127.0.0.1 and the rest of 127.0.0.0/8, TCP and UDP, and see
// the address they asked for as their peer; a pod's 127.0.0.1 stays its own
// loopback; without endpoints the node's datagrams to a NodePort get
// ECONNREFUSED (kube-proxy refuses them in INPUT, not in OUTPUT as for a
// ClusterIP); without 127.0.0.1 among the addresses (the flag off) the node
// gets its own loopback too.
func TestLocalhostNodePorts(t *testing.T) {
	e := newEnv(t, 2)
	const udpNodePort = 30053
	localhost := netip.MustParseAddr("127.0.0.1")
	program := func(addrs ...netip.Addr) {
		t.Helper()
		e.setNodeAddrs(addrs...)
		e.setService(makeService("web", webVIP.Addr().String(), int32(webVIP.Port()), v1.ProtocolTCP, intstr.FromString("http"), exposed))
		e.setSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, e.podEPs(0, 1)...))
		e.setService(makeService("dns", "10.96.0.53", 53, v1.ProtocolUDP, intstr.FromString("p"), func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = udpNodePort
		}))
		e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP, e.podEPs(0, 1)...))
		e.sync()
	}
	node := e.sb.ClientAt(e.node.Host)

	t.Run("127.0.0.1 among the NodePort addresses", func(t *testing.T) {
		program(e.node.IP, localhost)
		for _, addr := range []netip.AddrPort{
			netip.AddrPortFrom(localhost, nodePort),
			netip.AddrPortFrom(netip.MustParseAddr("127.3.2.1"), nodePort),
		} {
			if got := e.reach(t, node, addr, 30); len(got) != 2 {
				t.Errorf("the node to %s reached %v, want both endpoints", addr, got)
			}
		}
		rep, err := node.UDPConnected(e.ctx(), netip.AddrPortFrom(localhost, udpNodePort), 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			if r.Err != "" || r.Server == "" || r.From.Addr() != localhost || r.Peer.Addr() != localhost {
				t.Errorf("the node's datagram to 127.0.0.1:%d: %+v, want an answer from it", udpNodePort, r)
			}
		}
		// The NodePort on the node's address is unchanged.
		if got := e.reach(t, node, netip.AddrPortFrom(e.node.IP, nodePort), 10); len(got) == 0 {
			t.Error("the node's own address lost its NodePort")
		}
		// A pod's loopback is its own: nothing listens there.
		rep2, err := e.client.TCP(e.ctx(), netip.AddrPortFrom(localhost, nodePort), 1)
		if err != nil {
			t.Fatal(err)
		}
		if r := rep2.Results[0]; r.Err != "ECONNREFUSED" {
			t.Errorf("a pod to its own 127.0.0.1:%d: %+v, want ECONNREFUSED from its loopback", nodePort, r)
		}
	})

	t.Run("no endpoints: the node's datagrams to a NodePort are refused as kube-proxy's INPUT rules refuse them", func(t *testing.T) {
		program(e.node.IP, localhost)
		e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP))
		e.sync()
		for _, addr := range []netip.AddrPort{netip.AddrPortFrom(localhost, udpNodePort), netip.AddrPortFrom(e.node.IP, udpNodePort)} {
			rep, err := node.UDPConnected(e.ctx(), addr, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r := rep.Results[0]; r.Err != "ECONNREFUSED" {
				t.Errorf("the node's datagram to %s: %+v, want ECONNREFUSED", addr, r)
			}
		}
		// Its ClusterIP's REJECT is in the OUTPUT path: send() fails.
		rep, err := node.UDPConnected(e.ctx(), netip.MustParseAddrPort("10.96.0.53:53"), 1)
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Results[0]; r.Err != "EPERM" {
			t.Errorf("the node's datagram to the ClusterIP: %+v, want EPERM", r)
		}
	})

	t.Run("127.0.0.1 not among them", func(t *testing.T) {
		program(e.node.IP)
		rep, err := node.TCP(e.ctx(), netip.AddrPortFrom(localhost, nodePort), 1)
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Results[0]; r.Err != "ECONNREFUSED" {
			t.Errorf("the node to 127.0.0.1:%d: %+v, want ECONNREFUSED from its loopback", nodePort, r)
		}
	})
}
