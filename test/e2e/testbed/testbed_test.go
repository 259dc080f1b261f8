package testbed_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/cluster"
	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func twoNodes() testbed.Options {
	return testbed.Options{
		Nodes: []testbed.NodeSpec{
			{Name: "node-a", Zone: "zone-a", Pods: []string{"a1"}},
			{Name: "node-b", Zone: "zone-b", Pods: []string{"b1"}},
		},
		TCPPorts:        []uint16{8080},
		UDPPorts:        []uint16{8080},
		ExternalClients: []string{"ext"},
	}
}

// readSysctl reads a sysctl in the calling thread's network namespace.
func readSysctl(key string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", key))
	return strings.TrimSpace(string(b)), err
}

// TestTopology checks what the proxies under test rely on: traffic between
// all kinds of clients and pods, the node settings a kube-proxy node has,
// and an answer at once for traffic no proxy handled.
func TestTopology(t *testing.T) {
	keys := []string{"net/bridge/bridge-nf-call-iptables", "net/ipv4/icmp_ratemask", "net/ipv6/icmp/ratemask", "net/ipv4/conf/all/send_redirects"}
	rootBefore := map[string]string{}
	for _, k := range keys {
		v, err := readSysctl(k)
		if err != nil {
			t.Fatal(err)
		}
		rootBefore[k] = v
	}

	c := cluster.StartT(t, cluster.Options{})
	tb := testbed.New(t, c, twoNodes())
	a, b := tb.Nodes[0], tb.Nodes[1]
	a1, b1 := a.Pods[0], b.Pods[0]

	t.Run("node settings, in the nodes only", func(t *testing.T) {
		want := map[string]string{"net/bridge/bridge-nf-call-iptables": "1", "net/ipv4/icmp_ratemask": "0", "net/ipv6/icmp/ratemask": "", "net/ipv4/conf/all/send_redirects": "0"}
		for _, n := range tb.Nodes {
			err := n.NS.Do(func() error {
				for k, v := range want {
					got, err := readSysctl(k)
					if err != nil {
						return err
					}
					if got != v {
						t.Errorf("%s: %s = %s, want %s", n.Spec.Name, k, got, v)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			nl := n.NS.Netlink()
			links, err := nl.LinkList()
			if err != nil {
				t.Fatal(err)
			}
			br, err := nl.LinkByName(sandbox.BridgeName)
			if err != nil {
				t.Fatal(err)
			}
			ports := 0
			for _, l := range links {
				if l.Attrs().MasterIndex != br.Attrs().Index {
					continue
				}
				ports++
				pi, err := nl.LinkGetProtinfo(l)
				if err != nil {
					t.Fatal(err)
				}
				if !pi.Hairpin {
					t.Errorf("%s: bridge port %s without hairpin mode", n.Spec.Name, l.Attrs().Name)
				}
			}
			if err := n.FlushConntrack(); err != nil {
				t.Error(err)
			}
			if ports != 2 {
				t.Errorf("%s: %d bridge ports, want 2 (a pod and the client pod)", n.Spec.Name, ports)
			}
		}
		for _, k := range keys {
			if v, err := readSysctl(k); err != nil || v != rootBefore[k] {
				t.Errorf("root namespace %s = %q (%v), was %q", k, v, err, rootBefore[k])
			}
		}
	})

	t.Run("traffic", func(t *testing.T) {
		tests := []struct {
			name   string
			from   *sandbox.Client
			dst    netip.AddrPort
			server string // "" for a failure
			seen   netip.Addr
			err    string
		}{
			{"pod to a pod on another node", a.Client, netip.AddrPortFrom(b1.IP, 8080), "b1:8080", a.Client.IP, ""},
			{"node to its own pod, from its bridge address", a.Self, netip.AddrPortFrom(a1.IP, 8080), "a1:8080", a.Gateway, ""},
			{"external client to a pod through the router", tb.External[0], netip.AddrPortFrom(b1.IP, 8080), "b1:8080", tb.External[0].IP, ""},
			// No proxy runs: the router refuses the Service range at once.
			{"pod to an unproxied ClusterIP", a.Client, netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 80), "", netip.Addr{}, "EHOSTUNREACH"},
			{"node to an unproxied ClusterIP", b.Self, netip.AddrPortFrom(netip.MustParseAddr("10.96.0.10"), 80), "", netip.Addr{}, "EHOSTUNREACH"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				rep, err := tt.from.TCP(t.Context(), tt.dst, 20)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rep.Results {
					if r.Err != tt.err || r.Server != tt.server || r.ClientSeen.Addr() != tt.seen {
						t.Fatalf("got %q seeing %s (error %q), want %q seeing %s (error %q)", r.Server, r.ClientSeen, r.Err, tt.server, tt.seen, tt.err)
					}
				}
				if want := tt.from.Cgroup(); rep.Process.Cgroup != want.Name() {
					t.Errorf("probe ran in cgroup %s, want %s", rep.Process.Cgroup, want.Name())
				}
			})
		}
	})

	t.Run("address names", func(t *testing.T) {
		for addr, want := range map[netip.Addr]string{
			a.IP: "node-a", a.Gateway: "node-a/br0", b1.IP: "b1", a.Client.IP: "node-a-client",
			tb.External[0].IP: "ext", netip.MustParseAddr("192.0.2.1"): "192.0.2.1",
		} {
			if got := tb.AddressName(addr); got != want {
				t.Errorf("AddressName(%s) = %q, want %q", addr, got, want)
			}
		}
	})
}

// TestProxiesStartAndLeaveNothing starts each kind of proxy on a node and
// checks that a testbed's teardown ends the processes and removes what they
// and the testbed made.
func TestProxiesStartAndLeaveNothing(t *testing.T) {
	c := cluster.StartT(t, cluster.Options{})
	for _, kind := range []testbed.Kind{testbed.KubeProxyIPTables, testbed.KubeProxyNFTables, testbed.EbpfProxy} {
		var pids []int
		var paths []string
		t.Run(string(kind), func(t *testing.T) {
			tb := testbed.New(t, c, twoNodes())
			for _, n := range tb.Nodes {
				p := tb.StartProxy(t, n, testbed.ProxyOptions{Kind: kind})
				pids = append(pids, p.PID())
				if code, err := p.Healthz(t.Context(), "/livez"); err != nil || code != 200 {
					t.Errorf("%s on %s: /livez %d, %v", kind, n.Spec.Name, code, err)
				}
				if kind == testbed.EbpfProxy {
					if _, err := os.Stat(p.BPFFS); err != nil {
						t.Errorf("ebpf-proxy pinned nothing under %s: %v", p.BPFFS, err)
					}
				}
				paths = append(paths, n.NS.Path(), n.Cgroup.Path())
			}
			paths = append(paths, tb.Sandbox.BPFFS.Path())
		})
		for _, pid := range pids {
			if cluster.ProcessRunning(pid) {
				t.Errorf("%s proxy %d still runs after the teardown", kind, pid)
			}
		}
		for _, p := range paths {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s left behind (stat: %v)", p, err)
			}
		}
	}
}
