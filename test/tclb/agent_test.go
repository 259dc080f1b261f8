package tclb_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// agentBinary is the ebpf-proxy binary under test (sandbox.AgentBinary).
func agentBinary(t *testing.T) string {
	t.Helper()
	bin, err := sandbox.AgentBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

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

type agent struct {
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan error
}

// startAgent runs the agent in node-a's namespace, with its socket programs
// on a cgroup of their own (the external client's probes must not pass
// them) and its pins under bpffs, and waits until it has attached its TC
// programs and synced.
func (e *env) startAgent(t *testing.T, dir, bpffs string, cg *sandbox.Cgroup, extra ...string) *agent {
	t.Helper()
	a := &agent{logs: &syncBuffer{}, done: make(chan error, 1)}
	args := append([]string{"--manifests", dir, "--cgroup-path", cg.Path(), "--bpffs-path", bpffs,
		"--hostname-override", "node-a", "--healthz-bind-address", "", "--metrics-bind-address", "", "-v", "2"}, extra...)
	a.cmd = exec.Command(agentBinary(t), args...)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := e.nodes[0].NS.Start(a.cmd); err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	t.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			a.cmd.Process.Kill()
			<-a.done
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.logs)
		}
	})
	deadline := time.After(30 * time.Second)
	for !strings.Contains(a.logs.String(), "first sync done") || !strings.Contains(a.logs.String(), "TC programs attached") {
		select {
		case err := <-a.done:
			t.Fatalf("agent exited before its first sync: %v\n%s", err, a.logs)
		case <-deadline:
			t.Fatalf("agent did not attach and sync within 30s:\n%s", a.logs)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return a
}

func (a *agent) stop(t *testing.T) {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("agent exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not exit on SIGTERM")
	}
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
				cmd := exec.Command(agentBinary(t), "--cleanup", "--bpffs-path", bpffs)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := a.NS.Start(cmd); err != nil {
					return err
				}
				if err := cmd.Wait(); err != nil {
					return fmt.Errorf("--cleanup: %v\n%s", err, out.String())
				}
				return nil
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
			if !strings.Contains(first.logs.String(), `"devices":["eth0"]`) {
				t.Errorf("agent did not pick eth0 from the Node's address:\n%s", first.logs)
			}
			check("first agent")
			first.stop(t)
			check("no agent running")
			second := e.startAgent(t, dir, bpffs, cg, extra...)
			check("restarted agent")
			second.stop(t)

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
