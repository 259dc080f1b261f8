package ipvs

import (
	"fmt"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// BenchmarkRender measures turning the model into IPVS configuration for
// 1,000 and 10,000 Services with 10 endpoints each (no kernel involved).
func BenchmarkRender(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			scale := example.NewScale(n, 10)
			cfg := Config{Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR, NodeIPs: []netip.Addr{example.NodeAIP}}}
			if err := cfg.setDefaults(); err != nil {
				b.Fatal(err)
			}
			r := renderer{cfg: &cfg, nodeIPs: cfg.NodeIPs, nodePortIPs: cfg.NodeIPs}
			var servers, reals, entries int
			b.ResetTimer()
			for range b.N {
				servers, reals, entries = 0, 0, 0
				for _, svc := range scale.State.Services {
					c := r.service(svc)
					servers += len(c.Servers)
					entries += len(c.Entries)
					for _, vs := range c.Servers {
						reals += len(vs.Reals)
					}
				}
			}
			b.ReportMetric(float64(servers), "virtual-servers")
			b.ReportMetric(float64(reals), "real-servers")
			b.ReportMetric(float64(entries), "ipset-entries")
		})
	}
}

// BenchmarkSync measures syncs into the kernel inside a test namespace, as
// the iptables benchmark does: the first sync on a fresh node, a periodic
// full sync with nothing changed, and a partial sync of one changed
// endpoint. It needs IPVS, so it runs in the VM runner.
func BenchmarkSync(b *testing.B) {
	for _, n := range example.BenchScales {
		for _, kind := range example.SyncKinds {
			b.Run(fmt.Sprintf("services=%d/%s", n, kind), func(b *testing.B) {
				sandbox.RequireRoot(b)
				if err := Available(""); err != nil {
					b.Skipf("IPVS: %v", err)
				}
				d := example.BenchSync(b, example.NewScale(n, 10), kind, example.SyncBenchmark[*Dataplane]{
					New: func() *Dataplane {
						ns, err := sandbox.NewNetns("ipvs-bench")
						if err != nil {
							b.Fatal(err)
						}
						d, err := New(behaviour.Context(b), Config{Netfilter: xtables.Netfilter{Netns: ns.Path(), ClusterCIDR: example.ClusterCIDR}})
						if err != nil {
							b.Fatal(err)
						}
						b.Cleanup(func() {
							d.Close()
							ns.Close()
						})
						return d
					},
				})
				b.ReportMetric(float64(len(d.haveVS)), "virtual-servers")
			})
		}
	}
}
