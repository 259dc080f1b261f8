package modes_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func TestMain(m *testing.M) { agent.Main(m) }

// The node, its Service and the agent's metrics address inside the node's
// namespace.
const (
	nodeName    = "node-a"
	tcpPort     = 8080
	nodePort    = 30080
	metricsAddr = "127.0.0.1:10249"
)

var clusterIP = netip.MustParseAddr("10.96.0.80")

// env is one node with two serving pods, a client pod on the node and a
// client outside the cluster; the agent runs in the node's namespace.
type env struct {
	t         *testing.T
	sb        *sandbox.Sandbox
	node      *sandbox.Node
	pods      []*sandbox.Pod
	client    *sandbox.Client
	external  *sandbox.Client
	bpffs     string
	manifests string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	sb := sandbox.ForTest(t)
	e := &env{t: t, sb: sb, manifests: t.TempDir()}
	var err error
	if e.node, err = sb.AddNode(nodeName); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		p, err := sb.AddPod(e.node, fmt.Sprintf("pod-%d", i), netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.StartTCPServer(tcpPort); err != nil {
			t.Fatal(err)
		}
		e.pods = append(e.pods, p)
	}
	if e.client, err = sb.AddClient(e.node, "client", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if e.external, err = sb.AddExternalClient("external", netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	// Replies of a pod to a client on the same bridge must pass the node's
	// conntrack for the fallbacks' DNAT to be undone.
	if err := behaviour.RouteBridgeThroughNode(e.node); err != nil {
		t.Fatal(err)
	}
	e.bpffs = filepath.Join(sb.BPFFS.Path(), "ebpf-proxy")
	e.writeManifests()
	return e
}

// writeManifests writes the agent's view of the cluster: web, a NodePort
// Service served by both pods.
func (e *env) writeManifests() {
	var eps []discoveryv1.Endpoint
	for _, p := range e.pods {
		eps = append(eps, builders.Endpoint(p.IP.String(), nodeName))
	}
	web := builders.Service("default", "web", builders.ClusterIP(clusterIP.String()),
		builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromInt32(tcpPort))), builders.NodePort(nodePort))
	if err := builders.WriteManifest(e.manifests, "web.yaml", web, builders.SliceFor(web, eps...)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	e.t.Cleanup(cancel)
	return ctx
}

// agentArgs are the flags every agent of these tests runs with: the
// sandbox's cgroup and bpffs, the manifests directory, metrics inside the
// node's namespace. Sockets of removed backends are not ended: that scans
// every namespace of the machine, where other tests run. The API socket
// is the test's, never the host's /run.
func (e *env) agentArgs(mode string) []string {
	return []string{"--proxy-mode", mode, "--manifests", e.manifests, "--cgroup-path", e.sb.Cgroup.Path(),
		"--api-socket", filepath.Join(e.t.TempDir(), "agent.sock"),
		"--bpffs-path", e.bpffs, "--hostname-override", nodeName, "--cluster-cidr", sandbox.PodCIDR.String(),
		"--healthz-bind-address", "", "--metrics-bind-address", metricsAddr, "--probe-bind-address", "", "--terminate-removed-backend-sockets=false", "-v", "2"}
}

// startAgent runs the agent in the node's namespace in mode, with the
// extra environment variables env, and waits until it has synced and
// removed what other modes left.
func (e *env) startAgent(mode string, env ...string) *agent.Process {
	e.t.Helper()
	return e.startAgentArgs(mode, e.agentArgs(mode), env...)
}

// startAgentArgs is startAgent with the agent's whole command line.
func (e *env) startAgentArgs(mode string, args []string, env ...string) *agent.Process {
	t := e.t
	t.Helper()
	a := e.launch(args, env...)
	if err := a.WaitLog(2*time.Minute, []string{"removed what other proxy modes left"}, "removing what other proxy modes left"); err != nil {
		t.Fatalf("agent (%s) did not sync and clean up: %v\n%s", mode, err, a.Logs())
	}
	return a
}

// launch starts the agent binary with args in the node's namespace.
func (e *env) launch(args []string, env ...string) *agent.Process {
	e.t.Helper()
	return agent.Run(e.t, agent.Options{Args: args, Env: env, Netns: e.node.NS.Path()})
}

// get fetches path from the agent's metrics server inside the node's
// namespace.
func get(t *testing.T, a *agent.Process, path string) string {
	t.Helper()
	code, body := a.MustGet(t, "http://"+metricsAddr+path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, http.StatusText(code))
	}
	return body
}

// cleanup runs `ebpf-proxy --cleanup` in the node's namespace.
func (e *env) cleanup() { e.cleanupWith(agent.Cleanup) }

// cleanupWith runs a cleanup command (agent.Cleanup or
// agent.CleanupCommand) in the node's namespace.
func (e *env) cleanupWith(run func(context.Context, string, string) (string, error)) {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := run(ctx, e.node.NS.Path(), e.bpffs); err != nil {
		t.Fatal(err)
	}
}

// reaches connects n times from c to addr and fails the test unless every
// connection was answered, by both pods between them. With random selection
// all n land on one pod with probability 2^(1-n): n of 20 or more keeps that
// below one in 500,000 (10 made it one in 512, and CI saw it).
func (e *env) reaches(c *sandbox.Client, addr netip.AddrPort, n int) {
	t := e.t
	t.Helper()
	if n < 20 {
		t.Fatalf("reaches: %d connections cannot tell two pods from one reliably; use 20 or more", n)
	}
	rep, err := c.TCP(e.ctx(), addr, n)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			got[r.Err]++
		} else {
			got[r.Server]++
		}
	}
	if got[e.pods[0].Name]+got[e.pods[1].Name] != n || got[e.pods[0].Name] == 0 || got[e.pods[1].Name] == 0 {
		t.Errorf("%s to %s: %v, want all %d answered by both pods", c.Name, addr, got, n)
	}
}

// modeState is what of each mode the node holds, one line per object.
type modeState struct {
	bpf, ipvs []string
	// nftables are our nftables tables ("ip ebpf-proxy").
	nftables []string
	// iptables are our chains and the jumps to them, by table and chain
	// (the jump's target).
	iptables []ownedRule
}

type ownedRule struct{ backend, table, chain, what string }

func (r ownedRule) String() string { return r.backend + " " + r.table + " " + r.what }

// ipvsChains are the chains the IPVS mode writes (internal/fallback/ipvs,
// rules.go); the iptables mode writes the nat and filter ones too, along
// with many of its own.
var ipvsChains = map[string]bool{
	"nat " + xtables.Prefix + "SERVICES":    true,
	"nat " + xtables.Prefix + "POSTROUTING": true,
	"nat " + xtables.Prefix + "MARK-MASQ":   true,
	"filter " + xtables.Prefix + "FORWARD":  true,
	"mangle " + xtables.Prefix + "FIREWALL": true,
}

// rulesOf returns what of rules belongs only to mode: the IPVS mode's
// mangle table, or the iptables mode's chains the IPVS mode has not.
func rulesOf(mode string, rules []ownedRule) []string {
	var out []string
	for _, r := range rules {
		ipvsChain := ipvsChains[r.table+" "+r.chain]
		if mode == "ipvs" && r.table == "mangle" || mode == "iptables" && !ipvsChain {
			out = append(out, r.String())
		}
	}
	return out
}

// state reads what the modes create: programs attached to the sandbox's
// cgroup and pins under the agent's bpffs directory; our chains and the
// jumps to them in every iptables back end of the node; our nftables
// tables; our IPVS virtual servers, ipsets and dummy interface.
func (e *env) state() modeState {
	t := e.t
	t.Helper()
	var s modeState
	fd, err := unix.Open(e.sb.Cgroup.Path(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCgroupInet4GetPeername,
		ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet6GetPeername} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: at})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Programs {
			s.bpf = append(s.bpf, fmt.Sprintf("program %d attached for %s", p.ID, at))
		}
	}
	err = filepath.WalkDir(e.bpffs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			s.bpf = append(s.bpf, "pin "+strings.TrimPrefix(path, e.bpffs))
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}

	ctx := e.ctx()
	ns := e.node.NS.Path()
	for _, b := range xtables.Usable(ctx, ns) {
		for _, table := range xtables.Tables {
			own, err := xtables.ReadOwned(ctx, &xtables.Runner{Backend: b, Netns: ns}, table, xtables.Prefix)
			if err != nil {
				t.Fatal(err)
			}
			for c := range own.Chains {
				s.iptables = append(s.iptables, ownedRule{b.String(), table, c, "chain " + c})
			}
			for _, j := range own.Jumps {
				s.iptables = append(s.iptables, ownedRule{b.String(), table, xtables.Target(j.Spec), j.Chain + " -> " + xtables.Target(j.Spec)})
			}
		}
	}

	tables, err := nftables.Present(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		s.nftables = append(s.nftables, "table "+table)
	}

	nl := e.node.NS.Netlink()
	if _, err := nl.LinkByName(ipvs.DummyName); err == nil {
		s.ipvs = append(s.ipvs, "interface "+ipvs.DummyName)
	}
	if sets, err := nl.IpsetListAll(); err == nil {
		for _, set := range sets {
			if strings.HasPrefix(set.SetName, xtables.Prefix) {
				s.ipvs = append(s.ipvs, "ipset "+set.SetName)
			}
		}
	}
	if ipvsAvailable(t, e.node) {
		h, err := libipvs.New(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		services, err := h.GetServices()
		if err != nil {
			t.Fatal(err)
		}
		for _, svc := range services {
			s.ipvs = append(s.ipvs, fmt.Sprintf("virtual server %s:%d/%d", svc.Address, svc.Port, svc.Protocol))
		}
	}
	return s
}

// expectOnly fails the test unless the node holds something of mode and
// nothing of the other modes ("" for none at all).
func (e *env) expectOnly(mode string) {
	t := e.t
	t.Helper()
	s := e.state()
	var all []string
	for _, r := range s.iptables {
		all = append(all, r.String())
	}
	for _, m := range []struct {
		name string
		got  []string
	}{
		{"ebpf", s.bpf},
		{"nftables", s.nftables},
		{"iptables", rulesOf("iptables", s.iptables)},
		// The IPVS mode also writes a few iptables rules of its own.
		{"ipvs", append(s.ipvs, rulesOf("ipvs", s.iptables)...)},
	} {
		switch {
		case m.name == mode && len(m.got) == 0:
			t.Errorf("in %s mode the node holds nothing of it", mode)
		case m.name != mode && len(m.got) > 0:
			t.Errorf("in %s mode, %s mode left behind:\n  %s", orNone(mode), m.name, strings.Join(m.got, "\n  "))
		}
	}
	// Outside the fallback modes no chain of ours may exist, not even one
	// both fallbacks write.
	if mode != "iptables" && mode != "ipvs" && len(all) > 0 {
		t.Errorf("in %s mode, iptables rules are left:\n  %s", orNone(mode), strings.Join(all, "\n  "))
	}
}

func orNone(mode string) string {
	if mode == "" {
		return "no"
	}
	return mode
}

// ipvsAvailable reports whether IPVS works in the node's namespace; inside
// the VM runner it must.
func ipvsAvailable(t *testing.T, node *sandbox.Node) bool {
	t.Helper()
	err := ipvs.Available(node.NS.Path())
	if err == nil {
		return true
	}
	if !errors.Is(err, ipvs.ErrNoIPVS) {
		t.Fatalf("probe for IPVS: %v", err)
	}
	if os.Getenv("EBPF_PROXY_VMTEST") != "" {
		t.Fatalf("IPVS must work inside the vmtest VM: %v", err)
	}
	return false
}

// requireIPVS skips a test that needs IPVS on a host whose kernel lacks it
// (test/vmtest runs it on kernels that have it) and fails it in the VM.
func requireIPVS(t *testing.T, node *sandbox.Node) {
	t.Helper()
	if !ipvsAvailable(t, node) {
		var uts unix.Utsname
		_ = unix.Uname(&uts)
		t.Skipf("IPVS is not available on this host's kernel %s; test/vmtest runs this test on kernels that have it",
			unix.ByteSliceToString(uts.Release[:]))
	}
}
