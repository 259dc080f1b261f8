package bench

import (
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// The scale benchmark sizes ebpf-proxy's maps past the defaults only, and
// only for the BPF mode.
func TestAgentArgsSizeTheMaps(t *testing.T) {
	for _, c := range []struct {
		kind     testbed.Kind
		services int
		want     []string
	}{
		{testbed.EbpfProxy, 10000, nil},
		{testbed.EbpfProxy, 30000, []string{"--bpf-map-services-max=412527", "--bpf-map-backends-max=375025"}},
		{testbed.KubeProxyNFTables, 30000, nil},
	} {
		got := agentArgs(c.kind, config{services: c.services, endpoints: 10})
		if !slices.Equal(got, c.want) {
			t.Errorf("%s, %d Services: %q, want %q", c.kind, c.services, got, c.want)
		}
	}
}
