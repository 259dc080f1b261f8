package socklb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// `ebpf-proxy dump` names what the real agent programmed: the Service by
// namespace/name with its ClusterIP and its backends with their states,
// read from the pinned maps and named through the agent's local API; once
// the agent is gone it falls back to the maps' ids and says so.
func TestAgentDumpNamesServices(t *testing.T) {
	e := newSandbox(t, 2)
	dir := t.TempDir()
	writeManifests(t, dir, e.pods[0], e.pods[1])
	sock := filepath.Join(t.TempDir(), "run", "agent.sock")
	a := e.startAgent(t, dir, "--api-socket", sock)

	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatalf("the agent made no API socket: %v", err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("API socket mode %v, want a socket with mode 0600", fi.Mode())
	}

	pods := map[netip.Addr]bool{}
	for _, p := range e.pods {
		pods[p.IP] = true
	}
	checkJSON := func(wantState string, want map[netip.Addr]bool) {
		t.Helper()
		out, errOut, err := agent.DumpWith(e.bpffs, "--api-socket", sock, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		if errOut != "" {
			t.Errorf("dump -o json with the agent up said on stderr: %s", errOut)
		}
		var r dump.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("dump -o json: %v\n%s", err, out)
		}
		if !r.Named || r.Node != nodeName || len(r.Services) != 1 {
			t.Fatalf("dump -o json: named %v node %q, %d services, want web alone, named on %s:\n%s", r.Named, r.Node, len(r.Services), nodeName, out)
		}
		s := r.Services[0]
		if s.Namespace != "default" || s.Name != "web" || s.Port != "http" || s.Protocol != "TCP" || len(s.Frontends) != 1 {
			t.Fatalf("dump -o json: %+v, want default/web port http, TCP, one frontend", s)
		}
		f := s.Frontends[0]
		if netip.AddrPortFrom(f.Address, f.Port) != webVIP || f.Kind != "ClusterIP" || f.Verdict != "forward" || f.TrafficPolicy != "Cluster" {
			t.Errorf("frontend %+v, want the ClusterIP %s forwarding under policy Cluster", f, webVIP)
		}
		got := map[netip.Addr]bool{}
		for _, b := range f.Backends {
			got[b.Address] = true
			if b.Port != 8080 || b.State != wantState || !b.Local || b.ID == 0 {
				t.Errorf("backend %+v, want port 8080, %s, local, with an id", b, wantState)
			}
		}
		if len(got) != len(want) || f.Count != len(want) {
			t.Errorf("backends %v (count %d), want %v", got, f.Count, want)
		}
		for ip := range want {
			if !got[ip] {
				t.Errorf("backend %s missing from %v", ip, got)
			}
		}
	}
	checkJSON("ready", pods)

	table, _, err := agent.DumpWith(e.bpffs, "--api-socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump:\n%s", table)
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "SERVICE") {
		t.Fatalf("table: want a header and one line:\n%s", table)
	}
	row := strings.Fields(lines[1])
	if len(row) < 5 || row[0] != "default/web" || row[1] != "http" || row[2] != webVIP.String()+"/TCP" || row[3] != "ClusterIP" || row[4] != "2" {
		t.Errorf("table row %q, want default/web http %s/TCP ClusterIP 2 ...", lines[1], webVIP)
	}
	for _, p := range e.pods {
		if !strings.Contains(lines[1], p.IP.String()+":8080 ready local") {
			t.Errorf("table row lacks %s:8080 ready local: %q", p.IP, lines[1])
		}
	}
	if out, _, err := agent.DumpWith(e.bpffs, "--api-socket", sock, "--service", "default/other"); err != nil || strings.Contains(out, "default/web") {
		t.Errorf("--service default/other: %v\n%s", err, out)
	}

	// Both endpoints terminating but serving: the agent falls back to
	// them, and dump says they are serving.
	var eps []discoveryv1.Endpoint
	for _, p := range e.pods {
		eps = append(eps, builders.Endpoint(p.IP.String(), nodeName, builders.Terminating))
	}
	web := builders.Service("default", "web", builders.ClusterIP(webVIP.Addr().String()),
		builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http"))))
	if err := builders.WriteManifest(dir, "web.yaml", web, builders.EndpointSlice("default", "web-1", "web", eps)); err != nil {
		t.Fatal(err)
	}
	if err := testbed.Poll(e.ctx(), "dump shows both backends serving (terminating)", 15*time.Second, func() (bool, error) {
		out, _, err := agent.DumpWith(e.bpffs, "--api-socket", sock)
		if err != nil {
			return false, err
		}
		return strings.Count(out, ":8080 serving local") == 2, fmt.Errorf("dump:\n%s", out)
	}); err != nil {
		t.Fatal(err)
	}
	checkJSON("serving", pods)

	// The agent gone, its socket goes with it, and dump shows the maps'
	// ids, saying why on one line of stderr.
	if err := a.SignalAndWait(t, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Errorf("agent exit on SIGTERM: %v", err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("API socket left after the agent stopped: %v", err)
	}
	out, errOut, err := agent.DumpWith(e.bpffs, "--api-socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump without the agent:\n%s%s", errOut, out)
	if n := strings.Count(errOut, "\n"); n != 1 || !strings.Contains(errOut, "no agent answered on "+sock) {
		t.Errorf("stderr without the agent: %q, want one line saying no agent answered on %s", errOut, sock)
	}
	if strings.Contains(out, "default/web") || !strings.Contains(out, "svc=") || !strings.Contains(out, webVIP.String()+"/TCP") {
		t.Errorf("dump without the agent: want the ClusterIP under its svc id, no name:\n%s", out)
	}
	for _, p := range e.pods {
		if !strings.Contains(out, p.IP.String()+":8080 terminating local") {
			t.Errorf("dump without the agent lacks %s:8080 terminating local (the map's flags):\n%s", p.IP, out)
		}
	}
}

// After connections from a pod to a ClusterIP with session affinity
// through the real agent's socket programs, `ebpf-proxy dump affinity`
// shows the pod's entry: its network namespace as the client, the Service
// by name, and the backend that served every connection.
func TestAgentDumpAffinityNamesPodClients(t *testing.T) {
	e := newSandbox(t, 2)
	dir := t.TempDir()
	web := builders.Service("default", "web", builders.ClusterIP(webVIP.Addr().String()), builders.Affinity(600),
		builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http"))))
	if err := builders.WriteManifest(dir, "web.yaml", web, builders.EndpointSlice("default", "web-1", "web", podEndpoints(e.pods))); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	a := e.startAgent(t, dir, "--api-socket", sock)
	if err := a.WaitLog(time.Minute, []string{`"ipFamily":"IPv4","servicePorts":1`}); err != nil {
		t.Fatalf("the agent never synced web: %v", err)
	}

	rep, err := e.client.TCP(context.Background(), webVIP, 4)
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, r := range rep.Results {
		if r.Err != "" {
			t.Fatalf("connection to %s: %+v", webVIP, r)
		}
		served[r.Server] = true
	}
	var backend netip.Addr
	for _, p := range e.pods {
		if served[p.Name] {
			backend = p.IP
		}
	}
	if len(served) != 1 || !backend.IsValid() {
		t.Fatalf("affinity: served by %v, want one pod", served)
	}
	var cookie uint64
	if err := e.client.NS.Do(func() (err error) { cookie, err = loader.NetnsCookie(); return err }); err != nil {
		t.Fatal(err)
	}

	out, errOut, err := agent.DumpWith(e.bpffs, "affinity", "--api-socket", sock, "-o", "json")
	if err != nil || errOut != "" {
		t.Fatalf("dump affinity: %v %s", err, errOut)
	}
	var r dump.AffinityReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("dump affinity -o json: %v\n%s", err, out)
	}
	if len(r.Entries) != 1 {
		t.Fatalf("dump affinity: want the client pod's entry alone:\n%s", out)
	}
	en := r.Entries[0]
	if en.Service.String() != "default/web:http" || en.Protocol != "TCP" || en.NetnsCookie != cookie || en.Client.IsValid() ||
		en.Backend != netip.AddrPortFrom(backend, tcpPort) || !slices.Contains(en.Frontends, webVIP) || en.AgeSeconds < 0 || en.AgeSeconds > 120 {
		t.Errorf("affinity entry %+v, want default/web:http for netns %d on %s:%d, used in the last 2 minutes", en, cookie, backend, tcpPort)
	}
	table, _, err := agent.DumpWith(e.bpffs, "affinity", "--api-socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump affinity:\n%s", table)
	if !strings.Contains(table, "netns:"+strconv.FormatUint(cookie, 10)) || !strings.Contains(table, "default/web:http") {
		t.Errorf("dump affinity table lacks the pod's netns or web:\n%s", table)
	}

	// The agent gone, the entry stays (the programs' map) and shows under
	// web's id, with one line on stderr saying why.
	a.Terminate(t, 15*time.Second)
	table, errOut, err = agent.DumpWith(e.bpffs, "affinity", "--api-socket", sock)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "no agent answered on "+sock) || strings.Count(errOut, "\n") != 1 ||
		strings.Contains(table, "default/web") || !strings.Contains(table, "svc=") || !strings.Contains(table, "netns:"+strconv.FormatUint(cookie, 10)) {
		t.Errorf("dump affinity without the agent: stderr %q, want one line saying no agent answered; table with the id, not the name:\n%s", errOut, table)
	}
}
