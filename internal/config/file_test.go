package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// load parses args (with --config if given) as the agent does.
func load(t *testing.T, args ...string) (*Options, []string, error) {
	t.Helper()
	o := Defaults()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, nil, err
	}
	notes, err := FinishFlags(o, fs)
	if err == nil {
		err = o.Validate()
	}
	return o, notes, err
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// kubeadm's ConfigMap (testdata: made by kubeadm's own code, make
// kubeadm-proxy-config), handed to ebpf-proxy as to kube-proxy, with the
// DaemonSet's --hostname-override: the file's values and kube-proxy's
// defaults for what it leaves empty. Its "mode: iptables" (kubeadm 1.37)
// is kube-proxy's: the agent's mode stays its own, auto.
func TestKubeadmConfigFileRunsUnchanged(t *testing.T) {
	o, notes, err := load(t, "--config=testdata/kubeadm-kube-proxy.yaml", "--hostname-override=node-7")
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 0 {
		t.Errorf("warnings for kubeadm's own file: %q", notes)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"kubeconfig", o.Kubeconfig, "/var/lib/kube-proxy/kubeconfig.conf"},
		{"hostname (the flag wins)", o.HostnameOverride, "node-7"},
		{"cluster CIDR", o.ClusterPrefixes["IPv4"].String(), "10.244.0.0/16"},
		{"the agent's proxy mode (its own default)", o.ProxyMode, ProxyModeAuto},
		{"what set it", o.ProxyModeSetting, ProxyModeDefault},
		{"kube-proxy's mode, kept for the log", o.KubeProxyMode, "iptables"},
		{"NodePorts on every address (unset)", o.NodePorts["IPv4"].String(), "all"},
		{"healthz address", o.HealthzBindAddress, "0.0.0.0:10256"},
		{"metrics address", o.MetricsBindAddress, "127.0.0.1:10249"},
		{"API QPS", o.KubeAPIQPS, float32(5)},
		{"API burst", o.KubeAPIBurst, int32(10)},
		{"API content type", o.KubeAPIContentType, "application/vnd.kubernetes.protobuf"},
		{"masquerade bit", o.MasqueradeBit, int32(14)},
		{"localhost NodePorts", o.LocalhostNodePorts, true},
		{"iptables sync period", o.IPTablesSyncPeriod, 30 * time.Second},
		{"iptables min sync period", o.IPTablesMinSync, time.Second},
		{"ipvs sync period", o.IPVSSyncPeriod, 30 * time.Second},
		{"config sync period", o.ConfigSyncPeriod, 15 * time.Minute},
		{"oom score adj", o.OOMScoreAdj, int32(-999)},
		{"conntrack max per core (mode default)", o.Conntrack.MaxPerCore == nil, true},
		{"node IP override (0.0.0.0: none)", o.NodeIP.IsValid(), false},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

// As in kube-proxy, the file replaces the flags it covers, which are
// named in a warning; ebpf-proxy's own flags still apply, --proxy-mode
// among them: the file's mode is kube-proxy's.
func TestConfigFileReplacesKubeProxyFlags(t *testing.T) {
	path := writeFile(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: From-File
bindAddress: 192.168.77.7
iptables:
  minSyncPeriod: 2s
  syncPeriod: 1m
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 2h
featureGates:
  PreferSameTrafficDistribution: true
  SomeGateOfKubeProxy: false
logging:
  verbosity: 3
  format: text
`)
	o, notes, err := load(t, "--config="+path, "--proxy-mode=ebpf", "--iptables-min-sync-period=5s", "--lb-algorithm=maglev", "--bpffs-path=/x")
	if err != nil {
		t.Fatal(err)
	}
	if o.ProxyMode != "ebpf" || o.ProxyModeSetting != ProxyModeFlag || o.KubeProxyMode != "iptables" {
		t.Errorf("mode %q set by %q, kube-proxy's %q: want --proxy-mode's ebpf, the file's iptables as kube-proxy's only",
			o.ProxyMode, o.ProxyModeSetting, o.KubeProxyMode)
	}
	if s, m := o.IPTablesSyncPeriod, o.IPTablesMinSync; s != time.Minute || m != 2*time.Second {
		t.Errorf("iptables sync periods %s/%s, want the file's 1m/2s", s, m)
	}
	if o.HostnameOverride != "From-File" || o.Verbosity != 3 || o.LoggingFormat != "text" {
		t.Errorf("hostname %q verbosity %d format %q: want the file's", o.HostnameOverride, o.Verbosity, o.LoggingFormat)
	}
	if o.NodeIP.String() != "192.168.77.7" {
		t.Errorf("node IP %v, want the file's bindAddress", o.NodeIP)
	}
	if o.Conntrack.MaxPerCore == nil || *o.Conntrack.MaxPerCore != 0 || o.Conntrack.TCPEstablished == nil || *o.Conntrack.TCPEstablished != 2*time.Hour {
		t.Errorf("conntrack %+v: want maxPerCore 0 and 2h given", o.Conntrack)
	}
	if !o.Gates.Enabled(GatePreferSameTrafficDistribution, false) || o.Gates.Enabled("SomeGateOfKubeProxy", true) {
		t.Errorf("the file's feature gates not applied: %v", o.Gates)
	}
	if o.LBAlgorithm != "maglev" || o.BPFFSPath != "/x" {
		t.Errorf("ebpf-proxy's own flags lost: lb %q bpffs %q", o.LBAlgorithm, o.BPFFSPath)
	}
	if len(notes) != 1 || strings.Contains(notes[0], "--proxy-mode") || !strings.Contains(notes[0], "--iptables-min-sync-period") ||
		strings.Contains(notes[0], "--lb-algorithm") {
		t.Errorf("warnings %q: want one naming exactly the ignored kube-proxy flags", notes)
	}
}

// mode: nftables is kube-proxy's: the agent's mode stays auto, and the
// file's masquerade settings are those of its nftables section, as
// kube-proxy reads them by its mode; the nftables fallback's sync periods
// are the nftables section's, or the iptables ones without them, as
// there are no nftables flags.
func TestConfigFileNFTablesMode(t *testing.T) {
	o, _, err := load(t, "--config="+writeFile(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n"+
		"iptables:\n  syncPeriod: 40s\n  minSyncPeriod: 2s\nnftables:\n  masqueradeBit: 9\n  masqueradeAll: true\n  syncPeriod: 50s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.ProxyMode != ProxyModeAuto || o.KubeProxyMode != "nftables" || o.MasqueradeBit != 9 || !o.MasqueradeAll {
		t.Errorf("mode %q (kube-proxy's %q), masquerade bit %d, all %t; want auto (nftables), 9, true", o.ProxyMode, o.KubeProxyMode, o.MasqueradeBit, o.MasqueradeAll)
	}
	if sync, minSync := o.NFTablesPeriods(); sync != 50*time.Second || minSync != 2*time.Second {
		t.Errorf("nftables sync periods %s and %s, want the nftables section's 50s and the iptables one's 2s", sync, minSync)
	}
}

func TestConfigFileBadInput(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		// err is a part of the refusal; "" means it loads, with a
		// warning containing warn.
		err, warn string
	}{
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", "KubeletConfiguration", ""},
		{"wrong version", "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n", "v1alpha2", ""},
		{"not YAML", "{{{", "--config", ""},
		{"bad value", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nipvs:\n  excludeCIDRs: [nonsense]\n", "--ipvs-exclude-cidrs", ""},
		{"unknown field: lenient, as kube-proxy", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfancyNewField: 1\nclusterCIDR: 10.0.0.0/8\n", "", "strict decoding"},
		{"a locked gate turned off, as kube-proxy 1.37 refuses it", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfeatureGates:\n  PreferSameTrafficDistribution: false\n", "locked to true", ""},
		{"portRange", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nportRange: 30000-30100\n", "", "portRange"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, notes, err := load(t, "--config="+writeFile(t, tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, tc.warn) }) {
				t.Errorf("warnings %q, want one containing %q", notes, tc.warn)
			}
			if tc.name == "unknown field: lenient, as kube-proxy" && o.ClusterCIDR != "10.0.0.0/8" {
				t.Errorf("known fields not applied after the lenient decode: cluster CIDR %q", o.ClusterCIDR)
			}
		})
	}
	if _, _, err := load(t, "--config=/nonexistent/config.yaml"); err == nil {
		t.Errorf("a missing file is accepted")
	}
}

// --write-config-to writes what is in effect; reading it back gives the
// same options.
func TestWrittenConfigReadsBackTheSame(t *testing.T) {
	o, _, err := load(t, "--proxy-mode=ipvs", "--ipvs-scheduler=lc", "--ipvs-exclude-cidrs=10.1.0.0/16", "--ipvs-strict-arp",
		"--cluster-cidr=10.244.0.0/16", "--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cni0",
		"--conntrack-max-per-core=0", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s", "--feature-gates=PreferSameTrafficDistribution=true",
		"--kube-api-qps=50", "--kube-api-burst=100", "--oom-score-adj=-500", "--masquerade-all", "--iptables-masquerade-bit=12",
		"--nodeport-addresses=192.168.0.0/16", "--bind-address=10.0.0.5", "--metrics-bind-address=0.0.0.0:10249", "-v=2", "--config-sync-period=5m")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "out.yaml")
	if err := o.WriteConfig(path); err != nil {
		t.Fatal(err)
	}
	back, notes, err := load(t, "--config="+path)
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 0 {
		t.Errorf("warnings reading our own output: %q", notes)
	}
	o.ConfigFile = back.ConfigFile
	// --proxy-mode is the agent's own, never in kube-proxy's file.
	if back.ProxyMode != ProxyModeAuto {
		t.Errorf("the written file set the agent's mode to %q", back.ProxyMode)
	}
	back.ProxyMode, back.ProxyModeSetting = o.ProxyMode, o.ProxyModeSetting
	if !reflect.DeepEqual(o, back) {
		t.Errorf("read back differs:\n%+v\nwant\n%+v", back, o)
	}
}

func TestBadSyncPeriodsAndKubeProxyFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--iptables-sync-period=0"}, {"--iptables-min-sync-period=1m", "--iptables-sync-period=30s"},
		{"--ipvs-min-sync-period=-1s"}, {"--oom-score-adj=1001"}, {"--logging-format=xml"},
		{"--detect-local-mode=BridgeInterface"}, {"--detect-local-mode=Magic"}, {"--feature-gates=A=maybe"},
		{"--bind-address=not-an-ip"}, {"--conntrack-min=-1"},
	} {
		if _, _, err := load(t, args...); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
