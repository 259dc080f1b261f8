package socklb_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// loadServices programs n-1 more Services next to web, each with ten
// endpoints elsewhere in the pod network, so that the maps hold n.
func (e *env) loadServices(n int) {
	for i := 1; i < n; i++ {
		name := fmt.Sprintf("filler-%d", i)
		vip := netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})
		e.setService(makeService(name, vip.String(), 80, v1.ProtocolTCP, intstr.FromInt32(8080)))
		var eps []ep
		for j := range 10 {
			k := i*10 + j
			eps = append(eps, ep{ip: netip.AddrFrom4([4]byte{10, 245, byte(k >> 8), byte(k)})})
		}
		e.setSlice(makeSlice(name, name+"-1", 8080, v1.ProtocolTCP, eps...))
	}
	e.sync()
}

// rate runs a connection loop for d and returns connections per second.
func (e *env) rate(b *testing.B, addr netip.AddrPort, d time.Duration) float64 {
	b.Helper()
	loop, err := e.client.StartLoop(e.ctx(), addr, sandbox.LoopOptions{Interval: time.Microsecond, MaxDuration: d})
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(d)
	res, err := loop.Stop()
	if err != nil {
		b.Fatal(err)
	}
	if res.Failures != 0 {
		b.Fatalf("%d of %d connections to %s failed: %v", res.Failures, res.Attempts, addr, res.Errors)
	}
	return float64(res.Attempts) / res.Duration.Seconds()
}

// BenchmarkConnectRate compares new TCP connections per second (connect,
// read the server's line, close) to a ClusterIP against the same pod
// reached by its own IP, with 1 and with 10,000 Services programmed.
// Rounds alternate so that both see the same machine load; the ratio is
// the figure of merit (target: at least 0.97).
func BenchmarkConnectRate(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			e := newEnv(b, 1)
			e.addWeb(e.podEPs(0)...)
			e.loadServices(n)
			direct := netip.AddrPortFrom(e.pods[0].IP, tcpPort)
			const rounds, each = 10, 600 * time.Millisecond
			var viaVIP, viaPod float64
			for range b.N {
				for range rounds {
					viaPod += e.rate(b, direct, each)
					viaVIP += e.rate(b, webVIP, each)
				}
			}
			runs := float64(rounds * b.N)
			b.ReportMetric(viaVIP/runs, "clusterip_conn/s")
			b.ReportMetric(viaPod/runs, "direct_conn/s")
			b.ReportMetric(viaVIP/viaPod, "ratio")
		})
	}
}
