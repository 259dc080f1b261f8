// Command demo runs ebpf-proxy in a sandbox on this machine: a node network
// namespace with three pods serving HTTP and UDP, a client pod, and the
// agent reading Services from examples/demo. It shows requests to a
// ClusterIP spreading over the pods, on both ClusterIPs of a dual-stack
// Service, a UDP round trip answered from the
// ClusterIP, a Service without endpoints refusing at once, and an endpoint
// change, then removes everything it created. The agent runs inside the
// node's network namespace, and its BPF programs attach only to a cgroup
// and devices the demo creates.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

var (
	webVIP  = netip.MustParseAddrPort("10.96.0.80:80")
	webVIP6 = netip.MustParseAddrPort("[fd00:10:96::80]:80")
	echoVIP = netip.MustParseAddrPort("10.96.0.53:53")
	deadVIP = netip.MustParseAddrPort("10.96.0.99:80")
)

func main() {
	sandbox.Main()
	bin := flag.String("agent", "bin/ebpf-proxy", "the ebpf-proxy binary")
	manifests := flag.String("manifests", "examples/demo", "directory of example Services and EndpointSlices")
	flag.Parse()
	if err := run(*bin, *manifests); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func run(bin, manifests string) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	step("creating the sandbox: node-a, pods pod-0..2 (HTTP :8080, UDP :5353), a client pod")
	sb, err := sandbox.New()
	if err != nil {
		return err
	}
	defer func() {
		step("removing the sandbox (namespaces, cgroup, bpffs)")
		if cerr := sb.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	node, err := sb.AddNode("node-a")
	if err != nil {
		return err
	}
	for i := range 3 {
		p, err := sb.AddPod(node, fmt.Sprintf("pod-%d", i), netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}))
		if err != nil {
			return err
		}
		if _, err := p.StartHTTPServer(8080); err != nil {
			return err
		}
		if _, err := p.StartUDPServer(5353); err != nil {
			return err
		}
	}
	client, err := sb.AddClient(node, "client", netip.Addr{})
	if err != nil {
		return err
	}
	fmt.Print(sb)

	// The agent edits nothing in the repo: it reads a copy we can change.
	dir, err := os.MkdirTemp("", "ebpf-proxy-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := copyDir(manifests, dir); err != nil {
		return err
	}
	// The node's own Node object names its addresses, as the API server's
	// would: the TC programs attach to the device that carries them.
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte(nodeObject(node)), 0o644); err != nil {
		return err
	}
	bpffs := filepath.Join(sb.BPFFS.Path(), "ebpf-proxy")
	// kube-proxy's metrics port, on the node namespace's own loopback.
	const metricsAddr = "127.0.0.1:10249"

	args := []string{"--manifests", dir, "--cgroup-path", sb.Cgroup.Path(), "--bpffs-path", bpffs,
		"--hostname-override", "node-a", "--healthz-bind-address", "", "--metrics-bind-address", metricsAddr, "--probe-bind-address", "",
		"--api-socket", filepath.Join(dir, "agent.sock"), "--logging-format", "text"}
	step("starting the agent in node-a's network namespace; to run it by hand:\n    ip netns exec %s %s %s",
		node.NS.Name(), bin, shellQuote(args))
	agent := exec.Command(bin, args...)
	logs, err := agent.StderrPipe()
	if err != nil {
		return err
	}
	if err := netns.Start(node.NS.Path(), agent); err != nil {
		return fmt.Errorf("start the agent (run `make build` first): %w", err)
	}
	defer func() {
		if agent.ProcessState == nil {
			agent.Process.Kill()
			agent.Wait()
		}
		var out strings.Builder
		cleanup := exec.Command(bin, "cleanup", "--bpffs-path", bpffs, "--logging-format", "text")
		cleanup.Stdout, cleanup.Stderr = &out, &out
		if err := netns.Start(node.NS.Path(), cleanup); err == nil {
			cleanup.Wait()
		}
		fmt.Printf("    ebpf-proxy cleanup:\n%s", indent(out.String()))
	}()
	synced := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(logs)
		once := false
		for sc.Scan() {
			fmt.Println("    agent |", sc.Text())
			if !once && strings.Contains(sc.Text(), "first sync done in every IP family") {
				once = true
				close(synced)
			}
		}
	}()
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("the agent did not sync within 30s")
	case <-ctx.Done():
		return ctx.Err()
	}

	step("the BPF maps, as `ebpf-proxy dump` prints them (Service names from the agent's API socket)")
	out, err := exec.Command(bin, "dump", "--bpffs-path", bpffs, "--api-socket", filepath.Join(dir, "agent.sock")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("dump: %v: %s", err, out)
	}
	fmt.Print(indent(string(out)))

	if err := spread(ctx, client, webVIP, "30 HTTP requests from the client pod to web at "+webVIP.String()); err != nil {
		return err
	}
	if err := spread(ctx, client, webVIP6, "web is dual-stack: 30 HTTP requests to its IPv6 ClusterIP "+webVIP6.String()); err != nil {
		return err
	}

	step("UDP round trip to echo at %s (unconnected sendto/recvfrom)", echoVIP)
	urep, err := client.UDP(ctx, echoVIP, 3)
	if err != nil {
		return err
	}
	for _, r := range urep.Results {
		if r.Err != "" {
			return fmt.Errorf("UDP: %s", r.Err)
		}
		fmt.Printf("    reply from %s (the ClusterIP, not the pod), answered by %s, which saw the client as %s\n", r.From, r.Server, r.ClientSeen)
	}

	step("connecting to nothing at %s, a Service without endpoints", deadVIP)
	trep, err := client.TCP(ctx, deadVIP, 1)
	if err != nil {
		return err
	}
	fmt.Printf("    connect(): %s after %v\n", trep.Results[0].Err, trep.Results[0].Elapsed.Round(time.Microsecond))

	step("removing pod-0 from web's EndpointSlice (the agent watches the directory)")
	if err := rewrite(filepath.Join(dir, "endpointslices.yaml"), "  - addresses: [10.244.1.10]\n    conditions: {ready: true}\n    nodeName: node-a\n", 1); err != nil {
		return err
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		rep, err := client.HTTP(ctx, webVIP, "/", 20)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(rep.Results, func(r sandbox.HTTPResult) bool { return r.Server == "pod-0" }) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod-0 still receives traffic")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := spread(ctx, client, webVIP, "30 more HTTP requests to "+webVIP.String()); err != nil {
		return err
	}

	step("the metrics that moved, from http://%s/metrics in node-a's namespace", metricsAddr)
	if err := showMetrics(node, metricsAddr); err != nil {
		return err
	}

	step("stopping the agent: the pinned programs keep serving")
	agent.Process.Signal(syscall.SIGTERM)
	agent.Wait()
	rep, err := client.HTTP(ctx, webVIP, "/", 5)
	if err != nil {
		return err
	}
	ok := 0
	for _, r := range rep.Results {
		if r.Status == http.StatusOK {
			ok++
		}
	}
	fmt.Printf("    %d of 5 requests answered with no agent running\n", ok)
	return nil
}

func spread(ctx context.Context, client *sandbox.Client, vip netip.AddrPort, what string) error {
	step("%s", what)
	rep, err := client.HTTP(ctx, vip, "/", 30)
	if err != nil {
		return err
	}
	count := map[string]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			return fmt.Errorf("HTTP request failed: %s", r.Err)
		}
		count[r.Server]++
	}
	var names []string
	for n := range count {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Printf("    %-6s %-30s %d\n", n, strings.Repeat("#", count[n]), count[n])
	}
	fmt.Printf("    every pod saw the client's own address %s: no SNAT\n", rep.Results[0].ClientSeen.Addr())
	return nil
}

// showMetrics prints the BPF event counters that are not zero, the proxy
// mode and each family's sync count, fetched inside the node's namespace.
func showMetrics(node *sandbox.Node, addr string) error {
	hc := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (conn net.Conn, err error) {
			err = node.NS.Do(func() (err error) {
				conn, err = (&net.Dialer{}).DialContext(ctx, network, a)
				return err
			})
			return conn, err
		},
	}}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(body), "\n") {
		switch {
		case strings.HasPrefix(l, "ebpfproxy_bpf_events_total") && !strings.HasSuffix(l, " 0"),
			strings.HasPrefix(l, "ebpfproxy_proxy_mode"),
			strings.HasPrefix(l, "kubeproxy_sync_proxy_rules_duration_seconds_count"):
			fmt.Println("   ", l)
		}
	}
	return nil
}

// nodeObject is node's Node object, with its addresses of both families.
func nodeObject(node *sandbox.Node) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %s
status:
  addresses:
    - {type: InternalIP, address: %q}
    - {type: InternalIP, address: %q}
`, node.Name, node.IP, node.IP6)
}

// shellQuote joins args for a shell, quoting the empty and the unsafe.
func shellQuote(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\*?[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

func copyDir(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// rewrite removes the first n occurrences of cut from a file, replacing it
// atomically.
func rewrite(path, cut string, n int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := strings.Replace(string(b), cut, "", n)
	if s == string(b) {
		return fmt.Errorf("%s does not contain %q", path, cut)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
