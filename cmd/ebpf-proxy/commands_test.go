package main

import (
	"bytes"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
)

// run executes a command line as main does and returns its exit code and
// output.
func runCLI(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := execute(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestVersionSaysWhatWasBuilt(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runCLI(args...)
		if code != 0 || errOut != "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
		for _, want := range []string{"ebpf-proxy " + version, "commit:", runtime.Version(), "bpf objects: sha256:" + bpfobj.ObjectsHash()} {
			if !strings.Contains(out, want) {
				t.Errorf("%q printed %q, want %q in it", args, out, want)
			}
		}
	}
	if h := bpfobj.ObjectsHash(); len(h) != 64 {
		t.Errorf("BPF object hash %q, want 64 hex digits", h)
	}
}

// A command line the agent cannot mean is refused with exit code 2 and a
// usage hint before anything is touched: an unknown subcommand, a stray
// word, an unknown flag. Each also names a cgroup that does not exist, a
// private bpffs directory and the ebpf mode, so that an agent started by
// mistake fails at once (exit 1) rather than attach anywhere.
func TestUnknownCommandsAndStrayWordsAreRefused(t *testing.T) {
	safe := []string{"--proxy-mode=ebpf", "--cgroup-path=/nonexistent/ebpf-proxy-test", "--bpffs-path=" + t.TempDir(),
		"--manifests=" + t.TempDir(), "--healthz-bind-address=", "--metrics-bind-address=", "--probe-bind-address="}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{append([]string{"monitor"}, safe...), `unknown command "monitor" for "ebpf-proxy"`},
		{append(safe, "stats"), `unknown command "stats" for "ebpf-proxy"`},
		{append([]string{"agent"}, append(safe, "now")...), `unexpected argument "now": "ebpf-proxy agent" takes flags only`},
		{append([]string{"cleanup"}, append(safe, "all")...), `unexpected argument "all": "ebpf-proxy cleanup" takes flags only`},
		{[]string{"version", "now"}, `unexpected argument "now"`},
		{[]string{"dump", "--bpffs-path=" + t.TempDir(), "web"}, `unknown command "web" for "ebpf-proxy dump"`},
		{[]string{"dump", "conntrack", "--bpffs-path=" + t.TempDir(), "now"}, `unexpected argument "now": "ebpf-proxy dump conntrack" takes flags only`},
		{[]string{"dump", "conntrack", "--bpffs-path=" + t.TempDir(), "-o", "entries"}, `-o "entries": want table, wide or json for dump conntrack`},
		{[]string{"dump", "affinity", "--bpffs-path=" + t.TempDir(), "--protocol", "icmp"}, `--protocol "icmp": want tcp, udp or sctp`},
		{[]string{"dump", "maglev", "--bpffs-path=" + t.TempDir(), "--service", "web"}, `--service "web": want namespace/name`},
		{[]string{"dump", "source-ranges", "--bpffs-path=" + t.TempDir(), "--address", "10.0.0"}, `--address "10.0.0": not an IP address`},
		{[]string{"dump", "--bpffs-path=" + t.TempDir(), "conntrack", "-o", "yaml"}, `-o "yaml": want table, wide or json for dump conntrack`},
		{[]string{"dump", "counters", "--bpffs-path=" + t.TempDir(), "--service", "default/web"}, `--service, --address and --protocol do not apply to dump counters`},
		{[]string{"trace", "--node", "--bpffs-path=" + t.TempDir()}, `takes one destination, address:port[/protocol]; got 0 arguments`},
		{[]string{"trace", "--node", "10.96.0.10:53", "now"}, `got 2 arguments`},
		{[]string{"trace", "--node", "10.96.0.10"}, `destination "10.96.0.10": want address:port[/protocol]`},
		{[]string{"trace", "--node", "10.96.0.10:53/icmp"}, `protocol "icmp": want tcp, udp or sctp`},
		{[]string{"trace", "--node", "10.96.0.10:53/udp", "--protocol", "tcp"}, `destination "10.96.0.10:53/udp" and --protocol "tcp" disagree`},
		{[]string{"trace", "10.96.0.10:53"}, `name the client once`},
		{[]string{"trace", "--node", "--pod", "10.244.0.5", "10.96.0.10:53"}, `name the client once`},
		{[]string{"trace", "--source", "198.18.0.2", "10.96.0.10:53"}, `needs both --source (its address) and --device`},
		{[]string{"trace", "--pod", "fd00:10:244::5", "10.96.0.10:53"}, `are not of one IP family`},
		{[]string{"trace", "--pod", "10.244.0.5", "--source-port", "4000", "10.96.0.10:53"}, `--source-port applies to a client from outside`},
		{[]string{"trace", "--node", "-o", "wide", "10.96.0.10:53"}, `-o "wide": want table or json`},
		{append([]string{"--no-such-flag"}, safe...), "unknown flag: --no-such-flag"},
		{[]string{"agent", "--proxy-mode"}, "flag needs an argument"},
	} {
		code, out, errOut := runCLI(tt.args...)
		if code != 2 || !strings.Contains(errOut, tt.want) || !strings.Contains(errOut, "--help") || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q with a usage hint", tt.args, code, out, errOut, tt.want)
		}
	}
}

func TestHelpListsTheSubcommands(t *testing.T) {
	code, out, _ := runCLI("--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, want := range []string{"agent", "cleanup", "dump", "trace", "probe", "version", "--proxy-mode", "--cleanup", "--vmodule", "--log-flush-frequency"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help does not mention %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "completion") {
		t.Errorf("--help offers shell completion, which is not set up:\n%s", out)
	}
}

// kube-proxy's logging flags are accepted, as its command lines carry them.
func TestKubeProxyLoggingFlagsAreAccepted(t *testing.T) {
	o, _, err := load(t, "--vmodule=proxier*=4", "--log-flush-frequency=10s")
	if err != nil {
		t.Fatal(err)
	}
	if o.Vmodule != "proxier*=4" || o.LogFlushFrequency.Seconds() != 10 {
		t.Errorf("vmodule %q, log flush frequency %s", o.Vmodule, o.LogFlushFrequency)
	}
}

func TestDumpWithoutPinsFails(t *testing.T) {
	code, out, errOut := runCLI("dump", "--bpffs-path="+t.TempDir())
	if code != 1 || out != "" || errOut == "" {
		t.Errorf("dump of an empty directory: exit %d, stdout %q, stderr %q; want exit 1 and an error", code, out, errOut)
	}
}

// probe answers as the agent's health does: 0 for 200, 1 for 503 or no
// agent, 2 for a command line it cannot run.
func TestProbeAsksTheAgentsSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	if code, _, errOut := runCLI("probe", "livez", "--api-socket", sock, "--timeout", "2s"); code != 1 || !strings.Contains(errOut, "no answer") {
		t.Errorf("probe with no agent: exit %d, stderr %q; want 1 and no answer", code, errOut)
	}
	live := true
	health := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == api.LivezPath && live {
			fmt.Fprintln(w, `{"healthy":true}`)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, `{"healthy":false}`)
	})
	srv, err := api.Serve(sock, api.NewState(), health, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, c := range []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"livez"}, 0, `{"healthy":true}`, ""},
		{[]string{"healthz"}, 1, `{"healthy":false}`, "503"},
		{[]string{"readyz"}, 2, "", `invalid argument "readyz"`},
		{[]string{}, 2, "", "accepts 1 arg"},
		{[]string{"livez", "--timeout", "0s"}, 2, "", "positive duration"},
	} {
		code, out, errOut := runCLI(append([]string{"probe", "--api-socket", sock}, c.args...)...)
		if code != c.code || strings.TrimSpace(out) != c.out || !strings.Contains(errOut, c.err) {
			t.Errorf("probe %q: exit %d, stdout %q, stderr %q; want %d, %q, stderr with %q", c.args, code, out, errOut, c.code, c.out, c.err)
		}
	}
}

// load parses args as the agent command does, without running it.
func load(t *testing.T, args ...string) (*config.Options, []string, error) {
	t.Helper()
	o := modes.NewOptions()
	cmd := agentCommand("agent", "", false, o)
	if err := cmd.ParseFlags(args); err != nil {
		return o, nil, err
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return o, nil, err
	}
	notes, err := config.FinishFlags(o, cmd.Flags())
	if err == nil {
		err = modes.Validate(o)
	}
	return o, notes, err
}

// A stray word after the agent's flags is refused before anything is
// touched, as kube-proxy refuses positional arguments (commands_test.go
// checks the whole command line, subcommands included).
func TestStrayArgumentsAreRefused(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"trace", "10.96.0.10"}, {"--proxy-mode=ebpf", "agent"}} {
		if _, _, err := load(t, args...); err == nil || !strings.Contains(err.Error(), "unexpected argument") {
			t.Errorf("%q: %v, want a refusal naming the unexpected argument", args, err)
		}
	}
	if _, _, err := load(t, "--proxy-mode=iptables"); err != nil {
		t.Errorf("flags alone: %v", err)
	}
}

// dump refuses bad flag values with exit code 2 and says which, before
// opening any map.
func TestDumpRefusesBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "yaml"}, `-o "yaml"`},
		{[]string{"--service", "web"}, `--service "web": want namespace/name`},
		{[]string{"--address", "nope"}, `--address "nope": not an IP address`},
		{[]string{"--protocol", "icmp"}, `--protocol "icmp": want tcp, udp or sctp`},
	} {
		code, out, errOut := runCLI(append([]string{"dump", "--bpffs-path=" + t.TempDir()}, c.args...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("dump %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, out, errOut, c.want)
		}
	}
}
