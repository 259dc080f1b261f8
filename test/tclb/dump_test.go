package tclb_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

// After real traffic from outside through the agent's TC programs, the
// views of `ebpf-proxy dump` show it by Service name: the NodePort flow
// (under source NAT) in conntrack, the client's session affinity entry,
// the Maglev table of a Service and the source ranges of a LoadBalancer
// IP.
func TestAgentDumpViews(t *testing.T) {
	e := newTopology(t)
	node := e.nodes[0]
	dir := t.TempDir()
	e.writeAgentManifests(t, dir)
	podB := e.pods["pod-b"].IP
	http := builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http")))
	epB := []discoveryv1.Endpoint{builders.Endpoint(podB.String(), "node-b")}
	sticky := builders.Service("default", "sticky", builders.ClusterIP("10.96.0.82"), http, builders.NodePort(30082), builders.Affinity(600))
	ranged := builders.Service("default", "ranged", builders.ClusterIP("10.96.0.83"), http, builders.LoadBalancer(30083, rangedIP.String()),
		builders.SourceRanges(netip.PrefixFrom(e.client.IP, 32).String()))
	if err := builders.WriteManifest(dir, "more.yaml",
		sticky, builders.EndpointSlice("default", "sticky-1", "sticky", epB),
		ranged, builders.EndpointSlice("default", "ranged-1", "ranged", epB)); err != nil {
		t.Fatal(err)
	}
	cg, err := e.sb.AddCgroup("agent")
	if err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(e.sb.BPFFS.Path(), "agent")
	t.Cleanup(func() { agent.Cleanup(context.Background(), node.NS.Path(), bpffs) })
	sock := filepath.Join(t.TempDir(), "agent.sock")
	const tableSize = 1021
	a := e.startAgent(t, dir, bpffs, cg, "--api-socket", sock, "--lb-algorithm", "maglev", "--maglev-table-size", "1021")
	defer a.Terminate(t, 15*time.Second)
	// startAgent waits for a first sync of either family: wait for the
	// IPv4 one, which programs the four ServicePorts.
	if err := a.WaitLog(time.Minute, []string{`"ipFamily":"IPv4","servicePorts":4`}); err != nil {
		t.Fatalf("the agent never synced the IPv4 ServicePorts: %v", err)
	}

	remote := netip.AddrPortFrom(node.IP, 30080)
	e.expectServed(t, e.client, remote, 2, "pod-b", node.IP)
	e.expectServed(t, e.client, netip.AddrPortFrom(node.IP, 30082), 2, "pod-b", node.IP)
	e.expectServed(t, e.client, netip.AddrPortFrom(rangedIP, 80), 1, "pod-b", node.IP)

	view := func(v any, args ...string) string {
		t.Helper()
		out, errOut, err := agent.DumpWith(bpffs, append(args, "--api-socket", sock, "-o", "json")...)
		if err != nil {
			t.Fatal(err)
		}
		if errOut != "" {
			t.Errorf("dump %q with the agent up said on stderr: %s", args, errOut)
		}
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("dump %q -o json: %v\n%s", args, err, out)
		}
		return out
	}

	// conntrack: the client's NodePort flow to remote, translated to
	// pod-b and source NATed to the node's address.
	var ct dump.ConntrackReport
	out := view(&ct, "conntrack", "--service", "default/remote")
	var orig []dump.Conntrack
	for _, f := range ct.Flows {
		if f.Service.Namespace != "default" || f.Service.Name != "remote" || f.Service.Port != "http" || f.Protocol != "TCP" ||
			f.Frontend != remote || f.Client.Addr() != e.client.IP {
			t.Errorf("--service default/remote gave %+v, want the client's flows to %s named default/remote:http", f, remote)
		}
		if f.Direction == dump.DirectionOriginal {
			orig = append(orig, f)
		}
	}
	if len(orig) != 2 || !ct.Named {
		t.Fatalf("conntrack: want the 2 connections' original entries, named:\n%s", out)
	}
	for _, f := range orig {
		if f.Backend != netip.AddrPortFrom(podB, 8080) || f.SNAT.Addr() != node.IP || f.SNAT.Port() == 0 ||
			!strings.Contains(f.Flags, "snat") || f.AgeSeconds < 0 || f.AgeSeconds > 120 {
			t.Errorf("flow %+v, want backend %s:8080, source NAT to %s, made in the last 2 minutes", f, podB, node.IP)
		}
	}
	table, _, err := agent.DumpWith(bpffs, "conntrack", "--api-socket", sock, "--address", e.client.IP.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump conntrack:\n%s", table)
	if !strings.Contains(table, "default/remote:http") || !strings.Contains(table, "default/sticky:http") ||
		!strings.Contains(table, remote.String()) {
		t.Errorf("dump conntrack --address %s: want remote's and sticky's flows:\n%s", e.client.IP, table)
	}
	if view(&ct, "conntrack", "--protocol", "udp"); len(ct.Flows) != 0 {
		t.Errorf("--protocol udp: %+v, want no flow", ct.Flows)
	}

	// affinity: the client's address for sticky, held to pod-b.
	var af dump.AffinityReport
	out = view(&af, "affinity")
	if len(af.Entries) != 1 {
		t.Fatalf("affinity: want one entry:\n%s", out)
	}
	if en := af.Entries[0]; en.Service.Name != "sticky" || en.Client != e.client.IP || en.Backend != netip.AddrPortFrom(podB, 8080) ||
		!slices.Contains(en.Frontends, netip.AddrPortFrom(node.IP, 30082)) || en.AgeSeconds < 0 || en.AgeSeconds > 120 {
		t.Errorf("affinity entry %+v, want sticky's for %s on %s:8080, used in the last 2 minutes", en, e.client.IP, podB)
	}
	table, _, _ = agent.DumpWith(bpffs, "affinity", "--api-socket", sock)
	t.Logf("dump affinity:\n%s", table)

	// maglev: remote's table, every slot pod-b's.
	var mg dump.MaglevReport
	out = view(&mg, "maglev", "--service", "default/remote")
	if len(mg.Tables) != 1 {
		t.Fatalf("maglev --service default/remote: want one table:\n%s", out)
	}
	if m := mg.Tables[0]; m.Size != tableSize || len(m.Backends) != 1 || m.Backends[0].Address != podB || m.Backends[0].Slots != tableSize ||
		!slices.Contains(m.Frontends, remote) {
		t.Errorf("maglev table %+v, want %d slots, all pod-b's", m, tableSize)
	}
	table, _, _ = agent.DumpWith(bpffs, "maglev", "--api-socket", sock)
	t.Logf("dump maglev:\n%s", table)

	// source-ranges: ranged's LoadBalancer IP admits the client alone.
	var sr dump.SourceRangesReport
	out = view(&sr, "source-ranges")
	if len(sr.Frontends) != 1 {
		t.Fatalf("source-ranges: want ranged's LoadBalancer IP:\n%s", out)
	}
	if s := sr.Frontends[0]; s.Service.Name != "ranged" || s.Frontend != netip.AddrPortFrom(rangedIP, 80) ||
		!slices.Contains(s.CIDRs, netip.PrefixFrom(e.client.IP, 32)) {
		t.Errorf("source ranges %+v, want ranged's %s:80 admitting %s/32", s, rangedIP, e.client.IP)
	}
	table, _, _ = agent.DumpWith(bpffs, "source-ranges", "--api-socket", sock)
	t.Logf("dump source-ranges:\n%s", table)
}
