package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"

	"k8s.io/client-go/tools/clientcmd"

	_ "embed"
)

//go:embed testdata/coredns.yaml
var corednsManifest string

// runConfig is the host side's configuration, from run's flags.
type runConfig struct {
	vmtest     string
	vmArgs     []string
	worker     string
	nodes      int
	out        string
	images     list
	aliases    list
	e2e        string
	kubectl    string
	proxies    []string
	kubeProxy  string // the kube-proxy DaemonSet's manifest (a template)
	kpImage    string
	deploy     string
	agentImage string
	// agentArgs are added to the agent's command line (--agent-args).
	agentArgs  []string
	coredns    string
	focus      string
	skip       string
	e2eTimeout time.Duration
	nodeWait   time.Duration
	e2eArgs    list

	kubeconfig string
	server     string
}

func runMain(args []string) int {
	fs := flag.NewFlagSet("conformance run", flag.ContinueOnError)
	var c runConfig
	var vmArgs, proxies, skipFile, extraSkip string
	fs.StringVar(&c.vmtest, "vmtest", "", "the VM runner (test/vmtest) binary (required)")
	fs.StringVar(&vmArgs, "vm-args", "", "the VM runner's flags, space-separated (kernel, CPUs, memory, --modules, ...; not --tap)")
	fs.StringVar(&c.worker, "worker", "", "the worker node's program (test/cluster/worker), run in each guest (required)")
	fs.IntVar(&c.nodes, "nodes", 1, "the number of nodes, each a guest on the tap device node<i>-tap that the control plane made")
	fs.StringVar(&c.out, "out", "", "directory for the reports and logs; the guest writes to it (required)")
	fs.Var(&c.images, "image", "an image archive the node imports (repeatable)")
	fs.Var(&c.aliases, "alias", "NEW=EXISTING: a second reference for an imported image (repeatable)")
	fs.StringVar(&c.e2e, "e2e", "", "the e2e test binary (required)")
	fs.StringVar(&c.kubectl, "kubectl", "", "kubectl of the suite's release (required)")
	fs.StringVar(&proxies, "proxies", "kube-proxy,ebpf-proxy", "the proxies to run the suite with, in order")
	fs.StringVar(&c.kubeProxy, "kube-proxy-manifest", "", "upstream kube-proxy's manifest, a template of {{.APIServer}} and {{.Image}}")
	fs.StringVar(&c.kpImage, "kube-proxy-image", "", "upstream kube-proxy's image")
	fs.StringVar(&c.deploy, "deploy", "", "the repository's deploy/ directory (a kustomization)")
	fs.StringVar(&c.agentImage, "agent-image", "", "the agent's image, NAME:TAG")
	var agentArgs string
	fs.StringVar(&agentArgs, "agent-args", "", "flags added to the agent's command line, space-separated (--socket-lb-scope=node, say)")
	fs.StringVar(&c.coredns, "coredns-image", "", "CoreDNS's image (required)")
	fs.StringVar(&c.focus, "focus", "", "the specs to run (ginkgo's --focus)")
	fs.StringVar(&skipFile, "skip-file", "", "a file of the specs to leave out: one regular expression a line, # comments")
	fs.StringVar(&extraSkip, "skip", "", "a further regular expression of specs to leave out")
	fs.DurationVar(&c.e2eTimeout, "e2e-timeout", 3*time.Hour, "how long one run of the suite may take")
	fs.DurationVar(&c.nodeWait, "node-timeout", 30*time.Minute, "how long the node may take to be ready")
	fs.Var(&c.e2eArgs, "e2e-arg", "a further flag for e2e.test (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c.vmArgs = strings.Fields(vmArgs)
	c.agentArgs = strings.Fields(agentArgs)
	for _, p := range strings.Split(proxies, ",") {
		switch p = strings.TrimSpace(p); p {
		case "kube-proxy", "ebpf-proxy":
			c.proxies = append(c.proxies, p)
		case "":
		default:
			fmt.Fprintf(os.Stderr, "conformance run: --proxies: unknown proxy %q (kube-proxy, ebpf-proxy)\n", p)
			return 2
		}
	}
	var err error
	if c.skip, err = skipExpression(skipFile, extraSkip); err != nil {
		fmt.Fprintln(os.Stderr, "conformance run:", err)
		return 2
	}
	switch {
	case c.vmtest == "" || c.worker == "" || c.out == "" || c.e2e == "" || c.kubectl == "" || c.coredns == "":
		err = errors.New("--vmtest, --worker, --out, --e2e, --kubectl and --coredns-image are required")
	case c.nodes < 1:
		err = fmt.Errorf("--nodes %d: want at least 1", c.nodes)
	case slices.Contains(c.vmArgs, "--tap"):
		err = errors.New("--vm-args: no --tap: each node's guest is on node<i>-tap")
	case len(c.proxies) == 0:
		err = errors.New("--proxies names none")
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, p := range c.proxies {
		if p == "kube-proxy" && (c.kubeProxy == "" || c.kpImage == "") {
			err = errors.New("kube-proxy needs --kube-proxy-manifest and --kube-proxy-image")
		}
		if p == "ebpf-proxy" && (c.deploy == "" || !strings.Contains(c.agentImage, ":") || c.kubeProxy == "") {
			err = errors.New("ebpf-proxy needs --deploy, --agent-image NAME:TAG and --kube-proxy-manifest (its ConfigMap)")
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance run:", err)
		return 2
	}
	if c.kubeconfig = os.Getenv(envKubeconfig); c.kubeconfig == "" {
		fmt.Fprintf(os.Stderr, "conformance run: %s is not set: run it under test/cluster/controlplane (make conformance)\n", envKubeconfig)
		return 2
	}
	c.server, err = apiServer(c.kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance run:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := c.run(ctx)
	if len(results) > 0 {
		fmt.Println()
		for _, r := range results {
			for reason, n := range r.SkipReasons {
				fmt.Printf("conformance: %s: %d skipped at run time: %s\n", r.Proxy, n, reason)
			}
		}
		ok := Summary(os.Stdout, results)
		if err == nil && !ok {
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance run:", err)
		return 1
	}
	return 0
}

// skipExpression joins the expressions of the skip file and extra into one
// for ginkgo's --skip.
func skipExpression(file, extra string) (string, error) {
	var exprs []string
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		for i, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if _, err := regexp.Compile(line); err != nil {
				return "", fmt.Errorf("%s:%d: %w", file, i+1, err)
			}
			exprs = append(exprs, line)
		}
	}
	if extra != "" {
		exprs = append(exprs, extra)
	}
	return strings.Join(exprs, "|"), nil
}

// apiServer is the API server's URL in the kubeconfig, which the proxies'
// own kubeconfigs name too.
func apiServer(kubeconfig string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return "", err
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return "", fmt.Errorf("%s: no current context", kubeconfig)
	}
	cl, ok := cfg.Clusters[ctx.Cluster]
	if !ok || cl.Server == "" {
		return "", fmt.Errorf("%s: no server", kubeconfig)
	}
	return cl.Server, nil
}

// run does the work of runMain: the node, then each proxy's run of the
// suite. It returns the results of the runs that ended, also on error.
func (c *runConfig) run(ctx context.Context) ([]Result, error) {
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Printf("conformance: %6.1fs %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	if err := os.MkdirAll(filepath.Join(c.out, "logs"), 0o755); err != nil {
		return nil, err
	}
	// Every node's guest at once: each imports the images on its own vCPU.
	var vms []*guestVM
	defer func() {
		for _, vm := range vms {
			vm.stop(logf)
		}
	}()
	for i := 1; i <= c.nodes; i++ {
		vm, err := c.startVM(i)
		if err != nil {
			return nil, err
		}
		vms = append(vms, vm)
		logf("VM of node%d started (its output in %s)", i, vm.logPath)
	}
	for _, vm := range vms {
		if err := vm.waitReady(ctx, c.nodeWait); err != nil {
			return nil, err
		}
	}
	logf("%d node(s) ready", len(vms))
	if err := c.applyTemplate(ctx, corednsManifest, map[string]any{"Image": c.coredns, "IP": defaultDNS, "Domain": defaultDomain}); err != nil {
		return nil, fmt.Errorf("CoreDNS: %w", err)
	}
	var results []Result
	for i, proxy := range c.proxies {
		if err := c.install(ctx, proxy, "", i > 0); err != nil {
			return results, fmt.Errorf("%s: %w", proxy, err)
		}
		// CoreDNS reaches the API server through the kubernetes
		// Service: it is ready once a proxy serves it.
		if err := c.kubectlRetry(ctx, "", "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=15m"); err != nil {
			return results, fmt.Errorf("CoreDNS: %w", err)
		}
		logf("%s and CoreDNS ready; running the suite", proxy)
		suiteStart := time.Now()
		r, err := c.suite(ctx, proxy, proxy, c.focus)
		if err != nil {
			return results, fmt.Errorf("%s: %w", proxy, err)
		}
		results = append(results, r)
		logf("%s: ran=%d passed=%d failed=%d skipped=%d in %.0fs", proxy, r.Ran(), r.Passed, r.Failed, r.Skipped, time.Since(suiteStart).Seconds())
		if ctx.Err() != nil {
			// Interrupted: the suite wrote its report of what ran; the
			// next proxy is not installed.
			return results, fmt.Errorf("%s: interrupted: %w", proxy, ctx.Err())
		}
	}
	// The specs kube-proxy passed that skipped themselves with ebpf-proxy
	// because they ask for one of kube-proxy's modes: again, with
	// ebpf-proxy in that mode.
	var reference, ours *Result
	for i := range results {
		switch results[i].Proxy {
		case "kube-proxy":
			reference = &results[i]
		case "ebpf-proxy":
			ours = &results[i]
		}
	}
	if reference == nil || ours == nil {
		return results, nil
	}
	for _, mode := range sortedKeys(ModeSpecific(*reference, *ours)) {
		specs := ModeSpecific(*reference, *ours)[mode]
		label := "ebpf-proxy-" + mode
		if err := c.install(ctx, "ebpf-proxy", mode, true); err != nil {
			return results, fmt.Errorf("%s: %w", label, err)
		}
		logf("ebpf-proxy in %s mode ready; running the %d spec(s) that ask for kube-proxy's %s mode", mode, len(specs), mode)
		r, err := c.suite(ctx, label, "ebpf-proxy", focusOn(specs))
		if err != nil {
			return results, fmt.Errorf("%s: %w", label, err)
		}
		r.Mode = mode
		results = append(results, r)
		if ctx.Err() != nil {
			return results, fmt.Errorf("%s: interrupted: %w", label, ctx.Err())
		}
	}
	return results, nil
}

// focusOn is a --ginkgo.focus expression that selects the specs named:
// each name literally. Ginkgo matches it against the suite's description
// and the spec's text, so it cannot be anchored at the start.
func focusOn(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return strings.Join(quoted, "|")
}

// install puts proxy in place of whatever proxy runs: upstream kube-proxy
// as kubeadm installs it, or deploy/ with the agent's image (the migration
// of docs/INSTALL.md: the agent first, then kube-proxy's DaemonSet goes),
// in its own mode ("" for deploy/'s --proxy-mode=auto).
func (c *runConfig) install(ctx context.Context, proxy, mode string, replacing bool) error {
	switch proxy {
	case "kube-proxy":
		b, err := os.ReadFile(c.kubeProxy)
		if err != nil {
			return err
		}
		if err := c.applyTemplate(ctx, string(b), map[string]any{"APIServer": c.server, "Image": c.kpImage}); err != nil {
			return err
		}
		return c.kubectlRetry(ctx, "", "-n", "kube-system", "rollout", "status", "daemonset/kube-proxy", "--timeout=15m")
	case "ebpf-proxy":
		if !replacing {
			// deploy/ reaches the API server through kube-proxy's
			// ConfigMap, which kubeadm makes in every cluster: its
			// objects but the DaemonSet, as where kube-proxy never ran.
			b, err := os.ReadFile(c.kubeProxy)
			if err != nil {
				return err
			}
			objs, err := withoutKind(string(b), "DaemonSet")
			if err != nil {
				return err
			}
			if err := c.applyTemplate(ctx, objs, map[string]any{"APIServer": c.server, "Image": c.kpImage}); err != nil {
				return err
			}
		}
		overlay, err := c.overlay(mode)
		if err != nil {
			return err
		}
		if err := c.kubectlRetry(ctx, "", "apply", "-k", overlay); err != nil {
			return err
		}
		if err := c.kubectlRetry(ctx, "", "-n", "kube-system", "rollout", "status", "daemonset/ebpf-proxy", "--timeout=15m"); err != nil {
			return err
		}
		if replacing {
			return c.kubectlRetry(ctx, "", "-n", "kube-system", "delete", "daemonset", "kube-proxy", "--ignore-not-found", "--wait=true", "--timeout=5m")
		}
		return nil
	}
	return fmt.Errorf("unknown proxy %q", proxy)
}

// documentSeparator splits a multi-document YAML manifest.
var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// withoutKind returns the manifest without its objects of kind.
func withoutKind(manifest, kind string) (string, error) {
	var keep []string
	dropped := 0
	isKind := regexp.MustCompile(`(?m)^kind:[ \t]*` + regexp.QuoteMeta(kind) + `[ \t]*$`)
	for _, doc := range documentSeparator.Split(manifest, -1) {
		if isKind.MatchString(doc) {
			dropped++
			continue
		}
		keep = append(keep, doc)
	}
	if dropped == 0 {
		return "", fmt.Errorf("the manifest holds no %s", kind)
	}
	return strings.Join(keep, "\n---\n"), nil
}

// overlay writes a kustomization on top of deploy/ that sets the agent's
// image, as a user's overlay does, and returns its directory.
// proxyPodLabel gives the agent's pods kube-proxy's label: the suite finds
// the node's proxy by k8s-app=kube-proxy in kube-system ("should work
// after restarting kube-proxy" deletes those pods and waits for their
// DaemonSet to bring them back), so that with it the spec restarts
// ebpf-proxy instead of skipping itself. Only the DaemonSet's selector and
// pod template change; kube-proxy's DaemonSet, deleted after the agent is
// ready, owns none of them (its controller adopts no pod another
// controller owns).
const proxyPodLabel = `patches:
  - target:
      kind: DaemonSet
      name: ebpf-proxy
    patch: |-
      - op: replace
        path: /spec/selector/matchLabels/k8s-app
        value: kube-proxy
      - op: replace
        path: /spec/template/metadata/labels/k8s-app
        value: kube-proxy
`

// proxyModePatch replaces deploy/'s --proxy-mode=auto with a mode of the
// agent's own, checking first that the DaemonSet still says auto there.
const proxyModePatch = `  - target:
      kind: DaemonSet
      name: ebpf-proxy
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/command/2
        value: --proxy-mode=auto
      - op: replace
        path: /spec/template/spec/containers/0/command/2
        value: --proxy-mode=%s
`

// agentArgsPatch is the overlay's patch that adds args to the agent's
// command line.
func agentArgsPatch(args []string) string {
	var b strings.Builder
	b.WriteString("  - target:\n      kind: DaemonSet\n      name: ebpf-proxy\n    patch: |-\n")
	for _, a := range args {
		fmt.Fprintf(&b, "      - op: add\n        path: /spec/template/spec/containers/0/command/-\n        value: %q\n", a)
	}
	return b.String()
}

func (c *runConfig) overlay(mode string) (string, error) {
	dir := filepath.Join(c.out, "overlay")
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	base := filepath.Join(dir, "base")
	if err := os.CopyFS(base, os.DirFS(c.deploy)); err != nil {
		return "", err
	}
	name, tag, _ := strings.Cut(c.agentImage, ":")
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - base\nimages:\n  - name: ebpf-proxy\n    newName: %q\n    newTag: %q\n", name, tag) +
		proxyPodLabel
	if mode != "" {
		k += fmt.Sprintf(proxyModePatch, mode)
	}
	if len(c.agentArgs) > 0 {
		k += agentArgsPatch(c.agentArgs)
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// suite runs the e2e binary once on the specs focus selects and reads its
// JSON report, a run with proxy; label names its directory and its lines.
func (c *runConfig) suite(ctx context.Context, label, proxy, focus string) (Result, error) {
	dir := filepath.Join(c.out, label)
	if err := os.RemoveAll(dir); err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, err
	}
	report := filepath.Join(dir, "report.json")
	args := []string{
		"--kubeconfig=" + c.kubeconfig,
		"--provider=skeleton",
		"--kubectl-path=" + c.kubectl,
		"--report-dir=" + dir,
		"--disable-log-dump",
		"--ginkgo.json-report=" + report,
		"--ginkgo.timeout=" + c.e2eTimeout.String(),
		"--ginkgo.v",
		"--ginkgo.no-color",
	}
	if focus != "" {
		args = append(args, "--ginkgo.focus="+focus)
	}
	if c.skip != "" {
		args = append(args, "--ginkgo.skip="+c.skip)
	}
	args = append(args, c.e2eArgs...)
	logPath := filepath.Join(dir, "e2e.log")
	log, err := os.Create(logPath)
	if err != nil {
		return Result{}, err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, c.e2e, args...)
	cmd.Env = append(os.Environ(), "KUBERNETES_CONFORMANCE_TEST=y")
	// The whole log goes to the file; each spec's verdict to the output.
	progress := &specProgress{proxy: label, out: os.Stdout}
	cmd.Stdout = io.MultiWriter(log, progress)
	cmd.Stderr = cmd.Stdout
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	fmt.Printf("conformance: %s: e2e.test %s\nconformance: %s: its log: %s\n", label, strings.Join(args, " "), label, logPath)
	runErr := cmd.Run()
	progress.flush()
	r, err := ReadReport(proxy, report)
	if err != nil {
		// No report: the suite did not get as far as the specs.
		tail, _ := exec.Command("tail", "-n", "40", logPath).Output()
		return Result{}, fmt.Errorf("e2e.test: %v; no report (%v); its log ends:\n%s", runErr, err, tail)
	}
	return r, nil
}

// specProgress prints one line per spec from ginkgo's verbose output: a
// spec starts with a delimiter line and its name, then its steps, and
// ends with a verdict line, "•" and its time for a pass, "• [FAILED]" and
// the like otherwise, "S [SKIPPED]" for a skip.
type specProgress struct {
	proxy string
	out   io.Writer
	buf   bytes.Buffer
	// name is the running spec's; afterDelimiter says the next line may
	// be a name.
	name           string
	afterDelimiter bool
}

var (
	verdictLine = regexp.MustCompile(`^(•|S|P) ?(\[[A-Z]+\])? ?\[([0-9.]+) seconds\]`)
	// skipRun is the run of S's that a stretch of filtered specs prints.
	skipRun = regexp.MustCompile(`^S+$`)
)

const delimiter = "------------------------------"

func (p *specProgress) Write(b []byte) (int, error) {
	p.buf.Write(b)
	for {
		line, err := p.buf.ReadString('\n')
		if err != nil {
			// An unfinished line waits for the rest.
			p.buf.Reset()
			p.buf.WriteString(line)
			return len(b), nil
		}
		p.line(strings.TrimRight(line, "\r\n"))
	}
}

func (p *specProgress) line(l string) {
	if l == delimiter {
		p.afterDelimiter = true
		return
	}
	if p.afterDelimiter {
		p.afterDelimiter = false
		if l != "" && !skipRun.MatchString(l) && !verdictLine.MatchString(l) {
			p.name = l
			return
		}
	}
	m := verdictLine.FindStringSubmatch(l)
	if m == nil {
		return
	}
	verdict := strings.Trim(m[2], "[]")
	if verdict == "" {
		verdict = "PASSED"
	}
	name := p.name
	p.name = ""
	if verdict == "SKIPPED" || name == "" {
		// Skips are counted in the summary, by reason: not a line each.
		return
	}
	fmt.Fprintf(p.out, "conformance: %s: %s %ss %s\n", p.proxy, verdict, m[3], name)
}

func (p *specProgress) flush() {
	if p.buf.Len() > 0 {
		p.line(p.buf.String())
		p.buf.Reset()
	}
}

// applyTemplate applies a manifest template filled with data.
func (c *runConfig) applyTemplate(ctx context.Context, manifest string, data any) error {
	tmpl, err := template.New("manifest").Option("missingkey=error").Parse(manifest)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, data); err != nil {
		return err
	}
	return c.kubectlRetry(ctx, b.String(), "apply", "-f", "-")
}

// kubectlRetry runs kubectl as the admin, again after an error of an API
// server too slow for a moment (the emulated node's one vCPU answers its
// watches slowly), up to four times: the commands used are idempotent.
func (c *runConfig) kubectlRetry(ctx context.Context, stdin string, args ...string) error {
	var err error
	for try := 1; try <= 4; try++ {
		cmd := exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		var out []byte
		if out, err = cmd.CombinedOutput(); err == nil {
			return nil
		}
		err = fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		if ctx.Err() != nil {
			return err
		}
		fmt.Printf("conformance: try %d: %v\n", try, err)
		time.Sleep(5 * time.Second)
	}
	return err
}

// The worker's states in its state file (test/cluster/worker).
const (
	stateReady  = "ready"
	stateFailed = "failed"
)

// guestVM is the running VM with a node.
type guestVM struct {
	name      string
	cmd       *exec.Cmd
	done      chan struct{}
	waitErr   error
	state     string
	stopFile  string
	logPath   string
	logFile   *os.File
	startedAt time.Time
}

// startVM starts the VM runner with the worker node's program (node i, on
// the tap device node<i>-tap), in a process group of its own (QEMU is in it
// too), so that the whole group can be killed should the runner not end by
// itself. Each node writes its logs to logs/node<i>.
func (c *runConfig) startVM(i int) (*guestVM, error) {
	name := fmt.Sprintf("node%d", i)
	logs := filepath.Join(c.out, "logs", name)
	vm := &guestVM{
		name:     name,
		done:     make(chan struct{}),
		state:    filepath.Join(c.out, name+".state"),
		stopFile: filepath.Join(c.out, name+".stop"),
		logPath:  filepath.Join(logs, "vm.log"),
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	for _, f := range []string{vm.state, vm.stopFile} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	args := append([]string{}, c.vmArgs...)
	args = append(args, "--tap", name+"-tap", "--rw", c.out, "--", c.worker, "--index", strconv.Itoa(i),
		"--logs", logs, "--state", vm.state, "--stop", vm.stopFile,
		"--cluster-dns", defaultDNS.String(), "--cluster-domain", defaultDomain)
	for _, i := range c.images {
		args = append(args, "--image", i)
	}
	for _, a := range c.aliases {
		args = append(args, "--alias", a)
	}
	var err error
	if vm.logFile, err = os.Create(vm.logPath); err != nil {
		return nil, err
	}
	vm.cmd = exec.Command(c.vmtest, args...)
	// The guest's few lines (the node's steps) are progress worth seeing.
	vm.cmd.Stdout = io.MultiWriter(vm.logFile, agent.PrefixWriter(name+": ", os.Stdout))
	vm.cmd.Stderr = vm.cmd.Stdout
	vm.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := vm.cmd.Start(); err != nil {
		vm.logFile.Close()
		return nil, err
	}
	vm.startedAt = time.Now()
	go func() {
		vm.waitErr = vm.cmd.Wait()
		close(vm.done)
	}()
	return vm, nil
}

// waitReady waits for the guest to say the node is ready.
func (vm *guestVM) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.After(timeout)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		b, err := os.ReadFile(vm.state)
		switch s := strings.TrimSpace(string(b)); {
		case err == nil && s == stateReady:
			return nil
		case err == nil && strings.HasPrefix(s, stateFailed):
			return fmt.Errorf("%s did not come up: %s (logs in %s)", vm.name, s, filepath.Dir(vm.logPath))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-vm.done:
			return fmt.Errorf("the VM ended before %s was ready: %v (its output: %s)", vm.name, vm.waitErr, vm.logPath)
		case <-deadline:
			return fmt.Errorf("%s was not ready after %s (its output: %s)", vm.name, timeout, vm.logPath)
		case <-tick.C:
		}
	}
}

// stop asks the guest to stop (the stop file), waits for the VM runner to
// end, and kills its process group if it does not.
func (vm *guestVM) stop(logf func(string, ...any)) {
	defer vm.logFile.Close()
	select {
	case <-vm.done:
		return
	default:
	}
	if err := os.WriteFile(vm.stopFile, nil, 0o644); err != nil {
		logf("stop the VM: %v", err)
	}
	pid := vm.cmd.Process.Pid
	for _, step := range []struct {
		wait time.Duration
		sig  syscall.Signal
	}{{2 * time.Minute, syscall.SIGTERM}, {30 * time.Second, syscall.SIGKILL}} {
		select {
		case <-vm.done:
			logf("VM of %s stopped after %.0fs", vm.name, time.Since(vm.startedAt).Seconds())
			return
		case <-time.After(step.wait):
		}
		logf("the VM of %s did not stop within %s: %v to its process group %d", vm.name, step.wait, step.sig, pid)
		if step.sig == syscall.SIGTERM {
			_ = vm.cmd.Process.Signal(step.sig)
		} else {
			_ = syscall.Kill(-pid, step.sig)
		}
	}
	<-vm.done
}
