package socklb_test

import (
	"fmt"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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
	r, err := e.client.ConnectRate(e.ctx(), addr, d)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// BenchmarkConnectRate compares new TCP connections per second (connect,
// read the server's line, close) to a ClusterIP against the same pod
// reached by its own IP, with 1 and with 10,000 Services programmed.
// Short rounds alternate so that both see the same machine load, and the
// median of the per-pair ratios is reported (target: at least 0.97). The
// kernel's run-time statistics of the socket programs give what the hooks
// themselves cost per connection.
func BenchmarkConnectRate(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			e := newEnv(b, 1)
			e.addWeb(e.podEPs(0)...)
			e.loadServices(n)
			e.connectRate(b, webVIP, netip.AddrPortFrom(e.pods[0].IP, tcpPort),
				[]*ebpf.Program{e.loaded.Objects.CgConnect4, e.loaded.Objects.CgGetpeername4})
		})
	}
}

// BenchmarkConnectRateIPv6 is BenchmarkConnectRate over IPv6: an IPv6
// ClusterIP against the pod's IPv6 address, with 1 and with 10,000 IPv6
// Services programmed (target: at least 0.97).
func BenchmarkConnectRateIPv6(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			e := newEnv6(b, 1)
			e.addWeb6(nil, e.pod6EPs(0)...)
			for i := 1; i < n; i++ {
				name := fmt.Sprintf("filler-%d", i)
				vip := netip.AddrFrom16([16]byte{0: 0xfd, 3: 0x10, 5: 0x97, 14: byte(i >> 8), 15: byte(i)})
				e.setService6(makeService(name, vip.String(), 80, v1.ProtocolTCP, intstr.FromInt32(8080)))
				var eps []ep
				for j := range 10 {
					k := i*10 + j
					eps = append(eps, ep{ip: netip.AddrFrom16([16]byte{0: 0xfd, 3: 0x10, 5: 0x02, 6: 0x45, 13: byte(k >> 16), 14: byte(k >> 8), 15: byte(k)})})
				}
				e.setSlice6(makeSlice(name, name+"-1", 8080, v1.ProtocolTCP, eps...))
			}
			e.sync6()
			e.connectRate(b, web6VIP, netip.AddrPortFrom(e.pods[0].IP6, tcpPort),
				[]*ebpf.Program{e.loaded.Objects.CgConnect6, e.loaded.Objects.CgGetpeername6})
		})
	}
}

// connectRate runs BenchmarkConnectRate's rounds, vip against direct, and
// reports their rates, the median ratio and the hooks progs' run time per
// connection through vip.
func (e *env) connectRate(b *testing.B, vip, direct netip.AddrPort, progs []*ebpf.Program) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	const rounds, each = 20, 300 * time.Millisecond
	var viaVIP, viaPod float64
	var ratios []float64
	vipConns := 0.0
	// The hooks' run time is counted over the ClusterIP rounds only: the
	// direct rounds run connect4 too (a miss), which is not what a
	// connection through a ClusterIP costs.
	var hookTime time.Duration
	perProg := make([]ebpf.ProgramStats, len(progs))
	viaVIPRound := func() float64 {
		s0 := progStats(b, progs)
		v := e.rate(b, vip, each)
		for i, st := range progStats(b, progs) {
			perProg[i].Runtime += st.Runtime - s0[i].Runtime
			perProg[i].RunCount += st.RunCount - s0[i].RunCount
			hookTime += st.Runtime - s0[i].Runtime
		}
		return v
	}
	for range b.N {
		for i := range rounds {
			// Alternate which goes first: each round leaves TIME_WAIT
			// sockets to the same pod port behind for the next.
			var p, v float64
			if i%2 == 0 {
				p = e.rate(b, direct, each)
				v = viaVIPRound()
			} else {
				v = viaVIPRound()
				p = e.rate(b, direct, each)
			}
			viaPod += p
			viaVIP += v
			vipConns += v * each.Seconds()
			ratios = append(ratios, v/p)
		}
	}
	sort.Float64s(ratios)
	runs := float64(rounds * b.N)
	b.ReportMetric(viaVIP/runs, "clusterip_conn/s")
	b.ReportMetric(viaPod/runs, "direct_conn/s")
	b.ReportMetric(ratios[len(ratios)/2], "median_ratio")
	// What the probe's connections cost in all: it calls getpeername()
	// twice, once in Go's dial and once itself to check the peer.
	b.ReportMetric(float64(hookTime.Nanoseconds())/vipConns, "hooks_all_ns/conn")
	// Each program's own share: its runs per connection and the time of
	// one run, which tell a program that runs more often than it should
	// from one that is slow. hook_ns/conn, the figure, is one run of each
	// (connect, then getpeername once, as a Go client's dial does).
	var oneEach float64
	for i, p := range progs {
		name := progName(b, p)
		st := perProg[i]
		b.ReportMetric(float64(st.RunCount)/vipConns, name+"_runs/conn")
		if st.RunCount == 0 {
			b.Fatalf("%s never ran in %.0f connections through %s", name, vipConns, vip)
		}
		perRun := float64(st.Runtime.Nanoseconds()) / float64(st.RunCount)
		b.ReportMetric(perRun, name+"_ns/run")
		oneEach += perRun
	}
	b.ReportMetric(oneEach, "hook_ns/conn")
}

// progStats reads the kernel's run statistics of progs.
func progStats(b *testing.B, progs []*ebpf.Program) []ebpf.ProgramStats {
	b.Helper()
	out := make([]ebpf.ProgramStats, len(progs))
	for i, p := range progs {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		out[i] = *st
	}
	return out
}

// progName is the name the program was loaded with.
func progName(b *testing.B, p *ebpf.Program) string {
	b.Helper()
	info, err := p.Info()
	if err != nil {
		b.Fatal(err)
	}
	return info.Name
}

// hookRuntime sums the run time the kernel recorded for progs.
func hookRuntime(b *testing.B, progs []*ebpf.Program) time.Duration {
	b.Helper()
	var total time.Duration
	for _, st := range progStats(b, progs) {
		total += st.Runtime
	}
	return total
}

// BenchmarkAffinityConnectCost measures what session affinity adds to a
// connect(): connections per second to a Service with ClientIP affinity
// against the same pod behind a Service without it, alternating rounds,
// and the hooks' run time per connection for each.
func BenchmarkAffinityConnectCost(b *testing.B) {
	e := newEnv(b, 1)
	e.addWeb(e.podEPs(0)...)
	affVIP := netip.MustParseAddrPort("10.96.0.81:80")
	e.setService(makeService("web-aff", affVIP.Addr().String(), 80, v1.ProtocolTCP, intstr.FromString("http"), clientIP(3600)))
	e.setSlice(makeSlice("web-aff", "web-aff-1", tcpPort, v1.ProtocolTCP, e.podEPs(0)...))
	e.sync()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	progs := []*ebpf.Program{e.loaded.Objects.CgConnect4, e.loaded.Objects.CgGetpeername4}
	const rounds, each = 20, 300 * time.Millisecond
	var plain, aff, plainConns, affConns float64
	var plainHook, affHook time.Duration
	var ratios []float64
	for range b.N {
		for i := range rounds {
			measure := func(addr netip.AddrPort) (float64, time.Duration) {
				h0 := hookRuntime(b, progs)
				r := e.rate(b, addr, each)
				return r, hookRuntime(b, progs) - h0
			}
			var p, a float64
			var ph, ah time.Duration
			if i%2 == 0 {
				p, ph = measure(webVIP)
				a, ah = measure(affVIP)
			} else {
				a, ah = measure(affVIP)
				p, ph = measure(webVIP)
			}
			plain, aff = plain+p, aff+a
			plainConns, affConns = plainConns+p*each.Seconds(), affConns+a*each.Seconds()
			plainHook, affHook = plainHook+ph, affHook+ah
			ratios = append(ratios, a/p)
		}
	}
	sort.Float64s(ratios)
	runs := float64(rounds * b.N)
	b.ReportMetric(plain/runs, "plain_conn/s")
	b.ReportMetric(aff/runs, "affinity_conn/s")
	b.ReportMetric(ratios[len(ratios)/2], "median_ratio")
	b.ReportMetric(float64(plainHook.Nanoseconds())/plainConns, "plain_hook_ns/conn")
	b.ReportMetric(float64(affHook.Nanoseconds())/affConns, "affinity_hook_ns/conn")
}

// BenchmarkConnectHookWarm is what the connect hook costs when nothing
// else runs between two of its runs: connect() on one UDP socket, again
// and again, with no packet sent, to a UDP ClusterIP (translated) and to an
// address that is no Service (a miss), with 1 and with 10,000 Services
// programmed. BenchmarkConnectRate's hook_ns/conn is the same program
// between real connections, whose work in the kernel leaves its maps and
// code out of the caches; the difference between the two is that.
func BenchmarkConnectHookWarm(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			e := newEnv(b, 1)
			e.setService(makeService("dns", dnsVIP.Addr().String(), int32(dnsVIP.Port()), v1.ProtocolUDP, intstr.FromInt32(udpPort)))
			e.setSlice(makeSlice("dns", "dns-1", udpPort, v1.ProtocolUDP, e.podEPs(0)...))
			e.loadServices(n)
			stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
			if err != nil {
				b.Fatal(err)
			}
			defer stats.Close()
			prog := []*ebpf.Program{e.loaded.Objects.CgConnect4}
			const calls = 200000
			for _, c := range []struct {
				name string
				to   netip.AddrPort
			}{
				{"clusterip", dnsVIP},
				{"miss", netip.AddrPortFrom(e.pods[0].IP, udpPort)},
			} {
				var runs, runtime float64
				for range b.N {
					s0 := progStats(b, prog)[0]
					res, err := e.client.UDPConnects(e.ctx(), c.to, calls)
					if err != nil {
						b.Fatal(err)
					}
					if res.Err != "" || res.Connects != calls {
						b.Fatalf("%d of %d connect() calls to %s returned, then %s", res.Connects, calls, c.to, res.Err)
					}
					s1 := progStats(b, prog)[0]
					runs += float64(s1.RunCount - s0.RunCount)
					runtime += float64((s1.Runtime - s0.Runtime).Nanoseconds())
				}
				b.ReportMetric(runtime/runs, c.name+"_connect4_ns/run")
			}
		})
	}
}
