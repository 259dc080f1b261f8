package main

import (
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
)

// The agent's command line as deploy/daemonset.yaml ships it, fed kubeadm
// 1.37's kube-proxy ConfigMap (made by kubeadm's own code, make
// kubeadm-proxy-config), whose mode is "iptables": the agent's mode stays
// its own auto (the BPF dataplane where the kernel runs it), set by
// --proxy-mode, and kube-proxy's mode is kept for the log only. Before,
// the file's mode was taken as the agent's, and a kubeadm cluster got the
// iptables fallback.
func TestDaemonSetWithKubeadmConfigMapRunsItsOwnMode(t *testing.T) {
	b, err := os.ReadFile("../../deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	cmd := ds.Spec.Template.Spec.Containers[0].Command
	if len(cmd) < 2 || cmd[0] != "/ebpf-proxy" {
		t.Fatalf("the DaemonSet's command %q does not run /ebpf-proxy", cmd)
	}
	const kubeadmConfig = "../../internal/config/testdata/kubeadm-kube-proxy.yaml"
	var args []string
	found := false
	for _, a := range cmd[1:] {
		switch {
		case a == "--config=/var/lib/kube-proxy/config.conf":
			a, found = "--config="+kubeadmConfig, true
		case strings.Contains(a, "$(NODE_NAME)"):
			a = strings.ReplaceAll(a, "$(NODE_NAME)", "node-a")
		}
		args = append(args, a)
	}
	if !found {
		t.Fatalf("the DaemonSet's command %q does not read the kube-proxy ConfigMap's config.conf", cmd)
	}
	o, notes, err := load(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 0 {
		t.Errorf("warnings for the shipped DaemonSet with kubeadm's ConfigMap: %q", notes)
	}
	if o.ProxyMode != config.ProxyModeAuto || o.ProxyModeSetting != config.ProxyModeFlag || o.KubeProxyMode != dataplane.IPTables {
		t.Errorf("mode %q set by %q, kube-proxy's %q: want auto set by --proxy-mode, kube-proxy's iptables kept apart",
			o.ProxyMode, o.ProxyModeSetting, o.KubeProxyMode)
	}
}
