package config

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
)

func parse(t *testing.T, args ...string) *Options {
	t.Helper()
	o := Defaults()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestFlagsKeepKubeProxyNamesAndDefaults(t *testing.T) {
	o := parse(t)
	if o.HealthzBindAddress != "0.0.0.0:10256" || o.MetricsBindAddress != "127.0.0.1:10249" {
		t.Errorf("defaults: healthz %q metrics %q, want kube-proxy's", o.HealthzBindAddress, o.MetricsBindAddress)
	}
	if o.BPFFSPath != "/sys/fs/bpf/ebpf-proxy" {
		t.Errorf("bpffs default %q", o.BPFFSPath)
	}
	o = parse(t, "--kubeconfig=/k", "--master=https://x", "--hostname-override=Node-A", "-v=4", "--cleanup", "--proxy-mode=ebpf")
	if o.Kubeconfig != "/k" || o.Master != "https://x" || o.HostnameOverride != "Node-A" || o.Verbosity != 4 || !o.Cleanup {
		t.Errorf("parsed %+v", o)
	}
	if n, _ := k8swatch.NodeName(o.HostnameOverride); n != "node-a" {
		t.Errorf("node name %q, want the override lowercased as kube-proxy does", n)
	}
}

func TestProxyModes(t *testing.T) {
	if o := parse(t); o.ProxyMode != "auto" {
		t.Errorf("default --proxy-mode %q, want auto", o.ProxyMode)
	}
	for _, mode := range []string{"auto", "ebpf", "nftables", "iptables", "ipvs"} {
		if err := parse(t, "--proxy-mode="+mode).Validate(); err != nil {
			t.Errorf("--proxy-mode=%s refused: %v", mode, err)
		}
	}
	for _, mode := range []string{"kernelspace", "bogus", "userspace"} {
		err := parse(t, "--proxy-mode="+mode).Validate()
		if err == nil || !strings.Contains(err.Error(), "'auto', 'ebpf', 'nftables', 'iptables' or 'ipvs'") {
			t.Errorf("--proxy-mode=%s: %v, want a refusal naming the modes", mode, err)
		}
	}
}

func TestFallbackFlagsKeepKubeProxyNames(t *testing.T) {
	o := parse(t, "--cluster-cidr=10.244.0.0/16,fd00::/48", "--masquerade-all", "--iptables-masquerade-bit=15",
		"--nodeport-addresses=192.168.77.0/24,fd00:1::/64", "--nodeport-addresses=10.0.0.1/32", "--ipvs-scheduler=sh",
		"--ipvs-tcp-timeout=15m", "--ipvs-tcpfin-timeout=30s", "--ipvs-udp-timeout=5s")
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.ClusterPrefixes["IPv4"] != netip.MustParsePrefix("10.244.0.0/16") || o.ClusterPrefixes["IPv6"] != netip.MustParsePrefix("fd00::/48") {
		t.Errorf("cluster CIDRs %v, want one of each family from the list", o.ClusterPrefixes)
	}
	if got, want := o.NodePorts["IPv4"].String(), "192.168.77.0/24,10.0.0.1/32"; got != want {
		t.Errorf("IPv4 node port addresses %v, want %v", got, want)
	}
	if got, want := o.NodePorts["IPv6"].String(), "fd00:1::/64"; got != want {
		t.Errorf("IPv6 node port addresses %v, want %v", got, want)
	}
	if !o.MasqueradeAll || o.MasqueradeBit != 15 || o.IPVSScheduler != "sh" || o.IPVSTCPTimeout != 15*time.Minute ||
		o.IPVSTCPFinTimeout != 30*time.Second || o.IPVSUDPTimeout != 5*time.Second {
		t.Errorf("parsed %+v", o)
	}
	if d := parse(t); d.MasqueradeBit != 14 || d.ClusterCIDR != "" || d.IPVSScheduler != "" {
		t.Errorf("defaults: masquerade bit %d, cluster CIDR %q, scheduler %q; want kube-proxy's 14, none, rr", d.MasqueradeBit, d.ClusterCIDR, d.IPVSScheduler)
	}
}

func TestBadFallbackFlagsAreRefusedClearly(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"cluster CIDR that is no CIDR", []string{"--cluster-cidr=10.244.0.0"}, "--cluster-cidr"},
		{"two IPv4 cluster CIDRs", []string{"--cluster-cidr=10.244.0.0/16,10.245.0.0/16"}, "more than one IPv4"},
		{"masquerade bit out of range", []string{"--iptables-masquerade-bit=32"}, "[0, 31]"},
		{"negative masquerade bit", []string{"--iptables-masquerade-bit=-1"}, "[0, 31]"},
		{"unknown scheduler", []string{"--ipvs-scheduler=wrr2"}, "--ipvs-scheduler"},
		{"node port address that is not a CIDR", []string{"--nodeport-addresses=eth0"}, "neither a CIDR nor"},
		{"fractional IPVS timeout", []string{"--ipvs-udp-timeout=1500ms"}, "whole seconds"},
		{"negative IPVS timeout", []string{"--ipvs-tcp-timeout=-1s"}, "whole seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parse(t, tc.args...).Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: %v, want an error about %q", tc.args, err, tc.want)
			}
		})
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
			o := parse(t, tc.args...)
			err := o.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--nodeport-snat-port-range") {
					t.Fatalf("%v: %v, want an error naming the flag and %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.SNATPorts != tc.want {
				t.Errorf("%v: range %s, want %s", tc.args, o.SNATPorts, tc.want)
			}
		})
	}
}

// --nodeport-addresses takes kube-proxy 1.37's keywords, combined with each
// other and with CIDRs; an explicit value is kept in every mode, nftables
// included.
func TestNodePortAddressKeywords(t *testing.T) {
	for _, tc := range []struct {
		flag, ipv4, ipv6 string
	}{
		{"primary,localhost", "primary,127.0.0.0/8", "primary,::1/128"},
		{"localhost,192.168.77.0/24", "127.0.0.0/8,192.168.77.0/24", "::1/128"},
		{"all", "all", "all"},
		{"primary,all", "all", "all"},
	} {
		o := parse(t, "--nodeport-addresses="+tc.flag)
		if err := o.Validate(); err != nil {
			t.Errorf("--nodeport-addresses=%s: %v", tc.flag, err)
			continue
		}
		for fam, want := range map[string]string{"IPv4": tc.ipv4, "IPv6": tc.ipv6} {
			if got := o.NodePortsFor(proxymode.NFTables, fam).String(); got != want {
				t.Errorf("--nodeport-addresses=%s, %s in nftables mode: %s, want %s", tc.flag, fam, got, want)
			}
		}
	}
	for _, bad := range []string{"localhost,localhost", "primary,eth0", "Primary"} {
		if err := parse(t, "--nodeport-addresses="+bad).Validate(); err == nil || !strings.Contains(err.Error(), "--nodeport-addresses") {
			t.Errorf("--nodeport-addresses=%s: %v, want a refusal naming the flag", bad, err)
		}
	}
}
