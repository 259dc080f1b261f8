package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
)

// --proxy-mode takes auto and the registered modes' names, and a refusal
// names them.
func TestProxyModes(t *testing.T) {
	if o, _, err := load(t); err != nil || o.ProxyMode != "auto" {
		t.Errorf("default --proxy-mode %q (%v), want auto", o.ProxyMode, err)
	}
	for _, mode := range []string{"auto", "ebpf", "nftables", "iptables", "ipvs"} {
		if _, _, err := load(t, "--proxy-mode="+mode); err != nil {
			t.Errorf("--proxy-mode=%s refused: %v", mode, err)
		}
	}
	for _, mode := range []string{"kernelspace", "bogus", "userspace"} {
		_, _, err := load(t, "--proxy-mode="+mode)
		if err == nil || !strings.Contains(err.Error(), "'auto', 'ebpf', 'nftables', 'iptables' or 'ipvs'") {
			t.Errorf("--proxy-mode=%s: %v, want a refusal naming the modes", mode, err)
		}
	}
}

// The modes' own settings get their defaults and their checks.
func TestModeSettingsDefaultsAndChecks(t *testing.T) {
	o, _, err := load(t)
	if err != nil {
		t.Fatal(err)
	}
	// The maps' capacities are left to the agent (0), the LRU maps' by a
	// share of the node's memory.
	if o.BPFFSPath != "/sys/fs/bpf/ebpf-proxy" || o.XDP != "off" || o.MapSizes.Services != 0 || o.ConntrackSize != 0 || o.MapMemoryRatio != 0.0025 {
		t.Errorf("BPF defaults: bpffs %q, xdp %q, services map %d, conntrack map %d, memory ratio %g",
			o.BPFFSPath, o.XDP, o.MapSizes.Services, o.ConntrackSize, o.MapMemoryRatio)
	}
	for _, tc := range []struct{ arg, want string }{
		{"--ipvs-scheduler=wrr2", "--ipvs-scheduler"},
		{"--xdp=fast", "--xdp"},
		{"--tc-attach=ebpf", "--tc-attach"},
		{"--maglev-table-size=1000", "--maglev-table-size"},
		{"--bpf-map-dynamic-size-ratio=0", "--bpf-map-dynamic-size-ratio"},
		{"--bpf-map-dynamic-size-ratio=0.9", "--bpf-map-dynamic-size-ratio"},
	} {
		if _, _, err := load(t, tc.arg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %s", tc.arg, err, tc.want)
		}
	}
}

func TestSNATPortRangeFlag(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    bpf.PortRange
		wantErr string
	}{
		{"default: above the ephemeral and NodePort ranges", nil, bpf.PortRange{Min: 61000, Max: 65535}, ""},
		{"a wider range", []string{"--nodeport-snat-port-range=50000-65535"}, bpf.PortRange{Min: 50000, Max: 65535}, ""},
		{"a single port", []string{"--nodeport-snat-port-range=61000-61000"}, bpf.PortRange{Min: 61000, Max: 61000}, ""},
		{"no dash", []string{"--nodeport-snat-port-range=61000"}, bpf.PortRange{}, "want min-max"},
		{"not a number", []string{"--nodeport-snat-port-range=61000-lots"}, bpf.PortRange{}, "is not a port"},
		{"beyond 65535", []string{"--nodeport-snat-port-range=61000-70000"}, bpf.PortRange{}, "is not a port"},
		{"reversed", []string{"--nodeport-snat-port-range=65000-61000"}, bpf.PortRange{}, "min <= max"},
		{"well-known ports", []string{"--nodeport-snat-port-range=80-2000"}, bpf.PortRange{}, "1024 <= min"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _, err := load(t, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--nodeport-snat-port-range") {
					t.Fatalf("%v: %v, want an error naming the flag and %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := bpf.ConfigFrom(o, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.SNATPorts != tc.want {
				t.Errorf("%v: range %s, want %s", tc.args, cfg.SNATPorts, tc.want)
			}
		})
	}
}

// --nodeport-addresses takes kube-proxy 1.37's keywords, combined with each
// other and with CIDRs; an explicit value is kept in every mode, nftables
// included, and an unset one means every address, but in nftables mode the
// primary IP, as kube-proxy's nftables mode.
func TestNodePortAddressKeywords(t *testing.T) {
	for _, tc := range []struct {
		flag, ipv4, ipv6 string
	}{
		{"primary,localhost", "primary,127.0.0.0/8", "primary,::1/128"},
		{"localhost,192.168.77.0/24", "127.0.0.0/8,192.168.77.0/24", "::1/128"},
		{"all", "all", "all"},
		{"primary,all", "all", "all"},
	} {
		o, _, err := load(t, "--nodeport-addresses="+tc.flag)
		if err != nil {
			t.Errorf("--nodeport-addresses=%s: %v", tc.flag, err)
			continue
		}
		for fam, want := range map[string]string{"IPv4": tc.ipv4, "IPv6": tc.ipv6} {
			if got := nftables.Mode.NodePorts(o, fam).String(); got != want {
				t.Errorf("--nodeport-addresses=%s, %s in nftables mode: %s, want %s", tc.flag, fam, got, want)
			}
		}
	}
	for _, bad := range []string{"localhost,localhost", "primary,eth0", "Primary"} {
		if _, _, err := load(t, "--nodeport-addresses="+bad); err == nil || !strings.Contains(err.Error(), "--nodeport-addresses") {
			t.Errorf("--nodeport-addresses=%s: %v, want a refusal naming the flag", bad, err)
		}
	}
	o, _, err := load(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range modes {
		want := "all"
		if m.Name == nftables.Name {
			want = "primary"
		}
		got := o.NodePorts["IPv4"].String()
		if m.NodePorts != nil {
			got = m.NodePorts(o, "IPv4").String()
		}
		if got != want {
			t.Errorf("unset --nodeport-addresses in %s mode: %s, want %s", m.Name, got, want)
		}
	}
}

// Each mode's sync loop runs at its own periods: kube-proxy's per-mode
// flags for the fallbacks (the nftables section of its file, else the
// iptables ones), --sync-period and --min-sync-period for ebpf.
func TestSyncPeriodsFollowTheMode(t *testing.T) {
	o, _, err := load(t, "--sync-period=1m", "--min-sync-period=0", "--iptables-sync-period=2m", "--iptables-min-sync-period=3s",
		"--ipvs-sync-period=4m", "--ipvs-min-sync-period=5s")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]time.Duration{
		"ebpf":     {time.Minute, 0},
		"nftables": {2 * time.Minute, 3 * time.Second},
		"iptables": {2 * time.Minute, 3 * time.Second},
		"ipvs":     {4 * time.Minute, 5 * time.Second},
	}
	for _, m := range modes {
		if s, min := m.SyncPeriods(o); s != want[m.Name][0] || min != want[m.Name][1] {
			t.Errorf("%s: %s/%s, want %s/%s", m.Name, s, min, want[m.Name][0], want[m.Name][1])
		}
	}
}
