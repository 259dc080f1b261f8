package cluster_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// envHelm is the Helm command (make helm builds it from its Go module),
// which installs the chart of deploy/helm in the chart step.
const envHelm = "EBPF_PROXY_CLUSTER_HELM"

// chartManaged are the objects of deploy/ that the chart takes over.
var chartManaged = []string{"daemonset/ebpf-proxy", "serviceaccount/ebpf-proxy", "clusterrole/ebpf-proxy", "clusterrolebinding/ebpf-proxy"}

// helm runs the Helm command as the cluster's admin, with its own
// directories (the guest's view of this machine is read-only), and returns
// its standard output.
func (e *env) helm(helmBin, kubeconfig string, args ...string) (string, error) {
	home := e.t.TempDir()
	cmd := exec.CommandContext(e.ctx, helmBin, append(args, "--kubeconfig", kubeconfig)...)
	cmd.Env = append(cmd.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// agentPods returns the UIDs of the agent's pods, in name order.
func (e *env) agentPods() string {
	return e.kubectl("", "-n", "kube-system", "get", "pods", "-l", "k8s-app=ebpf-proxy",
		"--sort-by=.metadata.name", "-o", "jsonpath={.items[*].metadata.uid}")
}

// adoptByChart moves the kustomize install to the Helm chart as
// docs/INSTALL.md ("With Helm") says: deploy/'s objects marked as the
// release's, then `helm install` of deploy/helm/ebpf-proxy with image,
// the agent's image now. With the chart's default values the pods are
// the kustomize ones': the DaemonSet's spec must not change, nor its pods
// restart, and the release must be deployed, owning the objects.
func (e *env) adoptByChart(deployDir, helmBin, kubeconfig, image string) {
	e.t.Helper()
	name, tag, ok := strings.Cut(image, ":")
	if !ok {
		e.fatalf("agent image %q has no tag", image)
	}
	pods := e.agentPods()
	generation := e.kubectl("", "-n", "kube-system", "get", "daemonset/ebpf-proxy", "-o", "jsonpath={.metadata.generation}")
	for _, o := range chartManaged {
		e.kubectl("", "-n", "kube-system", "label", "--overwrite", o, "app.kubernetes.io/managed-by=Helm")
		e.kubectl("", "-n", "kube-system", "annotate", "--overwrite", o,
			"meta.helm.sh/release-name=ebpf-proxy", "meta.helm.sh/release-namespace=kube-system")
	}
	out, err := e.helm(helmBin, kubeconfig, "install", "ebpf-proxy", filepath.Join(deployDir, "helm", "ebpf-proxy"),
		"--namespace", "kube-system", "--set", "image.repository="+name, "--set", "image.tag="+tag)
	if err != nil {
		e.fatalf("the chart did not install over deploy/'s objects: %v\n%s", err, out)
	}
	e.rollout("daemonset/ebpf-proxy", "kube-system")
	e.check("the chart takes deploy/'s objects over: the release is deployed and owns them", func() error {
		out, err := e.helm(helmBin, kubeconfig, "status", "ebpf-proxy", "--namespace", "kube-system", "-o", "json")
		if err != nil {
			return err
		}
		var st struct {
			Info struct {
				Status string `json:"status"`
			} `json:"info"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return fmt.Errorf("helm status: %w", err)
		}
		if st.Info.Status != "deployed" {
			return fmt.Errorf("the release is %q, want deployed", st.Info.Status)
		}
		for _, o := range chartManaged {
			if v := e.kubectl("", "-n", "kube-system", "get", o, "-o", `jsonpath={.metadata.labels.helm\.sh/chart}`); v == "" {
				return fmt.Errorf("%s has no helm.sh/chart label: the chart's objects did not replace it", o)
			}
		}
		return nil
	})
	e.check("the chart's DaemonSet is deploy/'s: its spec unchanged, no agent pod restarted", func() error {
		if g := e.kubectl("", "-n", "kube-system", "get", "daemonset/ebpf-proxy", "-o", "jsonpath={.metadata.generation}"); g != generation {
			return fmt.Errorf("the DaemonSet's generation went from %s to %s: the chart changed its spec", generation, g)
		}
		if now := e.agentPods(); now != pods {
			return fmt.Errorf("the agent's pods were %s, are %s", pods, now)
		}
		return nil
	})
}
