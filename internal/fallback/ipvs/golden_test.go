package ipvs

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/golden"
)

func freshHooks(tx *xtables.Transaction) error {
	hs := hooks()
	for i := len(hs) - 1; i >= 0; i-- {
		tx.Table(hs[i].Table).Insert(hs[i].Chain, hs[i].Spec)
	}
	return nil
}

func render(t *testing.T, cfg Config, state *model.State) map[model.ServicePortName]serviceConfig {
	t.Helper()
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	r := renderer{cfg: &cfg, nodeIPs: cfg.NodeIPs, nodePortIPs: cfg.NodeIPs}
	out := map[model.ServicePortName]serviceConfig{}
	for name, svc := range state.Services {
		out[name] = r.service(svc)
	}
	return out
}

func TestConfigurationMatchesGoldenFiles(t *testing.T) {
	nodeA := []netip.Addr{example.NodeAIP}
	tests := []struct {
		name string
		cfg  Config
	}{
		{"node-a", Config{Netfilter: xtables.Netfilter{ClusterCIDR: example.ClusterCIDR, NodeIPs: nodeA}}},
		{"node-a-sh-no-cluster-cidr", Config{Scheduler: "sh", Netfilter: xtables.Netfilter{NodeIPs: nodeA, MasqueradeBit: 12}}},
		// The IPv6 dataplane of node-a, fed the example cluster's IPv6
		// twin: the same virtual servers, entries and rules as node-a's
		// over the twin addresses, in the EBPFPROXY-6- sets.
		{"node-a6", Config{Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: example.ClusterCIDR6, NodeIPs: []netip.Addr{example.NodeAIP6}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, _ := example.NodeASource(t, tt.cfg.IPv6)
			up := src.Update()
			cfg := tt.cfg
			golden.Check(t, tt.name+"-ipvs", dump(cfg.family(), render(t, cfg, up.State)))
			if err := cfg.setDefaults(); err != nil {
				t.Fatal(err)
			}
			tx, err := transaction(&cfg, true, nil, freshHooks)
			if err != nil {
				t.Fatal(err)
			}
			golden.Check(t, tt.name+"-iptables", string(tx.Bytes()))
		})
	}
}

func TestSchedulerAndBitsAreValidated(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"empty scheduler means rr", Config{}, true},
		{"source hashing", Config{Scheduler: "sh"}, true},
		{"never queue", Config{Scheduler: "nq"}, true},
		{"unknown scheduler", Config{Scheduler: "fastest"}, false},
		{"masquerade bit too large", Config{Netfilter: xtables.Netfilter{MasqueradeBit: 32}}, false},
		{"IPv6 cluster CIDR for IPv4", Config{Netfilter: xtables.Netfilter{ClusterCIDR: netip.MustParsePrefix("fd00::/64")}}, false},
		{"IPv4 cluster CIDR for IPv6", Config{Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16")}}, false},
		{"IPv6 cluster CIDR for IPv6", Config{Netfilter: xtables.Netfilter{IPv6: true, ClusterCIDR: netip.MustParsePrefix("fd00::/64")}}, true},
		{"IPv4 node IP for IPv6", Config{Netfilter: xtables.Netfilter{IPv6: true, NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.77.11")}}}, false},
		{"IPv6 node IP for IPv4", Config{Netfilter: xtables.Netfilter{NodeIPs: []netip.Addr{netip.MustParseAddr("fd00::11")}}}, false},
		{"unknown iptables back end", Config{Backend: "ebtables"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.setDefaults()
			if (err == nil) != tt.ok {
				t.Fatalf("setDefaults() = %v, want ok=%t", err, tt.ok)
			}
			if tt.ok && tt.cfg.Scheduler == "" {
				t.Errorf("scheduler left empty")
			}
		})
	}
}
