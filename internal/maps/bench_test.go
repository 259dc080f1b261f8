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

// kernelMaps creates the socket programs' maps in the kernel, unpinned and
// attached to nothing, with their default sizes.
func kernelMaps(b *testing.B) maps.Maps {
	b.Helper()
	sandbox.RequireRoot(b)
	spec, err := bpfobj.LoadSock()
	if err != nil {
		b.Fatal(err)
	}
	var sm bpfobj.SockMaps
	for name, dst := range map[string]**ebpf.Map{
		bpfobj.SockMapLb4ServicesV1: &sm.Lb4ServicesV1,
		bpfobj.SockMapLb4BackendsV1: &sm.Lb4BackendsV1,
		bpfobj.SockMapLb4RevnatV1:   &sm.Lb4RevnatV1,

		bpfobj.SockMapLb4MembersV1: &sm.Lb4MembersV1,
	} {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			b.Fatal(err)
		}
		*dst = m
	}
	b.Cleanup(func() { sm.Close() })
	return maps.KernelMaps(&sm)
}

func svcName(i int) model.ServiceName {
	return model.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
}

// feed records n Services of eps endpoints each in tr, with distinct
// ClusterIPs and endpoint addresses.
func feed(tr *tracker.Tracker, n, eps int) {
	for i := range n {
		name := svcName(i)
		tr.UpdateService(name, []*model.ServicePort{{
			Name:      model.ServicePortName{ServiceName: name, Port: "http", Protocol: model.TCP},
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			Port:      80,
		}})
		tr.UpdateEndpointSlice(slice(i, eps, 0))
	}
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
