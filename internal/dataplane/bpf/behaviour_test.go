package bpf_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// factory starts the BPF dataplane for a sandbox node as the agent starts
// it on a real one: the socket programs on the node's cgroup, the TC
// programs on its uplink and its pod bridge (so that traffic from outside
// to a pod on the node is masqueraded, as kube-proxy does), everything
// pinned under the node's own directory. Setting up inside the node's
// namespace makes the netns cookie, the devices and the TC links the
// node's.
func factory(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
	return start(t, node, []string{sandbox.IfaceName, sandbox.BridgeName})
}

// start is factory with the devices to attach the TC programs to (nil:
// those carrying the node's addresses, found at the first syncs).
func start(t *testing.T, node *behaviour.Node, devices []string) *bpf.Dataplane {
	return startScoped(t, node, devices, bpf.SocketLBAll)
}

// startScoped is start with scope as --socket-lb-scope.
func startScoped(t *testing.T, node *behaviour.Node, devices []string, scope string) *bpf.Dataplane {
	var d *bpf.Dataplane
	if err := node.NS.Do(func() (err error) {
		d, err = bpf.New(context.Background(), bpf.Config{
			SocketLBScope: scope,
			CgroupPath:    node.Cgroup.Path(),
			BPFFSPath:     node.BPFFS,
			Sizes:         loader.DefaultMapSizes,
			Devices:       devices,
			XDP:           loader.XDPOff,
			ConntrackSize: loader.DefaultConntrackSize,
			SNATPorts:     bpf.DefaultSNATPortRange,
			Metrics:       metrics.New(metrics.IPv4),
			Logger:        zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		})
		return err
	}); err != nil {
		t.Fatalf("start the BPF dataplane on %s: %v", node.Name, err)
	}
	t.Cleanup(func() {
		d.Close()
		if err := node.NS.Do(func() error {
			return errors.Join(loader.CleanupXDP(node.BPFFS), loader.Cleanup(node.BPFFS), loader.CleanupTC())
		}); err != nil {
			t.Errorf("clean up the BPF dataplane on %s: %v", node.Name, err)
		}
	})
	return d
}

// TestTrafficFollowsTheModelVerdicts runs the behaviour table, the one the
// fallback dataplanes run, with real traffic through the BPF dataplane.
func TestTrafficFollowsTheModelVerdicts(t *testing.T) {
	var pins []string
	e := behaviour.NewEnv(t, func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
		pins = append(pins, node.BPFFS)
		return factory(t, node)
	})
	behaviour.Run(t, e, behaviour.Cases())
	checkNexthopsShared(t, pins, false)
}

// checkNexthopsShared checks that the dataplanes pinned under pins let
// every client's new flows of the family (v6 for IPv6) share their next
// hop, as the sandbox's routing allows (nexthop.go), and that the table's
// clients from outside took a shared next hop at least once.
func checkNexthopsShared(t *testing.T, pins []string, v6 bool) {
	t.Helper()
	var shared uint64
	for _, bpffs := range pins {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "maps", bpfobj.TcMapTcNexthopShareV1), nil)
		if err != nil {
			t.Fatal(err)
		}
		share, err := loader.NexthopSharing(m, v6)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if share != loader.NexthopShareAll {
			t.Errorf("%s: next hop sharing (IPv6 %v) is %s, want %s", bpffs, v6, share, loader.NexthopShareAll)
		}
		counters, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "maps", bpfobj.SockMapLbMetricsV1), nil)
		if err != nil {
			t.Fatal(err)
		}
		n, err := loader.ReadCounters(counters)
		counters.Close()
		if err != nil {
			t.Fatal(err)
		}
		shared += n[bpfobj.SockLbMetricLB_M_TC_NEXTHOP_SHARED]
	}
	if shared == 0 {
		t.Errorf("no new flow from outside took a shared next hop")
	}
}

// factory6 starts the BPF dataplane as factory does and returns its IPv6
// dataplane.
func factory6(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
	return factory(t, node).(*bpf.Dataplane).IPv6()
}

// TestPodsPerPacketFollowTheModelVerdicts runs the behaviour table with
// --socket-lb-scope=node, both families: the pods' clients are translated
// per packet at their devices on the node (found by the dataplane), the
// node's own at connect(), traffic from outside at the node's devices. The
// rows that differ for the BPF mode, where its socket programs keep a pod's
// address that kube-proxy masquerades, hold here as kube-proxy's.
func TestPodsPerPacketFollowTheModelVerdicts(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "IPv4"
		newEnv := behaviour.NewEnv
		if v6 {
			name, newEnv = "IPv6", behaviour.NewEnv6
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
				d := startScoped(t, node, []string{sandbox.IfaceName, sandbox.BridgeName}, bpf.SocketLBNode)
				if v6 {
					return d.IPv6()
				}
				return d
			})
			behaviour.RunAs(t, e, behaviour.Cases(), behaviour.ModeEBPFPods)
		})
	}
}

// TestIPv6TrafficFollowsTheModelVerdicts runs the behaviour table over
// IPv6 (the example cluster's IPv6 twin) through the IPv6 dataplane: the
// socket programs for clients on a node, the TC programs for traffic from
// outside the cluster.
func TestIPv6TrafficFollowsTheModelVerdicts(t *testing.T) {
	var pins []string
	e := behaviour.NewEnv6(t, func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
		pins = append(pins, node.BPFFS)
		return factory6(t, node)
	})
	behaviour.Run(t, e, behaviour.Cases())
	checkNexthopsShared(t, pins, true)
}

// TestIPv6OnlyNodeFindsItsDevicesByItsIPv6Addresses starts the BPF
// dataplane without --devices on nodes whose IPv4 State has no node
// address, as on an IPv6-only node: the TC programs must attach to the
// device carrying the node's IPv6 address at the first IPv6 sync, and
// serve traffic from outside. The rows are those from outside whose
// outcome does not depend on programs on the pod bridge, which only
// --devices puts there (kube-proxy's masquerading of outside traffic to a
// pod on the node).
func TestIPv6OnlyNodeFindsItsDevicesByItsIPv6Addresses(t *testing.T) {
	e := behaviour.NewEnv6(t, func(t *testing.T, node *behaviour.Node) dataplane.Dataplane {
		d := start(t, node, nil)
		// The IPv4 sync loop's first sync: nothing, no node address.
		if err := d.Sync(model.Update{Full: true, State: &model.State{}}); err != nil {
			t.Fatalf("IPv4 sync on %s: %v", node.Name, err)
		}
		return d.IPv6()
	})
	var rows []behaviour.Case
	for _, tc := range behaviour.Cases() {
		if tc.From == behaviour.ClientExternal && (tc.Want.Verdict != model.Forward || tc.Want.Source == behaviour.Preserved) {
			rows = append(rows, tc)
		}
	}
	if len(rows) < 4 {
		t.Fatalf("%d rows from outside, want at least 4", len(rows))
	}
	behaviour.Run(t, e, rows)
}
