package bench

import (
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// mibPeak is a result of kind whose memory cgroup peaked at mib MiB.
func mibPeak(kind testbed.Kind, mib uint64) result {
	return result{kind: kind, memEnd: testbed.MemoryPeak{Bytes: mib << 20}}
}

// The scale benchmark's memory figures: the BPF mode's cgroup peak at 100
// Services, and its ratio to upstream iptables' whenever both ran.
func TestPrintFiguresOfMemory(t *testing.T) {
	for _, c := range []struct {
		name     string
		services int
		rs       []result
		want     []string
	}{
		{"100 Services, both proxies: the peak and the ratio", 100,
			[]result{mibPeak(testbed.EbpfProxy, 48), mibPeak(testbed.KubeProxyIPTables, 32), mibPeak(testbed.KubeProxyNFTables, 16)},
			[]string{"bench: mem_vs_iptables=1.50 ratio target=1 met=no", "bench: mem_100_cgroup=48.0 MiB target=64 met=yes"}},
		{"1000 Services: the ratio alone", 1000,
			[]result{mibPeak(testbed.KubeProxyIPTables, 200), mibPeak(testbed.EbpfProxy, 100)},
			[]string{"bench: mem_vs_iptables=0.50 ratio target=1 met=yes"}},
		{"no iptables proxy: no ratio", 100,
			[]result{mibPeak(testbed.EbpfProxy, 80), mibPeak(testbed.KubeProxyNFTables, 16)},
			[]string{"bench: mem_100_cgroup=80.0 MiB target=64 met=no"}},
	} {
		var sb strings.Builder
		printFigures(&sb, config{services: c.services, endpoints: 10}, c.rs)
		if got, want := strings.TrimSpace(sb.String()), strings.Join(c.want, "\n"); got != want {
			t.Errorf("%s: printed\n%s\nwant\n%s", c.name, got, want)
		}
	}
}
