// Command kubeadmproxy prints the kube-proxy objects (ServiceAccount, RBAC,
// the kube-proxy ConfigMap and DaemonSet) exactly as kubeadm of the pinned
// Kubernetes release makes them on `kubeadm init`, by kubeadm's own code:
// the cluster test and the configuration tests read kubeadm's ConfigMap
// from its output instead of a hand-written copy, so that a new release's
// change of what kubeadm writes (1.37's explicit "mode: iptables") reaches
// the tests when the version is bumped (make kubeadm-proxy-config).
//
// The cluster is the test address plan's: pods 10.244.0.0/16, Services
// 10.96.0.0/16, the API server at -endpoint.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"k8s.io/kubernetes/cmd/kubeadm/app/phases/addons/proxy"
	configutil "k8s.io/kubernetes/cmd/kubeadm/app/util/config"
)

func main() {
	endpoint := flag.String("endpoint", "192.168.77.1:6443", "the control plane endpoint (host:port) kubeadm's kubeconfig names")
	version := flag.String("kubernetes-version", "", "the Kubernetes version kubeadm is told (default: its own)")
	configOnly := flag.Bool("config-only", false, "print only the ConfigMap's config.conf, the KubeProxyConfiguration kube-proxy's --config reads")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "kubeadmproxy: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	if err := run(*endpoint, *version, *configOnly); err != nil {
		fmt.Fprintln(os.Stderr, "kubeadmproxy:", err)
		os.Exit(1)
	}
}

func run(endpoint, version string, configOnly bool) error {
	doc := fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: 192.0.2.1
  bindPort: 6443
nodeRegistration:
  name: control-plane
  criSocket: unix:///run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
controlPlaneEndpoint: %q
networking:
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/16
`, endpoint)
	if version != "" {
		doc += "kubernetesVersion: " + version + "\n"
	}
	cfg, err := configutil.BytesToInitConfiguration([]byte(doc), true)
	if err != nil {
		return fmt.Errorf("kubeadm's configuration: %w", err)
	}
	// printManifest: nothing is sent anywhere, the objects are printed.
	var out bytes.Buffer
	if err := proxy.EnsureProxyAddon(&cfg.ClusterConfiguration, &cfg.LocalAPIEndpoint, nil, "", &out, true); err != nil {
		return err
	}
	if !configOnly {
		_, err := os.Stdout.Write(out.Bytes())
		return err
	}
	for _, doc := range strings.Split(out.String(), "\n---\n") {
		var cm v1.ConfigMap
		if yaml.Unmarshal([]byte(doc), &cm) != nil || cm.Kind != "ConfigMap" {
			continue
		}
		if c, ok := cm.Data["config.conf"]; ok {
			_, err := fmt.Println(c)
			return err
		}
	}
	return fmt.Errorf("no ConfigMap with config.conf among kubeadm's objects")
}
