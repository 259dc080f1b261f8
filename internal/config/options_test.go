package config

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
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
	o = parse(t, "--kubeconfig=/k", "--master=https://x", "--hostname-override=Node-A", "-v=4", "--cleanup", "--proxy-mode=ebpf")
	if o.Kubeconfig != "/k" || o.Master != "https://x" || o.HostnameOverride != "Node-A" || o.Verbosity != 4 || !o.Cleanup {
		t.Errorf("parsed %+v", o)
	}
	if n, _ := k8swatch.NodeName(o.HostnameOverride); n != "node-a" {
		t.Errorf("node name %q, want the override lowercased as kube-proxy does", n)
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
