package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/benchreport/figures"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// TestMain runs the NodePort benchmark's client or server when the binary was
// re-executed as one, else the benchmarks.
func TestMain(m *testing.M) {
	runRPSChild()
	testbed.Main(m)
}

// Settings, from the environment so that a slower machine can measure less.
const (
	envServices     = "EBPF_PROXY_BENCH_SERVICES"      // default 10000; 0 measures the proxies with the probe Service alone
	envEndpoints    = "EBPF_PROXY_BENCH_ENDPOINTS"     // per Service, default 10
	envChanges      = "EBPF_PROXY_BENCH_CHANGES"       // endpoint changes timed per proxy, default 100
	envChangeBudget = "EBPF_PROXY_BENCH_CHANGE_BUDGET" // time for them per proxy, default 10m
	envNewServices  = "EBPF_PROXY_BENCH_NEW_SERVICES"  // new Services timed per proxy, default 20, at most maxNewServices
	envKinds        = "EBPF_PROXY_BENCH_PROXIES"       // default "ebpf,iptables,nftables,ebpf-nftables"
	// envJSON names a file for the results as JSON (test/benchreport
	// reads it); unset writes none.
	envJSON = "EBPF_PROXY_BENCH_JSON"
	// envHeapProfile names a file for ebpf-proxy's heap profile (pprof),
	// taken once all Services are programmed, after a collection; unset
	// takes none.
	envHeapProfile = "EBPF_PROXY_BENCH_HEAP_PROFILE"
)

// benchKinds are the proxies the benchmark knows: upstream kube-proxy's
// iptables and nftables modes, and ebpf-proxy's BPF mode and fallbacks.
var benchKinds = []testbed.Kind{testbed.EbpfProxy, testbed.KubeProxyIPTables, testbed.KubeProxyNFTables,
	testbed.EbpfProxyNFTables, testbed.EbpfProxyIPTables}

type config struct {
	services, endpoints, changes int
	newServices                  int
	changeBudget                 time.Duration
	kinds                        []testbed.Kind
}

func configFromEnv() (config, error) {
	cfg := config{services: 10000, endpoints: 10, changes: 100, newServices: 20, changeBudget: 10 * time.Minute,
		kinds: benchKinds[:4]}
	if err := errors.Join(envInt(envServices, &cfg.services, 0, 1<<20), envInt(envEndpoints, &cfg.endpoints, 1, 1<<10),
		envInt(envChanges, &cfg.changes, 1, 1<<20), envInt(envNewServices, &cfg.newServices, 1, maxNewServices),
		envDuration(envChangeBudget, &cfg.changeBudget, 24*time.Hour)); err != nil {
		return cfg, err
	}
	if s := os.Getenv(envKinds); s != "" {
		cfg.kinds = nil
		for _, k := range strings.Split(s, ",") {
			kind := testbed.Kind(strings.TrimSpace(k))
			if !slices.Contains(benchKinds, kind) {
				return cfg, fmt.Errorf("%s: unknown proxy %q (known: %v)", envKinds, k, benchKinds)
			}
			cfg.kinds = append(cfg.kinds, kind)
		}
	}
	if cfg.services*cfg.endpoints > 1<<23 {
		return cfg, fmt.Errorf("%d endpoints do not fit the benchmark's 10.128.0.0/9", cfg.services*cfg.endpoints)
	}
	return cfg, nil
}

const (
	namespace  = "bench"
	loadWorker = 16
	// Bounds, not expectations: upstream's nftables mode took 85 s for its
	// first sync of 10,000 Services of two endpoints on this kind of machine.
	firstSyncBound = 30 * time.Minute
	changeBound    = 5 * time.Minute
)

// maxNewServices bounds the new Services per proxy: each proxy's have their
// own block of ClusterIPs (newServiceVIP).
const maxNewServices = 40

// newServiceVIP is the ClusterIP of the i-th new Service measured with the
// proxy of kind, from newServiceVIPBase on, a block of maxNewServices per
// proxy, so that the Services one proxy created are there, programmed and
// unused, when the next one starts.
//
// The block is in the lower band of the API server's Service range (the
// first 256 addresses of 10.96.0.0/16), which its allocator keeps for
// addresses a Service asks for and gives out dynamically only once the
// rest is full: the 10,000 or 30,000 Services created before take their
// addresses at random from the rest, and a fixed address there would be
// taken by one of them as often as not.
func newServiceVIP(kind testbed.Kind, i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(newServiceVIPBase + slices.Index(benchKinds, kind)*maxNewServices + i)}), 80)
}

// newServiceVIPBase is the last byte of the first new Service's ClusterIP,
// above 10.96.0.1 (the kubernetes Service) and 10.96.0.10 (a cluster's DNS
// by convention); 5 proxies' blocks end at 10.96.0.231.
const newServiceVIPBase = 32

// probeVIP is the ClusterIP of the one Service with real endpoints, whose
// endpoint the benchmark moves between two pods.
var probeVIP = netip.AddrPortFrom(netip.MustParseAddr("10.96.255.250"), 80)

// result is what one proxy did.
type result struct {
	kind testbed.Kind
	// startToSynced is from the process start to its first successful
	// sync: reading every object, then programming them.
	startToSynced time.Duration
	// firstSync is the duration of that sync as the proxy reports it
	// (kubeproxy_sync_proxy_rules_duration_seconds).
	firstSync time.Duration
	// programmed is ebpf-proxy's count of frontends in its maps, from
	// `ebpf-proxy dump`.
	programmed int
	rssSynced  uint64
	rssEnd     uint64
	// memSynced and memEnd are the peaks of the proxy's memory cgroup
	// (testbed.MemoryCgroup) at the same moments as rssSynced and rssEnd:
	// besides its pages, the kernel memory it caused, BPF maps or
	// netfilter rules and sets.
	memSynced, memEnd testbed.MemoryPeak
	// changes are the end-to-end latencies of the endpoint changes;
	// writes are the API calls' own durations within them.
	changes, writes []time.Duration
	// newServices are the latencies of new Services: from the Service's
	// create call (its EndpointSlice's follows) to the first connection
	// answered through its ClusterIP.
	newServices []time.Duration
	// partialSync is the mean duration of the proxy's syncs during the
	// changes, as it reports them (kubeproxy_sync_proxy_rules_duration_seconds).
	partialSync time.Duration
	note        string
}

// BenchmarkScale loads Services with endpoints through the API, then, for
// each proxy in turn on a fresh node: the time from its start until it has
// programmed them all, its peak RSS and the peak of its own memory cgroup
// (the kernel memory it caused included), and the latency of one endpoint
// change (from the API write to the first connection answered by the new
// endpoint, from a pod on the node), as p50 and p99 over the changes. The
// changes move the probe Service, which exists besides the Services
// loaded: a run of 0 Services measures each proxy with the probe alone.
// Run it with -benchtime 1x; it measures once whatever b.N is.
func BenchmarkScale(b *testing.B) {
	cfg, err := configFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	c := cluster.StartT(b, cluster.Options{})
	cs, err := protobufClient(c)
	if err != nil {
		b.Fatal(err)
	}
	if err := builders.CreateNamespace(b.Context(), cs, namespace); err != nil {
		b.Fatal(err)
	}
	loadStart := time.Now()
	if err := load(b.Context(), cs, cfg); err != nil {
		b.Fatal(err)
	}
	loadTime := time.Since(loadStart)
	b.Logf("loaded %d Services × %d endpoints through the API in %s", cfg.services, cfg.endpoints, loadTime.Round(time.Second))

	var results []result
	for _, kind := range cfg.kinds {
		b.Run(string(kind), func(b *testing.B) {
			r := measure(b, c, cs, kind, cfg)
			results = append(results, r)
			b.ReportMetric(r.startToSynced.Seconds(), "s-to-synced")
			b.ReportMetric(float64(r.rssSynced)/(1<<20), "MiB-peak-rss")
			b.ReportMetric(float64(r.memEnd.Bytes)/(1<<20), "MiB-cgroup-peak")
			if r.memEnd.HasKernel {
				b.ReportMetric(float64(r.memEnd.Kernel)/(1<<20), "MiB-cgroup-kmem-peak")
			}
			if len(r.changes) > 0 {
				b.ReportMetric(float64(percentile(r.changes, 50).Microseconds())/1000, "ms-change-p50")
				b.ReportMetric(float64(percentile(r.changes, 99).Microseconds())/1000, "ms-change-p99")
			}
			if len(r.newServices) > 0 {
				b.ReportMetric(float64(percentile(r.newServices, 99).Microseconds())/1000, "ms-new-service-p99")
			}
		})
	}
	table := summary(cfg, loadTime, results)
	b.Log("\n" + table)
	fmt.Println(table)
	printFigures(os.Stdout, cfg, results)
	if path := os.Getenv(envJSON); path != "" {
		if err := writeJSON(path, cfg, loadTime, results); err != nil {
			b.Fatal(err)
		}
	}
}

// printFigures prints the bench: lines of the figures this run measured:
// the BPF mode's peak RSS at 10,000 Services, its figures at 30,000, its
// memory cgroup's peak at 100, and that peak against upstream iptables'
// when both ran.
func printFigures(w io.Writer, cfg config, rs []result) {
	if cfg.endpoints != 10 {
		return
	}
	if ratio, ok := memVsIPTables(rs); ok {
		figures.Print(w, "mem_vs_iptables", ratio)
	}
	for _, r := range rs {
		if r.kind != testbed.EbpfProxy {
			continue
		}
		mib := float64(r.rssEnd) / (1 << 20)
		switch cfg.services {
		case 100:
			figures.Print(w, "mem_100_cgroup", float64(r.memEnd.Bytes)/(1<<20))
		case 10000:
			figures.Print(w, "rss_10k", mib)
			if len(r.newServices) > 0 {
				figures.Print(w, "new_service_p99", float64(percentile(r.newServices, 99).Microseconds())/1000)
			}
		case 30000:
			figures.Print(w, "svc30k_programmed", r.startToSynced.Seconds())
			figures.Print(w, "svc30k_rss", mib)
			if len(r.changes) > 0 {
				figures.Print(w, "svc30k_change_p99", float64(percentile(r.changes, 99).Microseconds())/1000)
			}
		}
	}
}

// memVsIPTables is the BPF mode's memory cgroup peak over upstream
// iptables mode's in results rs, if both are there.
func memVsIPTables(rs []result) (float64, bool) {
	var ebpf, ipt uint64
	for _, r := range rs {
		switch r.kind {
		case testbed.EbpfProxy:
			ebpf = r.memEnd.Bytes
		case testbed.KubeProxyIPTables:
			ipt = r.memEnd.Bytes
		}
	}
	if ebpf == 0 || ipt == 0 {
		return 0, false
	}
	return float64(ebpf) / float64(ipt), true
}

// jsonResult is one proxy's figures in the file envJSON names, read by
// test/benchreport.
type jsonResult struct {
	Proxy         string  `json:"proxy"`
	StartToSynced float64 `json:"start_to_synced_s"`
	FirstSync     float64 `json:"first_sync_s"`
	PeakRSSSynced float64 `json:"peak_rss_synced_mib"`
	PeakRSSEnd    float64 `json:"peak_rss_end_mib"`
	ChangeP50     float64 `json:"change_p50_ms,omitempty"`
	ChangeP99     float64 `json:"change_p99_ms,omitempty"`
	NewP50        float64 `json:"new_service_p50_ms,omitempty"`
	NewP99        float64 `json:"new_service_p99_ms,omitempty"`
	NewServices   int     `json:"new_services"`
	SyncPerChange float64 `json:"sync_per_change_ms,omitempty"`
	Changes       int     `json:"changes"`
	ProgrammedBPF int     `json:"programmed_frontends,omitempty"`
	Note          string  `json:"note,omitempty"`

	// The peaks of the proxy's memory cgroup, and of its kernel part
	// where the kernel keeps one (cgroup v1).
	CgroupPeakSynced  float64 `json:"cgroup_peak_synced_mib"`
	CgroupPeakEnd     float64 `json:"cgroup_peak_end_mib"`
	CgroupKmemPeakEnd float64 `json:"cgroup_kmem_peak_end_mib,omitempty"`
}

// writeJSON writes the run's results to path.
func writeJSON(path string, cfg config, loadTime time.Duration, rs []result) error {
	out := struct {
		Services  int          `json:"services"`
		Endpoints int          `json:"endpoints"`
		LoadTime  float64      `json:"load_s"`
		Results   []jsonResult `json:"results"`
	}{Services: cfg.services, Endpoints: cfg.endpoints, LoadTime: loadTime.Seconds()}
	for _, r := range rs {
		j := jsonResult{Proxy: string(r.kind), StartToSynced: r.startToSynced.Seconds(), FirstSync: r.firstSync.Seconds(),
			PeakRSSSynced: float64(r.rssSynced) / (1 << 20), PeakRSSEnd: float64(r.rssEnd) / (1 << 20),
			CgroupPeakSynced: float64(r.memSynced.Bytes) / (1 << 20), CgroupPeakEnd: float64(r.memEnd.Bytes) / (1 << 20),
			SyncPerChange: float64(r.partialSync.Microseconds()) / 1000, Changes: len(r.changes), NewServices: len(r.newServices),
			ProgrammedBPF: r.programmed, Note: r.note}
		if len(r.changes) > 0 {
			j.ChangeP50 = float64(percentile(r.changes, 50).Microseconds()) / 1000
			j.ChangeP99 = float64(percentile(r.changes, 99).Microseconds()) / 1000
		}
		if len(r.newServices) > 0 {
			j.NewP50 = float64(percentile(r.newServices, 50).Microseconds()) / 1000
			j.NewP99 = float64(percentile(r.newServices, 99).Microseconds()) / 1000
		}
		if r.memEnd.HasKernel {
			j.CgroupKmemPeakEnd = float64(r.memEnd.Kernel) / (1 << 20)
		}
		out.Results = append(out.Results, j)
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// protobufClient is an admin clientset speaking protobuf, as kube-proxy
// does, without client-side rate limits.
func protobufClient(c *cluster.Cluster) (*kubernetes.Clientset, error) {
	rc, err := c.RESTConfig(cluster.AdminUser)
	if err != nil {
		return nil, err
	}
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return kubernetes.NewForConfig(rc)
}

// load creates the probe Service, then cfg.services Services of
// cfg.endpoints endpoints each (addresses in 10.128.0.0/9 that no host has:
// they are only programmed, never connected to), with loadWorker workers.
func load(ctx context.Context, cs kubernetes.Interface, cfg config) error {
	if err := createService(ctx, cs, "probe", probeVIP.Addr().String(), nil); err != nil {
		return err
	}
	var next atomic.Int64
	errs := make(chan error, loadWorker)
	var wg sync.WaitGroup
	for range loadWorker {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= cfg.services {
					return
				}
				eps := make([]string, cfg.endpoints)
				for j := range eps {
					n := uint32(i*cfg.endpoints + j)
					eps[j] = netip.AddrFrom4([4]byte{10, byte(128 + n>>16), byte(n >> 8), byte(n)}).String()
				}
				if err := createService(ctx, cs, fmt.Sprintf("svc-%05d", i), "", eps); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// createService creates Service name (port 80 to 8080; clusterIP as given,
// or allocated when empty) and, if eps is not nil, its EndpointSlice.
func createService(ctx context.Context, cs kubernetes.Interface, name, clusterIP string, eps []string) error {
	var slices []*discoveryv1.EndpointSlice
	if eps != nil {
		slices = append(slices, endpointSlice(name, eps))
	}
	_, err := builders.CreateService(ctx, cs, builders.Service(namespace, name, builders.ClusterIP(clusterIP)), slices...)
	return err
}

// endpointSlice is the EndpointSlice of Service svc (port "http" 8080) with
// ready endpoints at addrs on no node.
func endpointSlice(svc string, addrs []string) *discoveryv1.EndpointSlice {
	var eps []discoveryv1.Endpoint
	for _, a := range addrs {
		eps = append(eps, builders.Endpoint(a, ""))
	}
	return builders.EndpointSlice(namespace, svc+"-1", svc, eps)
}

// measure runs one proxy on a fresh node with every Service present.
func measure(b *testing.B, c *cluster.Cluster, cs kubernetes.Interface, kind testbed.Kind, cfg config) result {
	ctx := b.Context()
	r := result{kind: kind}
	tb := testbed.New(b, c, testbed.Options{
		Nodes:    []testbed.NodeSpec{{Name: "node-a", Pods: []string{"a1", "a2"}}},
		TCPPorts: []uint16{8080},
	})
	node := tb.Nodes[0]
	pods := node.Pods
	// The probe Service starts on a1; each change moves it to the other pod.
	if err := setProbe(ctx, cs, pods[0]); err != nil {
		b.Fatal(err)
	}
	// Upstream with iptables-legacy, as the notes advise for a fair
	// comparison at this size (iptables-nft-restore is quadratic here).
	// Verbosity 1: no line per Service.
	p := tb.StartProxy(b, node, testbed.ProxyOptions{Kind: kind, LegacyIPTables: true, Verbosity: 1, NoWait: true, Args: agentArgs(kind, cfg)})
	syncCtx, cancel := context.WithTimeout(ctx, firstSyncBound)
	defer cancel()
	if err := p.WaitFirstSync(syncCtx); err != nil {
		b.Fatalf("%s: %v\n%s", kind, err, p.LogTail(30))
	}
	r.startToSynced = time.Since(p.Started())
	if fams, err := p.Metrics(ctx); err == nil {
		if n, sum, ok := testbed.Histogram(fams, "kubeproxy_sync_proxy_rules_duration_seconds", testbed.IPv4); ok && n > 0 {
			r.firstSync = time.Duration(sum / float64(n) * float64(time.Second))
		}
	}
	var err error
	if r.rssSynced, err = p.PeakRSS(); err != nil {
		b.Fatal(err)
	}
	if r.memSynced, err = p.MemoryPeak(); err != nil {
		b.Fatal(err)
	}
	if path := os.Getenv(envHeapProfile); path != "" && kind == testbed.EbpfProxy {
		// gc=1: the profile of the live heap now; without it the
		// runtime gives the one of its last collections, which may
		// predate the first sync (a profiled run's later RSS figures
		// then follow that collection).
		prof, err := p.Get(ctx, "/debug/pprof/heap?gc=1")
		if err == nil {
			err = os.WriteFile(path, prof, 0o644)
		}
		if err != nil {
			b.Fatalf("heap profile: %v", err)
		}
	}
	if err := waitServer(ctx, node.Client, pods[0].Name+":8080", changeBound); err != nil {
		b.Fatalf("%s: the probe Service is not programmed after the first sync: %v", kind, err)
	}
	if kind == testbed.EbpfProxy {
		out, err := p.Dump()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(line, "service ") && strings.Contains(line, " count=") {
				r.programmed++
			}
		}
	}

	syncsBefore, syncSumBefore := syncHistogram(ctx, p)
	deadline := time.Now().Add(cfg.changeBudget)
	for i := 0; i < cfg.changes && time.Now().Before(deadline); i++ {
		target := pods[(i+1)%2]
		d := untilAnswered(b, node.Client, probeVIP, target, fmt.Sprintf("%s: change %d", kind, i+1), func() error {
			start := time.Now()
			err := setProbe(ctx, cs, target)
			r.writes = append(r.writes, time.Since(start))
			return err
		})
		r.changes = append(r.changes, d)
		if d > 10*time.Second {
			b.Logf("%s: change %d took %s; the proxy's log:\n%s", kind, i+1, d, p.LogTail(40))
		}
	}
	if n, sum := syncHistogram(ctx, p); n > syncsBefore {
		r.partialSync = time.Duration((sum - syncSumBefore) / float64(n-syncsBefore) * float64(time.Second))
	}
	b.Logf("%s: change latencies %v", kind, r.changes)
	r.newServices = measureNewServices(b, cs, node, kind, cfg)
	b.Logf("%s: new Service latencies %v", kind, r.newServices)
	if os.Getenv("EBPF_PROXY_BENCH_LOG") == "1" {
		b.Logf("%s log:\n%s", kind, p.LogTail(200))
	}
	if len(r.changes) < cfg.changes {
		r.note = fmt.Sprintf("%d of %d changes within the %s budget", len(r.changes), cfg.changes, cfg.changeBudget)
	}
	if r.rssEnd, err = p.PeakRSS(); err != nil {
		b.Fatal(err)
	}
	if r.memEnd, err = p.MemoryPeak(); err != nil {
		b.Fatal(err)
	}
	return r
}

// measureNewServices creates cfg.newServices Services, one after another,
// each with an EndpointSlice of one endpoint, node's first pod, and returns
// for each the time from its create call to the first connection the pod
// answered through its ClusterIP from the node's client.
func measureNewServices(b *testing.B, cs kubernetes.Interface, node *testbed.Node, kind testbed.Kind, cfg config) []time.Duration {
	ctx := b.Context()
	pod := node.Pods[0]
	var out []time.Duration
	for i := range cfg.newServices {
		vip := newServiceVIP(kind, i)
		out = append(out, untilAnswered(b, node.Client, vip, pod, fmt.Sprintf("%s: new Service %d at %s", kind, i, vip), func() error {
			return createService(ctx, cs, fmt.Sprintf("new-%s-%02d", kind, i), vip.Addr().String(), []string{pod.IP.String()})
		}))
	}
	return out
}

// untilAnswered probes vip from c every millisecond while do makes an API
// change, and returns the time from the start of do to the first
// connection that pod answered; what is the change in the fatal error when
// pod does not answer within changeBound.
func untilAnswered(b *testing.B, c *sandbox.Client, vip netip.AddrPort, pod *sandbox.Pod, what string, do func() error) time.Duration {
	ctx := b.Context()
	w, err := c.StartWait(ctx, vip, sandbox.WaitOptions{Server: pod.Name + ":8080", Timeout: time.Second,
		Interval: time.Millisecond, MaxDuration: changeBound})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := do(); err != nil {
		b.Fatal(err)
	}
	res, err := w.Result(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if !res.Answered {
		b.Fatalf("%s not programmed within %s", what, changeBound)
	}
	return res.AnsweredAt.Sub(start)
}

// syncHistogram returns the count and sum of the proxy's sync durations,
// or zeros if it cannot be scraped.
func syncHistogram(ctx context.Context, p *testbed.Proxy) (uint64, float64) {
	fams, err := p.Metrics(ctx)
	if err != nil {
		return 0, 0
	}
	n, sum, _ := testbed.Histogram(fams, "kubeproxy_sync_proxy_rules_duration_seconds", testbed.IPv4)
	return n, sum
}

// setProbe points the probe Service at pod.
func setProbe(ctx context.Context, cs kubernetes.Interface, pod *sandbox.Pod) error {
	es := endpointSlice("probe", []string{pod.IP.String()})
	api := cs.DiscoveryV1().EndpointSlices(namespace)
	cur, err := api.Get(ctx, es.Name, metav1.GetOptions{})
	if err != nil {
		_, err = api.Create(ctx, es, metav1.CreateOptions{})
		return err
	}
	es.ResourceVersion = cur.ResourceVersion
	_, err = api.Update(ctx, es, metav1.UpdateOptions{})
	return err
}

// waitServer waits until server answers on the probe Service.
func waitServer(ctx context.Context, c *sandbox.Client, server string, bound time.Duration) error {
	return c.AwaitServer(ctx, probeVIP, sandbox.WaitOptions{Server: server, Timeout: time.Second, Interval: 10 * time.Millisecond, MaxDuration: bound})
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

func summary(cfg config, loadTime time.Duration, rs []result) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d Services × %d endpoints, loaded through the API in %s, besides the probe Service the changes move\n",
		cfg.services, cfg.endpoints, loadTime.Round(time.Second))
	w := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "proxy\tstart → all programmed\tfirst sync (own metric)\tpeak RSS after sync\tpeak RSS at end\t"+
		"cgroup peak after sync\tcgroup peak at end (kernel)\tchange p50\tchange p99\tof which API write p50\tsync per change (own metric)\tchanges\tnew Service p50\tnew Service p99\tnote")
	for _, r := range rs {
		name := string(r.kind)
		switch r.kind {
		case testbed.EbpfProxy:
			name = "ebpf-proxy"
			if r.programmed > 0 {
				r.note = strings.TrimSpace(fmt.Sprintf("%d frontends in the maps; %s", r.programmed, r.note))
			}
		case testbed.KubeProxyIPTables:
			name = "kube-proxy iptables (legacy)"
		case testbed.KubeProxyNFTables:
			name = "kube-proxy nftables"
		case testbed.EbpfProxyNFTables:
			name = "ebpf-proxy nftables fallback"
		case testbed.EbpfProxyIPTables:
			name = "ebpf-proxy iptables fallback"
		}
		p50, p99, w50 := "-", "-", "-"
		if len(r.changes) > 0 {
			p50 = ms(percentile(r.changes, 50))
			p99 = ms(percentile(r.changes, 99))
			w50 = ms(percentile(r.writes, 50))
		}
		n50, n99 := "-", "-"
		if len(r.newServices) > 0 {
			n50, n99 = ms(percentile(r.newServices, 50)), ms(percentile(r.newServices, 99))
		}
		kernel := "-"
		if r.memEnd.HasKernel {
			kernel = fmt.Sprintf("%.0f", float64(r.memEnd.Kernel)/(1<<20))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%.0f MiB\t%.0f MiB\t%.0f MiB\t%.0f MiB (%s)\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", name, r.startToSynced.Round(10*time.Millisecond),
			r.firstSync.Round(time.Millisecond), float64(r.rssSynced)/(1<<20), float64(r.rssEnd)/(1<<20),
			float64(r.memSynced.Bytes)/(1<<20), float64(r.memEnd.Bytes)/(1<<20), kernel, p50, p99, w50,
			ms(r.partialSync), len(r.changes), n50, n99, r.note)
	}
	w.Flush()
	return sb.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// agentArgs are the flags ebpf-proxy runs with: /debug/pprof when a heap
// profile is asked for (envHeapProfile), and maps large enough for the run.
func agentArgs(k testbed.Kind, cfg config) []string {
	if k != testbed.EbpfProxy {
		return nil
	}
	var args []string
	if os.Getenv(envHeapProfile) != "" {
		args = append(args, "--profiling")
	}
	// The services map holds an entry per Service and one per endpoint of
	// it, the backends map one per endpoint (the probe and the cluster's
	// kubernetes Service besides): past the default sizes (about 23,000
	// Services of 10 endpoints), the run sizes them with a quarter of room,
	// as an operator of such a cluster does.
	grow := func(flag string, need int, def uint32) {
		if need += need / 4; need > int(def) {
			args = append(args, fmt.Sprintf("--%s=%d", flag, need))
		}
	}
	grow("bpf-map-services-max", (cfg.services+2)*(cfg.endpoints+1), loader.DefaultMapSizes.Services)
	grow("bpf-map-backends-max", (cfg.services+2)*cfg.endpoints, loader.DefaultMapSizes.Backends)
	return args
}
