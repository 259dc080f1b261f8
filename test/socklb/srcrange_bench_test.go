package socklb_test

import (
	"encoding/binary"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// ipv4Frame is an Ethernet frame holding an IPv4 packet of proto with the
// given ports (BPF_PROG_TEST_RUN takes one for cgroup_skb programs too, and
// hands the program the packet from its IP header).
func ipv4Frame(proto uint8, src, dst netip.AddrPort) []byte {
	f := make([]byte, 14+20+20)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	ip[8] = 64
	ip[9] = proto
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[20:], src.Port())
	binary.BigEndian.PutUint16(ip[22:], dst.Port())
	if proto == unix.IPPROTO_TCP {
		ip[32] = 5 << 4
		ip[33] = 0x02 // SYN
	}
	return f
}

// TestSourceRangeCheckPassesUntaggedPackets runs the egress program on
// packets of a socket that no LoadBalancer IP with source ranges tagged
// (BPF_PROG_TEST_RUN gives the program a socket of its own), even ones
// from outside the ranges to a backend: it must let every one pass.
func TestSourceRangeCheckPassesUntaggedPackets(t *testing.T) {
	e := newEnv(t, 0)
	src := netip.MustParseAddrPort("10.244.1.220:40000")
	dst := netip.MustParseAddrPort("10.244.1.10:8080")
	frames := []struct {
		name  string
		frame []byte
	}{
		{"TCP SYN", ipv4Frame(unix.IPPROTO_TCP, src, dst)},
		{"UDP", ipv4Frame(unix.IPPROTO_UDP, src, dst)},
		{"ICMP", ipv4Frame(unix.IPPROTO_ICMP, src, dst)},
		{"ARP", append(make([]byte, 12), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1)},
	}
	for _, f := range frames {
		t.Run(f.name, func(t *testing.T) {
			ret, err := e.loaded.Objects.CgEgress4.Run(&ebpf.RunOptions{Data: f.frame})
			if err != nil {
				t.Fatal(err)
			}
			if ret != 1 {
				t.Errorf("verdict %d, want 1 (pass)", ret)
			}
		})
	}
}

// BenchmarkSourceRangeCheck measures what the egress program costs while it
// is attached: per packet of a socket it does not check (BPF_PROG_TEST_RUN,
// and the kernel's run-time statistics under real traffic to a ClusterIP,
// which include the statistics' own clock reads), per packet of a socket it
// checks (connections to a LoadBalancer IP whose ranges admit the client),
// and new TCP connections per second to the ClusterIP with the program
// attached and detached and to the LoadBalancer IP, in rotating rounds, as
// median ratios.
//
// It attaches and detaches the check through the dataplane, so that the
// pin guard follows: through the loader alone, the guard took the
// detached check's pin for one removed behind the agent's back, pinned it
// again within a second, and its handle kept the program attached.
func BenchmarkSourceRangeCheck(b *testing.B) {
	e := newEnv(b, 1)
	e.addExposedWeb([]func(*v1.Service){withRanges("10.244.0.0/16")}, e.podEPs(0)...)
	if !e.loaded.SourceRangeCheck() {
		b.Fatal("egress check not attached")
	}
	prog := e.loaded.Objects.CgEgress4
	frame := ipv4Frame(unix.IPPROTO_TCP, netip.MustParseAddrPort("10.244.1.11:40000"), netip.AddrPortFrom(e.pods[0].IP, tcpPort))
	const repeat = 1_000_000
	ret, d, err := prog.Benchmark(frame, repeat, nil)
	if err != nil {
		b.Fatal(err)
	}
	if ret != 1 {
		b.Fatalf("untagged packet: verdict %d", ret)
	}
	b.ReportMetric(float64(d.Nanoseconds()), "untagged_testrun_ns/pkt")

	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	egress := func() (time.Duration, uint64) {
		st, err := prog.Stats()
		if err != nil {
			b.Fatal(err)
		}
		return st.Runtime, st.RunCount
	}
	lb := netip.AddrPortFrom(lbIP, 80)
	// Three ways per round, in rotating order: the ClusterIP with the
	// check attached (its sockets are not tagged), the same with the check
	// detached (a cluster without source ranges), and the LoadBalancer IP
	// (tagged, checked).
	type way struct {
		addr     netip.AddrPort
		attached bool
		rate     float64
		time     time.Duration
		pkts     uint64
		ratios   []float64
	}
	ways := []*way{{addr: webVIP, attached: true}, {addr: webVIP}, {addr: lb, attached: true}}
	const rounds, each = 12, 300 * time.Millisecond
	for range b.N {
		for i := range rounds {
			got := make([]float64, len(ways))
			for j := range ways {
				k := (i + j) % len(ways)
				w := ways[k]
				if err := e.d.SetSourceRangeCheck(w.attached); err != nil {
					b.Fatal(err)
				}
				t0, n0 := egress()
				r := e.rate(b, w.addr, each)
				t1, n1 := egress()
				w.rate, w.time, w.pkts = w.rate+r, w.time+t1-t0, w.pkts+n1-n0
				got[k] = r
			}
			ways[0].ratios = append(ways[0].ratios, got[0]/got[1])
			ways[2].ratios = append(ways[2].ratios, got[2]/got[1])
		}
	}
	if err := e.d.SetSourceRangeCheck(true); err != nil {
		b.Fatal(err)
	}
	if n := e.counters()["sock_dropped_source_range"]; n != 0 {
		b.Errorf("%d packets of admitted clients dropped", n)
	}
	median := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	runs := float64(rounds * b.N)
	b.ReportMetric(ways[1].rate/runs, "clusterip_conn/s")
	b.ReportMetric(median(ways[0].ratios), "clusterip_attached_vs_detached_median_ratio")
	b.ReportMetric(median(ways[2].ratios), "ranged_lb_vs_clusterip_detached_median_ratio")
	b.ReportMetric(float64(ways[0].time.Nanoseconds())/float64(ways[0].pkts), "untagged_ns/pkt")
	b.ReportMetric(float64(ways[2].time.Nanoseconds())/float64(ways[2].pkts), "tagged_ns/pkt")
	if ways[1].pkts != 0 {
		b.Errorf("the detached program ran %d times", ways[1].pkts)
	}
}
