package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/interrupt"
)

// Kind names a proxy under test.
type Kind string

// The proxies a node can run.
const (
	// KubeProxyIPTables is upstream kube-proxy in iptables mode, the
	// reference.
	KubeProxyIPTables Kind = "iptables"
	// KubeProxyNFTables is upstream kube-proxy in nftables mode.
	KubeProxyNFTables Kind = "nftables"
	// EbpfProxy is the agent under test, in its BPF mode.
	EbpfProxy Kind = "ebpf"
	// EbpfProxyIPTables is the agent in its iptables fallback mode
	// (--proxy-mode=iptables), with upstream's settings for it: the
	// cluster CIDR and the node's IP as its NodePort address.
	EbpfProxyIPTables Kind = "ebpf-iptables"
	// EbpfProxyNFTables is the agent in its nftables fallback mode
	// (--proxy-mode=nftables), with the same settings.
	EbpfProxyNFTables Kind = "ebpf-nftables"
	// EbpfProxyPods is the agent in its BPF mode translating only the
	// node's own sockets (--socket-lb-scope=node): pods' packets are
	// translated at their devices.
	EbpfProxyPods Kind = "ebpf-pods"
)

// Upstream reports whether k is upstream kube-proxy.
func (k Kind) Upstream() bool { return k == KubeProxyIPTables || k == KubeProxyNFTables }

// Agent reports whether k is ebpf-proxy, in any mode.
func (k Kind) Agent() bool {
	return k == EbpfProxy || k == EbpfProxyIPTables || k == EbpfProxyNFTables || k == EbpfProxyPods
}

// Addresses the proxies serve on inside their node's namespace.
const (
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
)

// Bounds for starting and stopping proxies; both take well under a second
// on an idle machine, the bounds cover a busy shared one.
const (
	firstSyncTimeout = 2 * time.Minute
	stopGrace        = 10 * time.Second
)

// ProxyOptions say how to run a proxy.
type ProxyOptions struct {
	// Kind is the proxy to run.
	Kind Kind
	// Kubeconfig is the identity the proxy runs as; empty means the
	// cluster's system:kube-proxy user, upstream's own identity.
	Kubeconfig string
	// LegacyIPTables puts iptables-legacy first in kube-proxy's PATH
	// instead of the system's iptables (iptables-nft on Debian), which is
	// what makes iptables mode usable at 10,000 Services.
	LegacyIPTables bool
	// FeatureGates are passed to upstream kube-proxy.
	FeatureGates map[string]bool
	// Verbosity is the log level (-v); 0 means 2 for kube-proxy (a line per
	// sync) and 2 for ebpf-proxy.
	Verbosity int
	// Args are appended to the proxy's command line.
	Args []string
	// NoWait returns as soon as the process started, without waiting for
	// its first sync (for a proxy started before the API server).
	NoWait bool
}

// Proxy is a proxy process running in a node's network namespace.
type Proxy struct {
	// Kind is the proxy that runs.
	Kind Kind
	// Node is the node it runs on.
	Node *Node
	// BPFFS is ebpf-proxy's pin directory (its --bpffs-path).
	BPFFS string

	proc    *agent.Process
	dir     string
	mem     *MemoryCgroup
	cleaned bool
}

// StartProxy starts a proxy on node n and, unless opts.NoWait, waits for its
// first sync (kubeproxy_sync_proxy_rules_last_timestamp_seconds set). The
// proxy is stopped in t.Cleanup, with the testbed, and on SIGINT or
// SIGTERM; if the test failed, the end of its log is printed.
//
// Upstream kube-proxy runs with the settings of the notes in
// ../shared/notes: a KubeProxyConfiguration with conntrack.maxPerCore 0
// (nf_conntrack_max is global and not writable from a namespace),
// clusterCIDR 10.244.0.0/16, nodePortAddresses the node's IP, metrics and
// healthz bound inside the namespace. ebpf-proxy attaches to the node's
// cgroup and pins under the sandbox's bpffs.
//
// Every proxy runs in a memory cgroup of its own (NewMemoryCgroup), from
// before its first instruction, with whatever it starts, its binary out of
// the page cache (EvictPageCache): MemoryPeak reads what it cost the
// node, kernel memory included. Without a memory cgroup to make,
// StartProxy fails.
func (tb *Testbed) StartProxy(t testing.TB, n *Node, opts ProxyOptions) *Proxy {
	t.Helper()
	p, err := tb.startProxy(t, n, opts)
	if err != nil {
		t.Fatalf("start %s proxy on %s: %v", opts.Kind, n.Spec.Name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of the %s proxy log on %s:\n%s", p.Kind, n.Spec.Name, p.LogTail(40))
		}
		if err := p.Stop(); err != nil {
			t.Errorf("stop %s proxy on %s: %v", p.Kind, n.Spec.Name, err)
		}
	})
	if !opts.NoWait {
		ctx, cancel := context.WithTimeout(context.Background(), firstSyncTimeout)
		defer cancel()
		if err := p.WaitFirstSync(ctx); err != nil {
			t.Fatalf("%s proxy on %s: %v\nlast lines of its log:\n%s", p.Kind, n.Spec.Name, err, p.LogTail(40))
		}
	}
	return p
}

func (tb *Testbed) startProxy(t testing.TB, n *Node, opts ProxyOptions) (_ *Proxy, err error) {
	kubeconfig := opts.Kubeconfig
	if kubeconfig == "" {
		kubeconfig = tb.Cluster.KubeProxyKubeconfig()
	}
	dir, err := os.MkdirTemp("", "ebpf-proxy-e2e-proxy-")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Kind: opts.Kind, Node: n, dir: dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, os.RemoveAll(dir))
			if p.mem != nil {
				err = errors.Join(err, p.mem.Remove())
			}
		}
	}()
	var bin string
	var args, env []string
	switch opts.Kind {
	case KubeProxyIPTables, KubeProxyNFTables:
		bin = tb.Cluster.Binaries().KubeProxy
		cfg := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(cfg, []byte(kubeProxyConfig(n, opts, kubeconfig)), 0o600); err != nil {
			return nil, err
		}
		v := opts.Verbosity
		if v == 0 {
			v = 2
		}
		args = []string{"--config=" + cfg, "--hostname-override=" + n.Spec.Name, "--v=" + strconv.Itoa(v)}
		path := os.Getenv("PATH")
		if opts.LegacyIPTables {
			legacy, err := legacyIPTablesDir(dir)
			if err != nil {
				return nil, err
			}
			path = legacy + ":" + path
		}
		// The xtables lock guards a namespace's tables, but its file is
		// global: a private one keeps this node's proxy from waiting on
		// every other iptables user of the machine.
		env = append(env, "PATH="+path, "XTABLES_LOCKFILE="+filepath.Join(dir, "xtables.lock"))
	case EbpfProxy, EbpfProxyIPTables, EbpfProxyNFTables, EbpfProxyPods:
		if bin, err = agent.Binary(); err != nil {
			return nil, err
		}
		p.BPFFS = filepath.Join(tb.Sandbox.BPFFS.Path(), n.Spec.Name)
		v := opts.Verbosity
		if v == 0 {
			v = 2
		}
		args = []string{
			"--kubeconfig=" + kubeconfig,
			"--hostname-override=" + n.Spec.Name,
			"--cgroup-path=" + n.Cgroup.Path(),
			"--bpffs-path=" + p.BPFFS,
			"--api-socket=" + filepath.Join(dir, "agent.sock"),
			"--metrics-bind-address=" + metricsAddr,
			"--healthz-bind-address=" + healthzAddr,
			// As upstream's configuration below.
			"--nodeport-addresses=" + n.IP.String() + "/32," + n.IP6.String() + "/128," + localhostPrefix,
			"-v=" + strconv.Itoa(v),
		}
		switch opts.Kind {
		case EbpfProxy:
			// Never a silent fallback: the BPF mode or an error.
			args = append(args, "--proxy-mode=ebpf")
		case EbpfProxyPods:
			args = append(args, "--proxy-mode=ebpf", "--socket-lb-scope=node")
		case EbpfProxyNFTables:
			args = append(args, "--proxy-mode=nftables", "--cluster-cidr="+ClusterCIDRs)
		default:
			args = append(args, "--proxy-mode=iptables", "--cluster-cidr="+ClusterCIDRs)
		}
	default:
		return nil, fmt.Errorf("unknown proxy kind %q", opts.Kind)
	}
	args = append(args, opts.Args...)

	if p.mem, err = NewMemoryCgroup(string(opts.Kind)); err != nil {
		return nil, err
	}
	// The programs and shared libraries the proxy runs besides its binary
	// (iptables-restore, nft) are small, and charged to it only if not
	// cached already.
	if err := EvictPageCache(bin); err != nil {
		return nil, err
	}
	bin, args = p.mem.Wrap(bin, args...)
	// Its own process group: a Ctrl-C at the terminal reaches only the test
	// binary, whose interrupt handler stops the proxy.
	proc, err := agent.Start(agent.Options{Name: string(opts.Kind) + " proxy", Bin: bin, Args: args, Env: env,
		Netns: n.NS.Path(), LogPath: filepath.Join(dir, "proxy.log"), Setpgid: true})
	if err != nil {
		return nil, err
	}
	p.proc = proc
	tb.mu.Lock()
	tb.proxies = append(tb.proxies, p)
	tb.mu.Unlock()
	unregister := interrupt.Register(func() { _ = p.Stop() })
	go func() {
		<-proc.Exited()
		unregister()
	}()
	return p, nil
}

// localhostPrefix is among every proxy's NodePort addresses, besides the
// node's own: kube-proxy's iptables mode then serves NodePorts on 127.0.0.1
// to the node's own processes (setting route_localnet in the node's
// namespace only), its nftables mode does not, and the scenarios compare.
const localhostPrefix = "127.0.0.1/32"

// kubeProxyConfig renders upstream kube-proxy's configuration file.
func kubeProxyConfig(n *Node, opts ProxyOptions, kubeconfig string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
  contentType: application/vnd.kubernetes.protobuf
hostnameOverride: %q
mode: %q
clusterCIDR: %q
detectLocalMode: ClusterCIDR
nodePortAddresses: [%q, %q, %q]
metricsBindAddress: %q
healthzBindAddress: %q
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
iptables:
  minSyncPeriod: 1s
  syncPeriod: 30s
nftables:
  minSyncPeriod: 1s
  syncPeriod: 30s
`, kubeconfig, n.Spec.Name, string(opts.Kind), ClusterCIDRs, n.IP.String()+"/32", n.IP6.String()+"/128", localhostPrefix, metricsAddr, healthzAddr)
	if len(opts.FeatureGates) > 0 {
		b.WriteString("featureGates:\n")
		names := make([]string, 0, len(opts.FeatureGates))
		for k := range opts.FeatureGates {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Fprintf(&b, "  %s: %t\n", k, opts.FeatureGates[k])
		}
	}
	return b.String()
}

// legacyIPTablesDir makes a directory of iptables commands that run
// iptables-legacy, for the front of kube-proxy's PATH.
func legacyIPTablesDir(dir string) (string, error) {
	multi, err := exec.LookPath("xtables-legacy-multi")
	if err != nil {
		return "", fmt.Errorf("iptables-legacy is not installed: %w", err)
	}
	bin := filepath.Join(dir, "legacy-bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		if err := os.Symlink(multi, filepath.Join(bin, name)); err != nil {
			return "", err
		}
	}
	return bin, nil
}

// PID is the proxy's process ID.
func (p *Proxy) PID() int { return p.proc.PID() }

// Started is when the proxy process was started.
func (p *Proxy) Started() time.Time { return p.proc.Started() }

// Running reports whether the proxy process has not exited.
func (p *Proxy) Running() bool { return p.proc.Running() }

// ExitError says how the proxy ended, or nil while it runs.
func (p *Proxy) ExitError() error { return p.proc.ExitError() }

// Exited is closed once the proxy process has exited.
func (p *Proxy) Exited() <-chan struct{} { return p.proc.Exited() }

// Log returns the proxy's output so far.
func (p *Proxy) Log() string { return p.proc.Logs() }

// LogTail returns the last n lines of the proxy's output.
func (p *Proxy) LogTail(n int) string { return p.proc.LogTail(n) }

// Get fetches path from the proxy's metrics server inside its node's
// namespace and returns the body of a 200 answer.
func (p *Proxy) Get(ctx context.Context, path string) ([]byte, error) {
	code, body, err := p.proc.Get(ctx, "http://"+metricsAddr+path)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s: %s", path, code, http.StatusText(code), bytes.TrimSpace(body))
	}
	return body, nil
}

// Metrics scrapes the proxy's /metrics inside its node's namespace.
func (p *Proxy) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	fams, err := p.proc.Metrics(ctx, "http://"+metricsAddr+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape %s proxy on %s: %w", p.Kind, p.Node.Spec.Name, err)
	}
	return fams, nil
}

// Healthz fetches path (/healthz or /livez) from the proxy's health server
// and returns the status code.
func (p *Proxy) Healthz(ctx context.Context, path string) (int, error) {
	code, _, err := p.proc.Get(ctx, "http://"+healthzAddr+path)
	return code, err
}

// Gauge returns the value of the gauge (or counter) name summed over its
// label sets that carry every label of match (nil matches all), and whether
// the metric was present.
func Gauge(fams map[string]*dto.MetricFamily, name string, match map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	var sum float64
	for _, m := range f.GetMetric() {
		if !hasLabels(m, match) {
			continue
		}
		switch {
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, true
}

// Histogram returns the sample count and sum of the histogram name over its
// label sets that carry every label of match (nil matches all).
func Histogram(fams map[string]*dto.MetricFamily, name string, match map[string]string) (count uint64, sum float64, ok bool) {
	f, ok := fams[name]
	if !ok {
		return 0, 0, false
	}
	for _, m := range f.GetMetric() {
		if !hasLabels(m, match) {
			continue
		}
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum, true
}

func hasLabels(m *dto.Metric, match map[string]string) bool {
	found := 0
	for _, lp := range m.GetLabel() {
		if v, ok := match[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(match)
}

// IPv4 selects the IPv4 series of a proxy's metrics. Upstream kube-proxy
// also runs an IPv6 proxier, whose (empty) syncs it records under the same
// names with ip_family="IPv6"; the testbed is IPv4.
var IPv4 = map[string]string{"ip_family": "IPv4"}

// LastSync returns kubeproxy_sync_proxy_rules_last_timestamp_seconds of the
// IPv4 proxier, the end of its last successful sync; zero before the first.
func (p *Proxy) LastSync(ctx context.Context) (time.Time, error) {
	fams, err := p.Metrics(ctx)
	if err != nil {
		return time.Time{}, err
	}
	v, _ := Gauge(fams, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", IPv4)
	if v == 0 {
		return time.Time{}, nil
	}
	return time.Unix(0, int64(v*1e9)), nil
}

// WaitFirstSync waits until the proxy reports a successful sync, failing
// early if it exits.
func (p *Proxy) WaitFirstSync(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if err := p.ExitError(); err != nil {
			return err
		}
		ts, err := p.LastSync(ctx)
		if err == nil && !ts.IsZero() {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("no first sync: %w (last scrape: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// PeakRSS returns the proxy's peak resident set size (VmHWM) in bytes.
func (p *Proxy) PeakRSS() (uint64, error) {
	u, err := p.Usage()
	return u.PeakRSS, err
}

// Usage returns what the proxy holds of the node's resources now.
func (p *Proxy) Usage() (Usage, error) { return ProcessUsage(p.PID()) }

// MemoryPeak returns the peak of the proxy's memory cgroup so far: its
// pages, its children's, and the kernel memory they caused. It fails once
// the proxy has been stopped.
func (p *Proxy) MemoryPeak() (MemoryPeak, error) { return p.mem.Peak() }

// Dump runs `ebpf-proxy dump` on the proxy's pins.
func (p *Proxy) Dump() (string, error) {
	if p.Kind != EbpfProxy {
		return "", fmt.Errorf("dump: %s is not ebpf-proxy in BPF mode", p.Kind)
	}
	return agent.Dump(p.BPFFS)
}

// Stop stops the proxy (SIGTERM, SIGKILL after 10 s) and removes what it
// left: ebpf-proxy's pinned programs and maps and its rules
// (`ebpf-proxy --cleanup` in the node's namespace), then its memory cgroup,
// its files. kube-proxy's rules go with the node's namespace. Stop is
// idempotent.
func (p *Proxy) Stop() error {
	var errs []error
	if err := p.proc.Stop(stopGrace); err != nil {
		errs = append(errs, err)
	}
	if p.Kind.Agent() && p.BPFFS != "" && !p.cleaned {
		if _, err := agent.Cleanup(context.Background(), p.Node.NS.Path(), p.BPFFS); err != nil {
			errs = append(errs, err)
		} else {
			p.cleaned = true
		}
	}
	// After the cleanup: the pins it removed were what kept the maps,
	// charged to this cgroup, alive.
	if err := p.mem.Remove(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(p.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// stopProxies stops every proxy the testbed started.
func (tb *Testbed) stopProxies() {
	tb.mu.Lock()
	ps := tb.proxies
	tb.proxies = nil
	tb.mu.Unlock()
	for _, p := range ps {
		_ = p.Stop()
	}
}
