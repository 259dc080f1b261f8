package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func parse(t *testing.T, args ...string) *options {
	t.Helper()
	o := defaultOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestFlagsKeepKubeProxyNamesAndDefaults(t *testing.T) {
	o := parse(t)
	if o.healthzBindAddress != "0.0.0.0:10256" || o.metricsBindAddress != "127.0.0.1:10249" {
		t.Errorf("defaults: healthz %q metrics %q, want kube-proxy's", o.healthzBindAddress, o.metricsBindAddress)
	}
	if o.bpffsPath != "/sys/fs/bpf/ebpf-proxy" {
		t.Errorf("bpffs default %q", o.bpffsPath)
	}
	o = parse(t, "--kubeconfig=/k", "--master=https://x", "--hostname-override=Node-A", "-v=4", "--cleanup", "--proxy-mode=ebpf")
	if o.kubeconfig != "/k" || o.master != "https://x" || o.hostnameOverride != "Node-A" || o.verbosity != 4 || !o.cleanup {
		t.Errorf("parsed %+v", o)
	}
	if n, _ := nodeName(o.hostnameOverride); n != "node-a" {
		t.Errorf("node name %q, want the override lowercased as kube-proxy does", n)
	}
}

func TestUnavailableModesAreRefusedClearly(t *testing.T) {
	for _, mode := range []string{"iptables", "ipvs", "nftables", "auto", "bogus"} {
		err := parse(t, "--proxy-mode="+mode).validate()
		if err == nil || !strings.Contains(err.Error(), "only 'ebpf'") {
			t.Errorf("--proxy-mode=%s: %v, want a clear refusal", mode, err)
		}
	}
	if err := parse(t, "--proxy-mode=ebpf").validate(); err != nil {
		t.Errorf("ebpf refused: %v", err)
	}
}

func TestFindCgroup2Mount(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo, want string
	}{
		{"unified hierarchy",
			"24 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", "/sys/fs/cgroup"},
		{"hybrid: the unified mount among v1 ones",
			"30 24 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n31 24 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup/unified"},
		{"escaped path", "40 1 0:30 / /run/my\\040cgroup rw - cgroup2 none rw\n", "/run/my cgroup"},
		{"none mounted", "22 1 0:21 / /proc rw - proc proc rw\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "mountinfo")
			if err := os.WriteFile(p, []byte(tc.mountinfo), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := findCgroup2Mount(p)
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestInvalidReasonKeepsTheCause(t *testing.T) {
	if got := invalidReason("invalid externalIP: \"1.2.3\" is not an IP"); got != "invalid externalIP" {
		t.Errorf("got %q", got)
	}
	if got := invalidReason(strings.Repeat("x", 100)); len(got) > 40 {
		t.Errorf("unbounded label %q", got)
	}
}
