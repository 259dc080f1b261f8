package nfconntrack

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// fakeProc is a /proc/sys and a hashsize file holding the kernel's
// defaults, in a directory of the test.
func fakeProc(t *testing.T) (Env, func(name string) int) {
	t.Helper()
	root := t.TempDir()
	files := map[string]int{
		"net/netfilter/nf_conntrack_max":                     65536,
		"net/netfilter/nf_conntrack_tcp_timeout_established": 432000,
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  60,
		"net/netfilter/nf_conntrack_tcp_be_liberal":          0,
		"net/netfilter/nf_conntrack_udp_timeout":             30,
		"net/netfilter/nf_conntrack_udp_timeout_stream":      120,
		"hashsize": 16384,
	}
	for name, v := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(strconv.Itoa(v)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := Env{Sys: sysctl.Sysctl{Root: root}, Hashsize: filepath.Join(root, "hashsize")}
	return env, func(name string) int {
		v, err := sysctl.ReadIntFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestConntrackSettingsPerMode(t *testing.T) {
	ptr := func(d time.Duration) *time.Duration { return &d }
	zero := int32(0)
	cpus := numCPU()
	wantMax := max(32768*cpus, 131072)
	for _, tc := range []struct {
		name string
		// nat: the mode's Service NAT lives in conntrack.
		nat  bool
		c    Settings
		want map[string]int
	}{
		{"iptables: kube-proxy's defaults", true, Settings{}, map[string]int{
			"net/netfilter/nf_conntrack_max": wantMax, "hashsize": max(16384, wantMax/4),
			"net/netfilter/nf_conntrack_tcp_timeout_established": 86400, "net/netfilter/nf_conntrack_tcp_timeout_close_wait": 3600,
			"net/netfilter/nf_conntrack_udp_timeout": 30, "net/netfilter/nf_conntrack_tcp_be_liberal": 0,
		}},
		{"ebpf with nf_conntrack loaded: kube-proxy's defaults", false, Settings{}, map[string]int{
			"net/netfilter/nf_conntrack_max": wantMax, "hashsize": max(16384, wantMax/4),
			"net/netfilter/nf_conntrack_tcp_timeout_established": 86400, "net/netfilter/nf_conntrack_tcp_timeout_close_wait": 3600,
		}},
		{"ebpf with nf_conntrack loaded: what is given, the defaults for the rest", false, Settings{TCPEstablished: ptr(2 * time.Hour), UDPTimeout: ptr(10 * time.Second)}, map[string]int{
			"net/netfilter/nf_conntrack_max": wantMax, "net/netfilter/nf_conntrack_tcp_timeout_established": 7200,
			"net/netfilter/nf_conntrack_udp_timeout": 10, "net/netfilter/nf_conntrack_tcp_timeout_close_wait": 3600,
		}},
		{"ipvs: max-per-core 0 leaves the size, timeouts 0 leave theirs", true, Settings{MaxPerCore: &zero, TCPEstablished: ptr(0)}, map[string]int{
			"net/netfilter/nf_conntrack_max": 65536, "hashsize": 16384, "net/netfilter/nf_conntrack_tcp_timeout_established": 432000,
			"net/netfilter/nf_conntrack_tcp_timeout_close_wait": 3600,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, read := fakeProc(t)
			if err := Setup(env, tc.c, tc.nat, zap.NewNop()); err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.want {
				if got := read(name); got != want {
					t.Errorf("%s = %d, want %d", name, got, want)
				}
			}
		})
	}
}

// In ebpf mode, where nf_conntrack is not loaded, nothing is written and
// nothing fails: the BPF programs track their own flows, and nothing else
// on the node tracks any.
func TestConntrackUntouchedWithoutTheModuleInEBPFMode(t *testing.T) {
	env, _ := fakeProc(t)
	if err := os.RemoveAll(filepath.Join(env.Sys.Root, "net/netfilter")); err != nil {
		t.Fatal(err)
	}
	if env.Tracking() {
		t.Fatal("Tracking() with no net/netfilter parameters")
	}
	if err := Setup(env, Settings{}, false, zap.NewNop()); err != nil {
		t.Errorf("Setup without nf_conntrack: %v, want nothing done", err)
	}
	if _, err := os.Stat(filepath.Join(env.Sys.Root, "net/netfilter")); !os.IsNotExist(err) {
		t.Errorf("Setup wrote under net/netfilter without nf_conntrack (%v)", err)
	}
}

// A parameter this namespace may not write (nf_conntrack_max outside the
// initial network namespace) is reported, and the others are still set.
func TestConntrackReadOnlyMaxIsReportedNotFatal(t *testing.T) {
	env, read := fakeProc(t)
	// A directory in the file's place refuses the write even to root,
	// who ignores file modes.
	p := filepath.Join(env.Sys.Root, "net/netfilter/nf_conntrack_max")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o555); err != nil {
		t.Fatal(err)
	}
	err := Setup(env, Settings{}, true, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "nf_conntrack_max") {
		t.Errorf("error %v, want one naming nf_conntrack_max", err)
	}
	if got := read("net/netfilter/nf_conntrack_tcp_timeout_established"); got != 86400 {
		t.Errorf("established timeout %d: the other settings must still be applied", got)
	}
}
