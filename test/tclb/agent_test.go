package tclb_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// writeAgentManifests writes the agent's view of node-a: its Node object,
// with the address that makes eth0 the device to attach to, and two
// NodePort Services, remote with pod-b on node-b and local
// (externalTrafficPolicy Local) with pod-a.
func (e *env) writeAgentManifests(t *testing.T, dir string) {
	t.Helper()
	node := builders.Node("node-a", builders.NodeAddresses(v1.NodeAddress{Type: v1.NodeInternalIP, Address: e.nodes[0].IP.String()}))
	http := builders.Ports(builders.Port("http", 80, v1.ProtocolTCP, intstr.FromString("http")))
	remote := builders.Service("default", "remote", builders.ClusterIP("10.96.0.80"), http, builders.NodePort(30080))
	local := builders.Service("default", "local", builders.ClusterIP("10.96.0.81"), http, builders.NodePort(30081), builders.ExternalLocal(0))
	err := builders.WriteManifest(dir, "node-a.yaml", node,
		remote, builders.EndpointSlice("default", "remote-1", "remote", []discoveryv1.Endpoint{builders.Endpoint(e.pods["pod-b"].IP.String(), "node-b")}),
		local, builders.EndpointSlice("default", "local-1", "local", []discoveryv1.Endpoint{builders.Endpoint(e.pods["pod-a"].IP.String(), "node-a")}))
	if err != nil {
		t.Fatal(err)
	}
}

// startAgent runs the agent in node-a's namespace, with its socket programs
// on a cgroup of their own (the external client's probes must not pass
// them) and its pins under bpffs, and waits until it has attached its TC
// programs and synced.
func (e *env) startAgent(t *testing.T, dir, bpffs string, cg *sandbox.Cgroup, extra ...string) *agent.Process {
	t.Helper()
	args := append([]string{"--manifests", dir, "--cgroup-path", cg.Path(), "--bpffs-path", bpffs,
		"--hostname-override", "node-a", "--healthz-bind-address", "", "--metrics-bind-address", "", "--probe-bind-address", "", "-v", "2",
		"--api-socket", filepath.Join(t.TempDir(), "agent.sock")}, extra...)
	a := agent.Run(t, agent.Options{Args: args, Netns: e.nodes[0].NS.Path()})
	if err := a.WaitLog(2*time.Minute, []string{"first sync done in every IP family", "TC programs attached"}); err != nil {
		t.Fatalf("agent did not attach and sync: %v\n%s", err, a.Logs())
	}
	return a
}

// TestAgent: the agent finds its device from the Node's address, serves
// NodePorts to the outside, keeps serving after it exits and across a
// restart, and --cleanup removes the TC programs.
func TestAgent(t *testing.T) {
	for _, mode := range []string{loader.TCAttachAuto, loader.TCAttachClsact} {
		name := mode
		if name == "" {
			name = "auto"
		}
		t.Run(name, func(t *testing.T) {
			e := newTopology(t)
			a := e.nodes[0]
			dir := t.TempDir()
			e.writeAgentManifests(t, dir)
			cg, err := e.sb.AddCgroup("agent")
			if err != nil {
				t.Fatal(err)
			}
			bpffs := filepath.Join(e.sb.BPFFS.Path(), "agent")
			cleanup := func() error {
				_, err := agent.Cleanup(context.Background(), a.NS.Path(), bpffs)
				return err
			}
			t.Cleanup(func() { cleanup() })

			remote := netip.AddrPortFrom(a.IP, 30080)
			local := netip.AddrPortFrom(a.IP, 30081)
			check := func(when string) {
				t.Helper()
				rep, err := e.client.TCP(e.ctx(), remote, 3)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rep.Results {
					if r.Err != "" || r.Server != "pod-b" || r.ClientSeen.Addr() != a.IP {
						t.Errorf("%s: NodePort to node-b's pod: got %+v, want pod-b seeing %s", when, r, a.IP)
					}
				}
				rep, err = e.client.TCP(e.ctx(), local, 3)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rep.Results {
					if r.Err != "" || r.Server != "pod-a" || r.ClientSeen.Addr() != e.client.IP {
						t.Errorf("%s: externalTrafficPolicy=Local: got %+v, want pod-a seeing %s", when, r, e.client.IP)
					}
				}
			}

			extra := []string{"--tc-attach", mode}
			first := e.startAgent(t, dir, bpffs, cg, extra...)
			if !strings.Contains(first.Logs(), `"devices":["eth0"]`) {
				t.Errorf("agent did not pick eth0 from the Node's address:\n%s", first.Logs())
			}
			check("first agent")
			first.Terminate(t, 15*time.Second)
			check("no agent running")
			second := e.startAgent(t, dir, bpffs, cg, extra...)
			check("restarted agent")
			second.Terminate(t, 15*time.Second)

			if err := cleanup(); err != nil {
				t.Fatal(err)
			}
			rep, err := e.client.TCP(e.ctx(), remote, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r := rep.Results[0]; r.Err != "ECONNREFUSED" {
				t.Errorf("after --cleanup: got %+v, want ECONNREFUSED from node-a itself (nothing translates)", r)
			}
		})
	}
}
