package bpf_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// gauges are the values of the gauge name in reg by the value of label.
func gauges(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// pinnedEntries counts the entries of a pinned map key by key, the slow
// way the collector avoids.
func (u *upgradeNode) pinnedEntries(t *testing.T, name string) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(u.pin(name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	n := 0
	var prev any
	for {
		if err := m.NextKey(prev, next); errors.Is(err, ebpf.ErrKeyNotExist) {
			return n
		} else if err != nil {
			t.Fatalf("iterate %s: %v", name, err)
		}
		n++
		copy(key, next)
		prev = key
	}
}

// nodePortTraffic opens 4 connections from the external client to the
// NodePort, each a new tracked flow.
func nodePortTraffic(t *testing.T, u *upgradeNode, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	to := netip.AddrPortFrom(u.node.IP, upgradeNodePort)
	r, err := u.ext.TCP(ctx, to, 4)
	if err != nil {
		t.Fatalf("%s: TCP to %s: %v", when, to, err)
	}
	for _, a := range r.Results {
		if a.Server != "pod-a" && a.Server != "pod-b" {
			t.Fatalf("%s: connection to %s answered by %q, want pod-a or pod-b", when, to, a.Server)
		}
	}
}

// TestMapFillMetrics checks ebpfproxy_bpf_map_entries and
// ebpfproxy_bpf_map_capacity against the kernel's maps: the writers'
// counts of the services, backends and reverse NAT maps of both families,
// the batch count of the connection tracking and affinity LRUs after real
// NodePort traffic, and that the LRUs' count is reused within the count
// interval rather than taken at every scrape.
func TestMapFillMetrics(t *testing.T) {
	u := newUpgradeNode(t)
	sizes := loader.MapSizes{Services: 4096, Backends: 1024, RevNat: 512, SockRevNat: 1024, Affinity: 2048,
		MaglevTable: loader.DefaultMapSizes.MaglevTable}
	const conntrack = 8192
	m := metrics.New(metrics.IPv4)
	// The socket programs on the node's cgroup (u.cg), so that the
	// external client's connections reach the TC programs, which track
	// them, rather than being translated by its socket.
	cg := u.cg
	var d *bpf.Dataplane
	if err := u.node.NS.Do(func() (err error) {
		d, err = bpf.New(context.Background(), bpf.Config{
			CgroupPath: cg.Path(), BPFFSPath: u.bpffs, Sizes: sizes, ConntrackSize: conntrack,
			Devices: []string{sandbox.IfaceName, sandbox.BridgeName}, XDP: loader.XDPOff,
			SNATPorts: bpf.DefaultSNATPortRange, Metrics: m, Logger: zap.NewNop(),
			// Longer than the test: the LRUs are counted once.
			MapCountInterval: time.Hour,
		})
		return err
	}); err != nil {
		t.Fatalf("start the BPF dataplane: %v", err)
	}
	defer d.Close()
	if err := d.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	nodePortTraffic(t, u, "before the first scrape")

	reg := m.Registry()
	entries := gauges(t, reg, "ebpfproxy_bpf_map_entries", "map")
	capacity := gauges(t, reg, "ebpfproxy_bpf_map_capacity", "map")
	want := map[string]float64{
		bpfobj.SockMapLb4ServicesV1: float64(sizes.Services), bpfobj.SockMapLb6ServicesV1: float64(sizes.Services),
		bpfobj.SockMapLb4BackendsV1: float64(sizes.Backends), bpfobj.SockMapLb6BackendsV1: float64(sizes.Backends),
		bpfobj.SockMapLb4RevnatV1: float64(sizes.RevNat), bpfobj.SockMapLb6RevnatV1: float64(sizes.RevNat),
		bpfobj.SockMapLb4AffinityV1: float64(sizes.Affinity), bpfobj.SockMapLb6AffinityV1: float64(sizes.Affinity),
		bpfobj.TcMapTc4CtV1: conntrack, bpfobj.TcMapTc6CtV1: conntrack,
	}
	for name, c := range want {
		if capacity[name] != c {
			t.Errorf("%s: capacity %v, want %v", name, capacity[name], c)
		}
		got, ok := entries[name]
		if !ok {
			t.Errorf("%s: no entries series", name)
			continue
		}
		if n := u.pinnedEntries(t, name); got != float64(n) {
			t.Errorf("%s: %v entries reported, the map holds %d", name, got, n)
		}
	}
	if len(entries) != len(want) || len(capacity) != len(want) {
		t.Errorf("series for maps %v and %v, want exactly %d maps", entries, capacity, len(want))
	}
	// Two Services of two endpoints, one with a NodePort: the IPv4 maps
	// hold something, the IPv6 ones (never synced) nothing.
	for _, name := range []string{bpfobj.SockMapLb4ServicesV1, bpfobj.SockMapLb4BackendsV1, bpfobj.SockMapLb4RevnatV1, bpfobj.TcMapTc4CtV1} {
		if entries[name] == 0 {
			t.Errorf("%s: 0 entries after syncing Services and sending NodePort traffic", name)
		}
	}
	if entries[bpfobj.SockMapLb6ServicesV1] != 0 {
		t.Errorf("%s: %v entries, want 0", bpfobj.SockMapLb6ServicesV1, entries[bpfobj.SockMapLb6ServicesV1])
	}

	// New NodePort flows add conntrack entries; within the interval a
	// scrape still reports the first count, while the writers' counts
	// follow every sync.
	nodePortTraffic(t, u, "between the scrapes")
	if n := u.pinnedEntries(t, bpfobj.TcMapTc4CtV1); float64(n) <= entries[bpfobj.TcMapTc4CtV1] {
		t.Fatalf("%s holds %d entries after more NodePort flows, %v before: the test needs it to grow", bpfobj.TcMapTc4CtV1, n, entries[bpfobj.TcMapTc4CtV1])
	}
	for name := range u.state.Services {
		if name.Name == "dns" {
			delete(u.state.Services, name)
		}
	}
	if err := d.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	again := gauges(t, reg, "ebpfproxy_bpf_map_entries", "map")
	if again[bpfobj.TcMapTc4CtV1] != entries[bpfobj.TcMapTc4CtV1] {
		t.Errorf("%s: %v entries at the second scrape, want the first count %v reused within the interval",
			bpfobj.TcMapTc4CtV1, again[bpfobj.TcMapTc4CtV1], entries[bpfobj.TcMapTc4CtV1])
	}
	if n := u.pinnedEntries(t, bpfobj.SockMapLb4ServicesV1); again[bpfobj.SockMapLb4ServicesV1] != float64(n) ||
		n >= int(entries[bpfobj.SockMapLb4ServicesV1]) {
		t.Errorf("%s after removing a Service: %v entries reported, the map holds %d (%v before)",
			bpfobj.SockMapLb4ServicesV1, again[bpfobj.SockMapLb4ServicesV1], n, entries[bpfobj.SockMapLb4ServicesV1])
	}
}
