package tclb_test

import (
	"net/netip"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// BenchmarkPodConnectRate compares new TCP connections per second (connect,
// read the server's line, close) from a pod to a pod on its node, four
// ways, in alternating short rounds so that all see the same machine load:
//   - direct: to the server's own address from a pod that no program of
//     ours sees: the baseline;
//   - socket: to the server's ClusterIP from a pod whose sockets the socket
//     programs translate (--socket-lb-scope=all), at connect();
//   - packet: to the ClusterIP from a pod translated per packet at its
//     device (--socket-lb-scope=node);
//   - packet_direct: to the server's own address from that pod, every
//     packet through the program at its device all the same.
//
// Each is reported in connections per second and as the median of its
// per-round ratios to direct.
func BenchmarkPodConnectRate(b *testing.B) {
	e := newTopology(b)
	a := e.nodes[0]
	viaSocket, err := e.sb.AddPod(a.Node, "c-socket", netip.Addr{})
	if err != nil {
		b.Fatal(err)
	}
	viaPacket, err := e.sb.AddPod(a.Node, "c-packet", netip.Addr{})
	if err != nil {
		b.Fatal(err)
	}
	bare, err := e.sb.AddPod(a.Node, "c-bare", netip.Addr{})
	if err != nil {
		b.Fatal(err)
	}
	e.attachDevices(a, loader.TCAttachAuto, []loader.TCDevice{
		{Name: sandbox.IfaceName, SNAT: a.IP, SNAT6: a.IP6},
		{Name: viaPacket.HostVeth, SNAT: a.Gateway, SNAT6: a.Gateway6, Pod: true},
	})
	e.attach(e.nodes[1], loader.TCAttachAuto, false)
	// The socket programs on a cgroup of their own, where only c-socket's
	// probes run.
	sockCg, err := e.sb.AddCgroup("sockets")
	if err != nil {
		b.Fatal(err)
	}
	err = a.NS.Do(func() error {
		cookie, err := loader.NetnsCookie()
		if err != nil {
			return err
		}
		l, err := loader.Load(loader.Config{BPFFSPath: filepath.Join(e.sb.BPFFS.Path(), a.Name), CgroupPath: sockCg.Path(), Sizes: small, NodeNetnsCookie: cookie})
		if err == nil {
			b.Cleanup(l.Close)
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	e.sync(scenario()...)
	server := netip.AddrPortFrom(e.pods["pod-a"].IP, tcpPort)
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	socket := e.sb.ClientAt(viaSocket.Host).InCgroup(sockCg)
	packet := e.sb.ClientAt(viaPacket.Host)
	ways := []struct {
		name string
		c    *sandbox.Client
		to   netip.AddrPort
	}{
		{"direct", e.sb.ClientAt(bare.Host), server},
		{"socket", socket, vip},
		{"packet", packet, vip},
		{"packet_direct", packet, server},
	}
	const rounds, each = 10, 300 * time.Millisecond
	rates := make([]float64, len(ways))
	ratios := make([][]float64, len(ways))
	for range b.N {
		for r := range rounds {
			round := make([]float64, len(ways))
			for i := range ways {
				// Each round starts with another way: a round leaves
				// TIME_WAIT sockets behind for the next.
				w := (i + r) % len(ways)
				round[w] = loopRate(b, ways[w].c, ways[w].to, each)
			}
			for w := range ways {
				rates[w] += round[w]
				ratios[w] = append(ratios[w], round[w]/round[0])
			}
		}
	}
	runs := float64(rounds * b.N)
	for w, way := range ways {
		b.ReportMetric(rates[w]/runs, way.name+"_conn/s")
		if w > 0 {
			sort.Float64s(ratios[w])
			b.ReportMetric(ratios[w][len(ratios[w])/2], way.name+"/direct")
		}
	}
}

// loopRate is c.ConnectRate; an error fails b.
func loopRate(b *testing.B, c *sandbox.Client, addr netip.AddrPort, d time.Duration) float64 {
	b.Helper()
	r, err := c.ConnectRate(b.Context(), addr, d)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
