package tclb_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
)

// The agent's view of node-a: its Node object, with the address that makes
// eth0 the device to attach to, and two NodePort Services.
const agentManifests = `apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: %[1]s}]
---
apiVersion: v1
kind: Service
metadata: {name: remote, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.80
  ports: [{name: http, port: 80, protocol: TCP, targetPort: http, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: remote-1, namespace: default, labels: {kubernetes.io/service-name: remote}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: [%[2]s], conditions: {ready: true}, nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.81
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, protocol: TCP, targetPort: http, nodePort: 30081}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: default, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: [%[3]s], conditions: {ready: true}, nodeName: node-a}
`

// startAgent runs the agent in node-a's namespace, with its socket programs
// on a cgroup of their own (the external client's probes must not pass
// them) and its pins under bpffs, and waits until it has attached its TC
// programs and synced.
func (e *env) startAgent(t *testing.T, dir, bpffs string, cg *sandbox.Cgroup, extra ...string) *agent.Process {
	t.Helper()
	args := append([]string{"--manifests", dir, "--cgroup-path", cg.Path(), "--bpffs-path", bpffs,
		"--hostname-override", "node-a", "--healthz-bind-address", "", "--metrics-bind-address", "", "-v", "2"}, extra...)
	a := agent.Run(t, agent.Options{Args: args, Netns: e.nodes[0].NS.Path()})
	if err := a.WaitLog(30*time.Second, []string{"first sync done", "TC programs attached"}); err != nil {
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
			manifest := fmt.Sprintf(agentManifests, a.IP, e.pods["pod-b"].IP, e.pods["pod-a"].IP)
			if err := os.WriteFile(filepath.Join(dir, "node-a.yaml"), []byte(manifest), 0o644); err != nil {
				t.Fatal(err)
			}
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
