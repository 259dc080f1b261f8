package iptables

import (
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// --detect-local-mode=BridgeInterface and InterfaceNamePrefix: the kernel
// takes the rules, and iptables-save gives them back word for word as
// rendered (a partial sync compares what it wrote with what it renders),
// for the two places kube-proxy uses the detector: the masquerade of
// ClusterIP traffic from outside the pods, and the short-circuit of pod
// traffic to an externalTrafficPolicy=Local frontend.
func TestLocalTrafficDetectorsByInterface(t *testing.T) {
	for _, backend := range backends {
		for _, tc := range []struct {
			name      string
			d         xtables.LocalDetector
			pod, rest string
		}{
			{"bridge", xtables.LocalDetector{Bridge: "cni0"}, "-i cni0 ", "! -i cni0 "},
			{"interface prefix", xtables.LocalDetector{InterfacePrefix: "veth"}, "-i veth+ ", "! -i veth+ "},
		} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				requireBackend(t, backend)
				ex := example.Example()
				src := example.NewSource(t, example.Node(example.NodeA)).Add(ex...)
				// The detector wins over a cluster CIDR given too.
				cfg := Config{Backend: backend, Netfilter: xtables.Netfilter{Netns: sandbox.TestNetns(t, "ipt-local").Path(), ClusterCIDR: example.ClusterCIDR, LocalDetector: tc.d}}
				d, err := New(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				up := src.Update()
				if err := d.Sync(up); err != nil {
					t.Fatal(err)
				}
				var saved []string
				for _, rules := range readOwned(t, d.runner) {
					saved = append(saved, rules...)
				}
				if err := cfg.setDefaults(); err != nil {
					t.Fatal(err)
				}
				p := newPlanner(&cfg)
				p.r.nodeIPs = up.State.Node.Addrs
				pl, err := p.full(up.State, freshHooks)
				if err != nil {
					t.Fatal(err)
				}
				var pod, rest int
				for _, line := range strings.Split(string(pl.tx.Bytes()), "\n") {
					if !strings.HasPrefix(line, "-A ") || !strings.Contains(line, "-i ") {
						continue
					}
					if strings.Contains(line, example.ClusterCIDR.String()) {
						t.Errorf("rule matches the cluster CIDR besides the interface: %s", line)
					}
					switch {
					case strings.Contains(line, tc.rest):
						rest++
					case strings.Contains(line, tc.pod):
						pod++
					}
					_, spec, _ := strings.Cut(line[3:], " ")
					found := false
					for _, s := range saved {
						found = found || s == spec
					}
					if !found {
						t.Errorf("rendered rule not read back as written: %s", spec)
					}
				}
				if pod == 0 || rest == 0 {
					t.Errorf("rules matching pod traffic by interface: %d, the rest: %d; want both", pod, rest)
				}
			})
		}
	}
}
