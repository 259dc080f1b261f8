package config

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzConfigFile reads arbitrary bytes as --config: no panic, and a file
// that is accepted, once written back by --write-config-to, reads back to
// the same options.
func FuzzConfigFile(f *testing.F) {
	for _, name := range []string{"kubeadm-kube-proxy.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, body := range []string{
		"", "{{{", "mode: ipvs\nipvs:\n  scheduler: lc\n  excludeCIDRs: [10.1.0.0/16]\n  strictARP: true\n",
		"mode: nftables\nnftables:\n  syncPeriod: 50s\niptables:\n  minSyncPeriod: 2s\n",
		"conntrack:\n  maxPerCore: 0\n  udpTimeout: 30s\n  tcpEstablishedTimeout: null\nfeatureGates:\n  PreferSameTrafficDistribution: false\n",
		"clusterCIDR: 10.244.0.0/16,fd00::/48\ndetectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cni0\n",
		"nodePortAddresses: [primary]\nbindAddress: 10.0.0.5\nmetricsBindAddress: 0.0.0.0:10249\noomScoreAdj: -500\n",
		"clientConnection:\n  qps: 50\n  burst: 100\nlogging:\n  verbosity: 2\nconfigSyncPeriod: 5m\nportRange: 30000-30100\n",
		"fancyNewField: 1\niptables:\n  masqueradeBit: 12\n  masqueradeAll: true\n",
	} {
		f.Add([]byte(head + body))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		in := filepath.Join(dir, "in.yaml")
		if err := os.WriteFile(in, data, 0o644); err != nil {
			t.Fatal(err)
		}
		o, _, err := load(t, "--config="+in)
		if err != nil {
			if err.Error() == "" {
				t.Errorf("an empty error")
			}
			return
		}
		out := filepath.Join(dir, "out.yaml")
		if err := o.WriteConfig(out); err != nil {
			t.Fatalf("accepted options cannot be written: %v", err)
		}
		back, notes, err := load(t, "--config="+out)
		if err != nil {
			written, _ := os.ReadFile(out)
			t.Fatalf("our own output is refused: %v\n%s", err, written)
		}
		if len(notes) != 0 {
			t.Errorf("warnings reading our own output: %q", notes)
		}
		o.ConfigFile = back.ConfigFile
		if !reflect.DeepEqual(o, back) {
			written, _ := os.ReadFile(out)
			t.Errorf("read back differs:\n%+v\nwant\n%+v\nwritten:\n%s", back, o, written)
		}
	})
}
