package modes_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"

	"golang.org/x/sys/unix"
)

// bpfFailureEnv is the agent's test hook that makes the BPF dataplane fail
// at start-up (cmd/ebpf-proxy, testBPFFailureEnv).
const bpfFailureEnv = "EBPF_PROXY_TEST_BPF_FAILURE"

func TestAutoModeFallsBackWhenTheBPFDataplaneCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failure string
		reason  string
	}{
		{"the kernel lacks a BPF feature", "probe", "bpf-unsupported"},
		{"the BPF programs fail to load", "load", "bpf-load-failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			hostEstablished := readSysctl(t, conntrackEstablished)
			// nftables where nft works in the node's namespace (it must
			// on the hosts and VMs the tests run on), else iptables;
			// never ipvs, which runs only when named.
			wantMode, wantReason := "nftables", tc.reason
			if err := nftables.Available(e.ctx(), e.node.NS.Path()); err != nil {
				t.Logf("nftables does not work here (%v): auto falls through to iptables", err)
				wantMode, wantReason = "iptables", tc.reason+",nftables-unavailable"
			}
			a := e.startAgent("auto", bpfFailureEnv+"="+tc.failure)

			if got := get(t, a, "/proxyMode"); got != wantMode {
				t.Errorf("/proxyMode %q, want %q", got, wantMode)
			}
			metrics := get(t, a, "/metrics")
			if series := fmt.Sprintf(`ebpfproxy_proxy_mode{mode=%q,reason=%q} 1`, wantMode, wantReason); !strings.Contains(metrics, series) {
				t.Errorf("/metrics lacks %s:\n%s", series, grep(metrics, "ebpfproxy_proxy_mode"))
			}
			if wantMode == "nftables" {
				if name := `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0`; !strings.Contains(metrics, name) {
					t.Errorf("/metrics lacks %s:\n%s", name, grep(metrics, "nftables"))
				}
			}
			if wantMode == "iptables" {
				for _, name := range []string{`kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}`,
					`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 0`} {
					if !strings.Contains(metrics, name) {
						t.Errorf("/metrics lacks %s:\n%s", name, grep(metrics, "iptables"))
					}
				}
			}
			if line := grep(a.Logs(), "proxy mode chosen"); !strings.Contains(line, fmt.Sprintf(`"mode":%q`, wantMode)) ||
				!strings.Contains(line, fmt.Sprintf(`"reason":%q`, wantReason)) {
				t.Errorf("log line of the choice %q, want mode %s and reason %s", line, wantMode, wantReason)
			}
			e.expectOnly(wantMode)
			e.expectConntrackDefaults(a, hostEstablished)

			nodePortAddr := netip.AddrPortFrom(e.node.IP, nodePort)
			e.reaches(e.client, netip.AddrPortFrom(clusterIP, 80), 20)
			e.reaches(e.client, nodePortAddr, 20)
			e.reaches(e.external, nodePortAddr, 20)
		})
	}
}

// A node with no bpf filesystem where the maps are pinned (none mounted at
// /sys/fs/bpf, as on a fresh machine) gets one mounted by the agent, which
// then runs the BPF dataplane under auto instead of falling back with
// bpf-load-failed.
func TestAutoModeMountsABPFFSWhereNoneIsMounted(t *testing.T) {
	e := newEnv(t)
	root := t.TempDir()
	if on, err := isBPFFS(root); err != nil || on {
		t.Fatalf("%s: on a bpffs %t (%v): want a directory on none", root, on, err)
	}
	mountPoint := filepath.Join(root, "bpf")
	e.bpffs = filepath.Join(mountPoint, "ebpf-proxy")
	// After the agent's own cleanup (registered later, run first):
	// unpin, then unmount what the agent mounted.
	t.Cleanup(func() {
		if on, _ := isBPFFS(mountPoint); on {
			e.cleanup()
			if err := unix.Unmount(mountPoint, 0); err != nil {
				t.Errorf("unmount the agent's bpffs %s: %v", mountPoint, err)
			}
		}
	})
	a := e.startAgent("auto")
	if got := get(t, a, "/proxyMode"); got != "ebpf" {
		t.Errorf("/proxyMode %q, want ebpf", got)
	}
	if series := `ebpfproxy_proxy_mode{mode="ebpf",reason="bpf-supported"} 1`; !strings.Contains(get(t, a, "/metrics"), series) {
		t.Errorf("/metrics lacks %s", series)
	}
	if on, err := isBPFFS(mountPoint); err != nil || !on {
		t.Errorf("%s is on a bpffs: %t (%v), want the agent's mount", mountPoint, on, err)
	}
	if line := grep(a.Logs(), "mounted a bpf filesystem"); !strings.Contains(line, mountPoint) {
		t.Errorf("no log line of the mount on %s:\n%s", mountPoint, a.Logs())
	}
	if line := grep(a.Logs(), "proxy mode set by"); !strings.Contains(line, `"setting":"--proxy-mode"`) {
		t.Errorf("log line of what set the mode %q, want --proxy-mode", line)
	}
	e.expectOnly("ebpf")
	e.reaches(e.client, netip.AddrPortFrom(clusterIP, 80), 20)
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP, nodePort), 20)
}

// isBPFFS reports whether path is on a bpf filesystem.
func isBPFFS(path string) (bool, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return false, err
	}
	return fs.Type == unix.BPF_FS_MAGIC, nil
}

func TestExplicitEBPFModeFailsWhenTheBPFDataplaneCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		failure string
		want    string
	}{
		{"the kernel lacks a BPF feature", "probe", "kernel lacks a required BPF feature"},
		{"the BPF programs fail to load", "load", "load BPF programs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			a := e.launch(e.agentArgs("ebpf"), bpfFailureEnv+"="+tc.failure)
			if err := a.ExitWithin(t, time.Minute); err == nil {
				t.Fatalf("agent in ebpf mode ran although the BPF dataplane failed:\n%s", a.Logs())
			}
			if !strings.Contains(a.Logs(), tc.want) {
				t.Errorf("agent log does not say %q:\n%s", tc.want, a.Logs())
			}
			e.expectOnly("")
		})
	}
}

// TestModeSwitchesBetweenEBPFIPTablesAndNFTables restarts the agent in
// ebpf>iptables>nftables>ebpf>nftables>iptables>ebpf mode: every switch
// between the three, in both directions (modeSwitches).
func TestModeSwitchesBetweenEBPFIPTablesAndNFTables(t *testing.T) {
	modeSwitches(t, newEnv(t), "ebpf", "iptables", "nftables", "ebpf", "nftables", "iptables", "ebpf")
}

// TestModeSwitchesToAndFromIPVS restarts the agent in
// iptables>ipvs>ebpf>ipvs>nftables>ipvs>iptables mode: every switch to and
// from IPVS (modeSwitches).
func TestModeSwitchesToAndFromIPVS(t *testing.T) {
	e := newEnv(t)
	requireIPVS(t, e.node)
	modeSwitches(t, e, "iptables", "ipvs", "ebpf", "ipvs", "nftables", "ipvs", "iptables")
}

// modeSwitches starts the agent in each of modes in turn, one agent start
// per switch, while a client connects to the ClusterIP every 20ms: every
// connection is answered, and after each start the node holds nothing of
// the earlier modes.
func modeSwitches(t *testing.T, e *env, modes ...string) {
	vip := netip.AddrPortFrom(clusterIP, 80)
	var loop *sandbox.Loop
	for i, mode := range modes {
		// When each agent started, was ready and stopped, to set beside
		// the times of failed connections.
		t.Logf("%s: starting the agent in %s mode", stamp(), mode)
		a := e.startAgent(mode)
		t.Logf("%s: the agent in %s mode has synced and removed what other modes left", stamp(), mode)
		e.expectOnly(mode)
		if got := get(t, a, "/proxyMode"); got != mode {
			t.Errorf("/proxyMode %q, want %q", got, mode)
		}
		e.reaches(e.client, vip, 24)
		if i == 0 {
			var err error
			if loop, err = e.client.StartLoop(e.ctx(), vip, sandbox.LoopOptions{Interval: 20 * time.Millisecond, MaxDuration: 10 * time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		// Between two agents the rules of the earlier one serve.
		a.Terminate(t, time.Minute)
		t.Logf("%s: the agent in %s mode has stopped", stamp(), mode)
	}
	res := loop.StopUnbroken(t, "across the mode switches")
	if len(res.Servers) != 2 {
		t.Errorf("connections reached %v, want both pods", res.Servers)
	}
}

func TestCleanupRemovesWhatEveryModeCreated(t *testing.T) {
	for _, tc := range []struct {
		mode string
		ipvs bool
		// subcommand: clean up with `ebpf-proxy cleanup` rather than
		// kube-proxy's --cleanup.
		subcommand bool
	}{
		{"ebpf", false, false},
		{"iptables", false, true},
		{"ipvs", true, false},
		{"nftables", false, false},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			e := newEnv(t)
			if tc.ipvs {
				requireIPVS(t, e.node)
			}
			a := e.startAgent(tc.mode)
			e.expectOnly(tc.mode)
			a.Terminate(t, time.Minute)
			// Stopped, the agent leaves its dataplane in place.
			e.expectOnly(tc.mode)
			if tc.subcommand {
				e.cleanupWith(agent.CleanupCommand)
			} else {
				e.cleanup()
			}
			e.expectOnly("")
			// A second run has nothing to do and succeeds.
			e.cleanup()
		})
	}
}

// stamp is the time of day as a loop's failures show it.
func stamp() string { return time.Now().Format(sandbox.LoopTimeFormat) }

// grep returns the lines of text that contain s.
func grep(text, s string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

const (
	conntrackEstablished = "net/netfilter/nf_conntrack_tcp_timeout_established"
	conntrackCloseWait   = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
)

// readSysctl reads an integer under /proc/sys in the test's own (the
// host's) network namespace.
func readSysctl(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// expectConntrackDefaults checks that a fallback-mode agent applied
// kube-proxy's connection tracking defaults in its node's namespace (24h
// established, 1h CLOSE_WAIT) after its first sync, and left the host's
// namespace as it was.
func (e *env) expectConntrackDefaults(a *agent.Process, hostEstablished int) {
	t := e.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(a.Logs(), "nf_conntrack_tcp_timeout_close_wait") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	got := map[string]int{}
	err := e.node.NS.Do(func() error {
		for _, name := range []string{conntrackEstablished, conntrackCloseWait} {
			b, err := os.ReadFile("/proc/sys/" + name)
			if err != nil {
				return err
			}
			if got[name], err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got[conntrackEstablished] != 86400 || got[conntrackCloseWait] != 3600 {
		t.Errorf("node namespace: %v, want kube-proxy's 86400 and 3600\n%s", got, grep(a.Logs(), "conntrack"))
	}
	if h := readSysctl(t, conntrackEstablished); h != hostEstablished {
		t.Errorf("the host's %s changed from %d to %d", conntrackEstablished, hostEstablished, h)
	}
}
