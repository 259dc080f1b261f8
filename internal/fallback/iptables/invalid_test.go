package iptables

import (
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// Packets that conntrack finds INVALID on their way through the node (a
// TCP segment with SYN and RST set, from a pod on node-a to one on node-b)
// are dropped by our FORWARD chain and counted in
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total, as kube-proxy
// counts them.
func TestInvalidPacketsAreDroppedAndCounted(t *testing.T) {
	e := behaviour.NewEnv(t, factory(availableBackend(t, "iptables"), false))
	d, ok := e.Dataplanes[example.NodeA].(*Dataplane)
	if !ok {
		t.Fatalf("node-a's dataplane is a %T", e.Dataplanes[example.NodeA])
	}
	c := NewInvalidDropCollector(zap.NewNop(), d)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	const name = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"
	if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 1 {
		t.Fatalf("%s: %d series (%v), want 1", name, n, err)
	}
	start := testutil.ToFloat64(c)

	const sent = 5
	src := netip.AddrPortFrom(behaviour.ClientPodAIP, 40000)
	dst := netip.AddrPortFrom(example.PodB1, 8080)
	pkt := pktest.TCP(src, dst, pktest.SYN|pktest.RST).IPBytes()
	err := e.Clients[behaviour.ClientPodA].NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
		for range sent {
			if err := unix.Sendto(fd, pkt, 0, to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send from %s: %v", behaviour.ClientPodA, err)
	}
	got := testutil.ToFloat64(c) - start
	if got != sent {
		t.Errorf("%s grew by %v after %d INVALID segments through node-a, want %d", name, got, sent, sent)
	}
}
