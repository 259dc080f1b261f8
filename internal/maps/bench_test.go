package maps_test

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// kernelMaps creates the socket programs' IPv4 maps in the kernel,
// unpinned and attached to nothing, with their default sizes.
func kernelMaps(b *testing.B) maps.Maps {
	b.Helper()
	return maps.KernelMaps(createMaps(b, func(sm *bpfobj.SockMaps) map[string]**ebpf.Map {
		return map[string]**ebpf.Map{
			bpfobj.SockMapLb4ServicesV1: &sm.Lb4ServicesV1,
			bpfobj.SockMapLb4BackendsV1: &sm.Lb4BackendsV1,
			bpfobj.SockMapLb4RevnatV1:   &sm.Lb4RevnatV1,
			bpfobj.SockMapLb4MembersV1:  &sm.Lb4MembersV1,
		}
	}))
}

// kernelMaps6 is kernelMaps for the IPv6 maps.
func kernelMaps6(b *testing.B) maps.Maps6 {
	b.Helper()
	return maps.KernelMaps6(createMaps(b, func(sm *bpfobj.SockMaps) map[string]**ebpf.Map {
		return map[string]**ebpf.Map{
			bpfobj.SockMapLb6ServicesV1: &sm.Lb6ServicesV1,
			bpfobj.SockMapLb6BackendsV1: &sm.Lb6BackendsV1,
			bpfobj.SockMapLb6RevnatV1:   &sm.Lb6RevnatV1,
			bpfobj.SockMapLb6MembersV1:  &sm.Lb6MembersV1,
		}
	}))
}

// createMaps creates the maps which names picks, closed when b ends.
func createMaps(b *testing.B, which func(*bpfobj.SockMaps) map[string]**ebpf.Map) *bpfobj.SockMaps {
	b.Helper()
	sandbox.RequireRoot(b)
	spec, err := bpfobj.LoadSock()
	if err != nil {
		b.Fatal(err)
	}
	var sm bpfobj.SockMaps
	for name, dst := range which(&sm) {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			b.Fatal(err)
		}
		*dst = m
	}
	b.Cleanup(func() { sm.Close() })
	return &sm
}

func svcName(i int) model.ServiceName {
	return model.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
}

// feed records n Services of eps endpoints each in tr, with distinct
// ClusterIPs and endpoint addresses.
func feed(tr *tracker.Tracker, n, eps int) { feedFamily(tr, n, eps, false) }

// feedFamily is feed for the IPv6 view of the same Services with ipv6:
// the IPv6 twins of their addresses.
func feedFamily(tr *tracker.Tracker, n, eps int, ipv6 bool) {
	for i := range n {
		name := svcName(i)
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		s := slice(i, eps, 0)
		if ipv6 {
			ip = twin6(ip)
			for j := range s.Endpoints {
				s.Endpoints[j].Addr = twin6(s.Endpoints[j].Addr)
			}
		}
		tr.UpdateService(name, []*model.ServicePort{{
			Name:      model.ServicePortName{ServiceName: name, Port: "http", Protocol: model.TCP},
			ClusterIP: ip,
			Port:      80,
		}})
		tr.UpdateEndpointSlice(s)
	}
}

// twin6 is an IPv6 address unique to the IPv4 address a: a in the low 32
// bits of fd00::/96.
func twin6(a netip.Addr) netip.Addr {
	b := [16]byte{0: 0xfd}
	v4 := a.As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

// slice is the EndpointSlice of Service i; shift moves its endpoints to
// other addresses, which is how a rolling update looks.
func slice(i, eps, shift int) *model.EndpointSlice {
	s := &model.EndpointSlice{
		Service: svcName(i), Name: fmt.Sprintf("svc-%d-abc", i),
		Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.TCP}},
	}
	for j := range eps {
		k := i*eps + j + shift
		s.Endpoints = append(s.Endpoints, model.Endpoint{
			Addr:  netip.AddrFrom4([4]byte{10, byte(244 + k>>16), byte(k >> 8), byte(k)}),
			Ready: true, Serving: true, NodeName: "node-b",
		})
	}
	return s
}

// BenchmarkProgramServices is the time to program N Services of 10
// endpoints from the model into the kernel maps: the tracker's selection
// and the writer's map updates, as the agent's first sync does them.
func BenchmarkProgramServices(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			var total, cpu time.Duration
			for range b.N {
				m := kernelMaps(b)
				w, err := maps.NewWriter(m, maps.Limits{Backends: 262144, RevNat: 65536})
				if err != nil {
					b.Fatal(err)
				}
				tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
				feed(tr, n, 10)
				start, cpu0 := time.Now(), cpuTime()
				up := tr.Apply()
				up.Full = true
				if err := w.Sync(up); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
				cpu += cpuTime() - cpu0
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/program")
			// CPU time (user+system) is what the work costs on an idle
			// machine; wall time also counts waiting for a busy CPU.
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/program")
		})
	}
}

// BenchmarkProgramDualStack compares, in one run, the time to program
// 10,000 Services of 10 endpoints IPv4-only with the time to program them
// dual-stack: each family's tracker selects and each family's writer
// writes its maps, one after the other as the agent's two sync loops do on
// one CPU. The ratio is dual-stack over IPv4-only (2 is twice the work).
func BenchmarkProgramDualStack(b *testing.B) {
	const n = 10000
	lim := maps.Limits{Backends: 262144, RevNat: 65536}
	program := func(w *maps.Writer, ipv6 bool) time.Duration {
		tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
		feedFamily(tr, n, 10, ipv6)
		start := time.Now()
		up := tr.Apply()
		up.Full = true
		if err := w.Sync(up); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var v4, dual time.Duration
	for range b.N {
		w4, err := maps.NewWriter(kernelMaps(b), lim)
		if err != nil {
			b.Fatal(err)
		}
		v4 += program(w4, false)
		w4, err = maps.NewWriter(kernelMaps(b), lim)
		if err != nil {
			b.Fatal(err)
		}
		w6, err := maps.NewWriter6(kernelMaps6(b), lim)
		if err != nil {
			b.Fatal(err)
		}
		dual += program(w4, false) + program(w6, true)
	}
	b.ReportMetric(v4.Seconds()/float64(b.N), "ipv4-s/program")
	b.ReportMetric(dual.Seconds()/float64(b.N), "dual-s/program")
	b.ReportMetric(dual.Seconds()/v4.Seconds(), "dual/ipv4")
}

// BenchmarkEndpointChange is the time from an EndpointSlice change to its
// programming with 10,000 Services present: one endpoint of one Service
// replaced per operation.
func BenchmarkEndpointChange(b *testing.B) {
	const n = 10000
	m := kernelMaps(b)
	w, err := maps.NewWriter(m, maps.Limits{Backends: 262144, RevNat: 65536})
	if err != nil {
		b.Fatal(err)
	}
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	feed(tr, n, 10)
	up := tr.Apply()
	up.Full = true
	if err := w.Sync(up); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range b.N {
		svc := i % n
		// Shifting by one replaces one endpoint with a new address.
		tr.UpdateEndpointSlice(slice(svc, 10, 1))
		up := tr.Apply()
		if err := w.Sync(up); err != nil {
			b.Fatal(err)
		}
		tr.UpdateEndpointSlice(slice(svc, 10, 0))
		if err := w.Sync(tr.Apply()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(2*b.N), "cpu-µs/change")
	// Each iteration made two changes.
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(2*b.N), "µs/change")
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
