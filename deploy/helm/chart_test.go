// Package helm_test checks the Helm chart in ebpf-proxy/ with the Helm
// command (built from its Go module by `make chart-check`): it lints, its
// default values render the objects of `kubectl kustomize deploy/`, and
// what its values set reaches the agent as the agent reads it.
package helm_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
)

const (
	chartDir = "ebpf-proxy"
	// helmEnv and kubectlEnv name the commands' paths; with requireEnv
	// set (make chart-check sets all three), a test fails rather than
	// skips without them.
	helmEnv    = "EBPF_PROXY_HELM"
	kubectlEnv = "EBPF_PROXY_KUBECTL"
	requireEnv = "EBPF_PROXY_REQUIRE_CHART_TOOLS"
)

func tool(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		if os.Getenv(requireEnv) != "" {
			t.Fatalf("%s is not set: `make chart-check` builds Helm and kubectl and sets it", env)
		}
		t.Skipf("%s is not set: `make chart-check` runs this", env)
	}
	return p
}

// run runs a command and returns its standard output.
func run(t *testing.T, name string, args ...string) ([]byte, error) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, errb.String())
	}
	return out.Bytes(), err
}

// values writes Helm values to a file and returns its path.
func values(t *testing.T, v string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// render is `helm template` of the chart into kube-system with the values
// files given.
func render(t *testing.T, valueFiles ...string) (objects, error) {
	t.Helper()
	args := []string{"template", "ebpf-proxy", chartDir, "--namespace", "kube-system"}
	for _, f := range valueFiles {
		args = append(args, "--values", f)
	}
	out, err := run(t, tool(t, helmEnv), args...)
	if err != nil {
		return nil, err
	}
	return parse(t, out), nil
}

// objects are rendered objects by "Kind namespace/name".
type objects map[string]map[string]any

func parse(t *testing.T, multi []byte) objects {
	t.Helper()
	objs := objects{}
	for _, doc := range strings.Split(string(multi), "\n---") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("parse rendered object: %v\n%s", err, doc)
		}
		if o == nil {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%v %v/%v", o["kind"], md["namespace"], md["name"])
		if _, dup := objs[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		objs[key] = o
	}
	return objs
}

func (objs objects) keys() []string {
	var ks []string
	for k := range objs {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func (objs objects) get(t *testing.T, key string) map[string]any {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("no %s among the rendered objects %v", key, objs.keys())
	}
	return o
}

// at follows a path of map keys and list indices through o.
func at(t *testing.T, o any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := o.(map[string]any)
			if !ok {
				t.Fatalf("%v: not a map at %q", path, k)
			}
			o = m[k]
		case int:
			l, ok := o.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("%v: no item %d", path, k)
			}
			o = l[k]
		}
	}
	return o
}

func TestChartLints(t *testing.T) {
	helm := tool(t, helmEnv)
	for name, v := range map[string]string{
		"default values": "",
		"everything set": everything,
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			if v != "" {
				args = append(args, "--values", values(t, v))
			}
			if out, err := run(t, helm, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// helmLabels are the labels the chart adds to every object's metadata,
// which deploy/ has no use for: the only difference the defaults make.
var helmLabels = []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
	"app.kubernetes.io/managed-by", "helm.sh/chart"}

// TestDefaultsRenderTheKustomizeObjects: with its default values the
// chart renders, into kube-system, the very objects of `kubectl kustomize
// deploy/`, but for Helm's own labels; so that either way installs the
// same agent, and a chart's DaemonSet keeps the selector of a kustomize
// one.
func TestDefaultsRenderTheKustomizeObjects(t *testing.T) {
	kubectl := tool(t, kubectlEnv)
	chart, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, kubectl, "kustomize", "../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	kust := parse(t, out)
	if !slices.Equal(chart.keys(), kust.keys()) {
		t.Fatalf("the chart renders %v; kustomize %v", chart.keys(), kust.keys())
	}
	for key, o := range chart {
		md := o["metadata"].(map[string]any)
		if labels, ok := md["labels"].(map[string]any); ok {
			for _, l := range helmLabels {
				if _, ok := labels[l]; !ok {
					t.Errorf("%s: no label %s", key, l)
				}
				delete(labels, l)
			}
			if len(labels) == 0 {
				delete(md, "labels")
			}
		}
		if !reflect.DeepEqual(o, kust[key]) {
			a, _ := yaml.Marshal(o)
			b, _ := yaml.Marshal(kust[key])
			t.Errorf("%s differs from kustomize's:\nchart:\n%s\nkustomize:\n%s", key, a, b)
		}
	}
}

// everything sets every value the chart has.
const everything = `
image: {repository: registry.example/ebpf-proxy, tag: "1.2.3", pullPolicy: Always}
proxyMode: nftables
devices: [eth0, cni0]
xdp: generic
socketLBScope: node
bpfMaps:
  dynamicSizeRatio: "0.005"
  servicesMax: 300000
  backendsMax: 400000
  revNatMax: 70000
  sockRevNatMax: 80000
  conntrackMax: 500000
  affinityMax: 90000
extraArgs: ["--lb-algorithm=maglev", "--v=2"]
kubeProxyConfig:
  existingConfigMap: ""
  apiServer: https://192.0.2.10:6443
  configuration:
    metricsBindAddress: 0.0.0.0:10249
    clusterCIDR: 10.244.0.0/16
    clientConnection: {qps: 20}
goMemLimit: 3000MiB
resources:
  requests: {cpu: 200m, memory: 512Mi}
  limits: {memory: 4Gi}
tolerations: [{key: dedicated, operator: Equal, value: edge, effect: NoSchedule}]
nodeSelector: {kubernetes.io/os: linux}
priorityClassName: system-cluster-critical
podAnnotations: {team: net}
podLabels: {tier: node}
metrics:
  service: {enabled: true, port: 10249}
  serviceMonitor: {enabled: true, interval: 30s, labels: {release: prom}}
  prometheusRule: {enabled: true, labels: {release: prom}}
`

// TestValuesReachTheAgent: what the values set is what the agent reads,
// parsed by its own flag and configuration code: the mode, devices, XDP,
// map sizes, extra flags, and kube-proxy's configuration from the chart's
// own ConfigMap with its kubeconfig to the API server; and the pod's image,
// resources, Go memory limit and placement.
func TestValuesReachTheAgent(t *testing.T) {
	objs, err := render(t, values(t, everything))
	if err != nil {
		t.Fatal(err)
	}
	ds := objs.get(t, "DaemonSet kube-system/ebpf-proxy")
	c := at(t, ds, "spec", "template", "spec", "containers", 0)
	if img := at(t, c, "image"); img != "registry.example/ebpf-proxy:1.2.3" {
		t.Errorf("image %v", img)
	}
	cm := objs.get(t, "ConfigMap kube-system/ebpf-proxy-config")
	if v := at(t, ds, "spec", "template", "spec", "volumes", 0, "configMap", "name"); v != "ebpf-proxy-config" {
		t.Errorf("the kube-proxy volume is ConfigMap %v, want the chart's ebpf-proxy-config", v)
	}
	// The ConfigMap as mounted, and the kubeconfig it names there.
	dir := t.TempDir()
	for _, f := range []string{"config.conf", "kubeconfig.conf"} {
		text := at(t, cm, "data", f).(string)
		text = strings.ReplaceAll(text, "/var/lib/kube-proxy/", dir+"/")
		if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var args []string
	for _, a := range at(t, c, "command").([]any)[1:] {
		args = append(args, strings.ReplaceAll(a.(string), "/var/lib/kube-proxy/", dir+"/"))
	}
	o := config.Defaults()
	fs := pflag.NewFlagSet("ebpf-proxy", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the agent's flags refuse the chart's %v: %v", args, err)
	}
	if _, err := config.FinishFlags(o, fs); err != nil {
		t.Fatalf("the agent refuses the chart's configuration: %v", err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("the agent refuses the chart's settings: %v", err)
	}
	want := map[string]any{
		"mode": "nftables", "devices": []string{"eth0", "cni0"}, "xdp": "generic", "socket-lb-scope": "node",
		"dynamic size ratio": 0.005, "services": uint32(300000), "backends": uint32(400000), "revnat": uint32(70000),
		"sock-revnat": uint32(80000), "conntrack": uint32(500000), "affinity": uint32(90000),
		"lb-algorithm": "maglev", "metrics": "0.0.0.0:10249", "kubeconfig": filepath.Join(dir, "kubeconfig.conf"),
	}
	got := map[string]any{
		"mode": o.ProxyMode, "devices": o.Devices, "xdp": o.XDP, "socket-lb-scope": o.SocketLBScope,
		"dynamic size ratio": o.MapMemoryRatio, "services": o.MapSizes.Services, "backends": o.MapSizes.Backends,
		"revnat": o.MapSizes.RevNat, "sock-revnat": o.MapSizes.SockRevNat, "conntrack": o.ConntrackSize,
		"affinity": o.MapSizes.Affinity, "lb-algorithm": o.LBAlgorithm, "metrics": o.MetricsBindAddress,
		"kubeconfig": o.Kubeconfig,
	}
	for k, w := range want {
		if !reflect.DeepEqual(got[k], w) {
			t.Errorf("%s: the agent reads %#v, want %#v", k, got[k], w)
		}
	}
	kc, err := clientcmd.LoadFromFile(filepath.Join(dir, "kubeconfig.conf"))
	if err != nil {
		t.Fatal(err)
	}
	// What client-go takes from it (the files are the pod's, not here).
	ctx, ok := kc.Contexts[kc.CurrentContext]
	if !ok || kc.Clusters[ctx.Cluster] == nil || kc.AuthInfos[ctx.AuthInfo] == nil {
		t.Fatalf("the chart's kubeconfig has no current context with a cluster and a user: %+v", kc)
	}
	cl, user := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]
	if cl.Server != "https://192.0.2.10:6443" || user.TokenFile != "/var/run/secrets/kubernetes.io/serviceaccount/token" ||
		cl.CertificateAuthority != "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" {
		t.Errorf("the chart's kubeconfig reaches %s with token %s and CA %s; want the API server's address with the service account's",
			cl.Server, user.TokenFile, cl.CertificateAuthority)
	}

	pod := at(t, ds, "spec", "template")
	for _, check := range []struct {
		what string
		got  any
		want string
	}{
		{"GOMEMLIMIT", at(t, c, "env", 1), `{"name":"GOMEMLIMIT","value":"3000MiB"}`},
		{"resources", at(t, c, "resources"), `{"limits":{"memory":"4Gi"},"requests":{"cpu":"200m","memory":"512Mi"}}`},
		{"pull policy", at(t, c, "imagePullPolicy"), `"Always"`},
		{"tolerations", at(t, pod, "spec", "tolerations"), `[{"effect":"NoSchedule","key":"dedicated","operator":"Equal","value":"edge"}]`},
		{"node selector", at(t, pod, "spec", "nodeSelector"), `{"kubernetes.io/os":"linux"}`},
		{"priority class", at(t, pod, "spec", "priorityClassName"), `"system-cluster-critical"`},
		{"pod labels", at(t, pod, "metadata", "labels"), `{"k8s-app":"ebpf-proxy","tier":"node"}`},
		{"pod annotations", at(t, pod, "metadata", "annotations"), `{"team":"net"}`},
	} {
		if b, _ := yaml.Marshal(check.got); !jsonEqual(t, b, check.want) {
			t.Errorf("%s: %s, want %s", check.what, b, check.want)
		}
	}
}

// jsonEqual says whether YAML document y says what JSON document j does.
func jsonEqual(t *testing.T, y []byte, j string) bool {
	t.Helper()
	var a, b any
	if err := yaml.Unmarshal(y, &a); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(j), &b); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(a, b)
}

// TestMonitoringObjects: the metrics Service selects the agent's pods and
// their metrics port under the job name the alert rules expect, the
// ServiceMonitor selects the Service, and the PrometheusRule holds the
// rules of deploy/monitoring/alerts.yaml, of which the chart keeps a copy.
func TestMonitoringObjects(t *testing.T) {
	objs, err := render(t, values(t, everything))
	if err != nil {
		t.Fatal(err)
	}
	ds := objs.get(t, "DaemonSet kube-system/ebpf-proxy")
	svc := objs.get(t, "Service kube-system/ebpf-proxy")
	sm := objs.get(t, "ServiceMonitor kube-system/ebpf-proxy")
	rule := objs.get(t, "PrometheusRule kube-system/ebpf-proxy")
	podLabels := at(t, ds, "spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range at(t, svc, "spec", "selector").(map[string]any) {
		if podLabels[k] != v {
			t.Errorf("the Service selects %s=%v, which the agent's pods (%v) lack", k, v, podLabels)
		}
	}
	if tp := at(t, svc, "spec", "ports", 0, "targetPort"); tp != "metrics" || at(t, ds, "spec", "template", "spec", "containers", 0, "ports", 0, "name") != "metrics" {
		t.Errorf("the Service's target port %v is not the agent's metrics port", tp)
	}
	svcLabels := at(t, svc, "metadata", "labels").(map[string]any)
	for k, v := range at(t, sm, "spec", "selector", "matchLabels").(map[string]any) {
		if svcLabels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%v, which the Service (%v) lacks", k, v, svcLabels)
		}
	}
	if at(t, sm, "spec", "endpoints", 0, "port") != "metrics" || at(t, sm, "metadata", "labels", "release") != "prom" ||
		at(t, sm, "spec", "endpoints", 0, "interval") != "30s" {
		t.Errorf("ServiceMonitor spec %v", at(t, sm, "spec"))
	}
	// The job is the Service's name: the rules select job="ebpf-proxy".
	alerts, err := os.ReadFile("../monitoring/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(alerts), `job="`+at(t, svc, "metadata", "name").(string)+`"`) {
		t.Errorf("the alert rules do not select the job %v", at(t, svc, "metadata", "name"))
	}
	copied, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copied, alerts) {
		t.Errorf("%s/files/alerts.yaml is not deploy/monitoring/alerts.yaml: cp deploy/monitoring/alerts.yaml deploy/helm/%s/files/", chartDir, chartDir)
	}
	var groups map[string]any
	if err := yaml.Unmarshal(alerts, &groups); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(at(t, rule, "spec"), groups) {
		t.Errorf("the PrometheusRule's spec is not the rule groups of alerts.yaml")
	}
}

// TestOwnConfigMapNeedsTheAPIServer: without kube-proxy's ConfigMap the
// agent must be told the API server's address; the chart refuses to
// render without it, and says which value to set.
func TestOwnConfigMapNeedsTheAPIServer(t *testing.T) {
	_, err := render(t, values(t, "kubeProxyConfig: {existingConfigMap: \"\"}\n"))
	if err == nil || !strings.Contains(err.Error(), "kubeProxyConfig.apiServer") {
		t.Fatalf("rendered without the API server's address (%v); want an error naming kubeProxyConfig.apiServer", err)
	}
}
