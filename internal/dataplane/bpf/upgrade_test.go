package bpf_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

var (
	upgradeWebVIP = netip.MustParseAddr("10.96.0.10")
	upgradeDNSVIP = netip.MustParseAddr("10.96.0.11")
)

const upgradeNodePort = 30080

// upgradeNode is one sandbox node with two serving pods, a client pod
// whose sockets the socket programs translate, and a client outside the
// cluster whose NodePort traffic the TC programs translate.
type upgradeNode struct {
	sb *sandbox.Sandbox
	// cg is the node's cgroup, where the socket programs attach and the
	// client pod runs; the external client runs outside it, so that only
	// the TC programs translate its traffic.
	cg       *sandbox.Cgroup
	node     *sandbox.Node
	pod, ext *sandbox.Client
	bpffs    string
	state    *model.State
}

func newUpgradeNode(t *testing.T) *upgradeNode {
	t.Helper()
	u := &upgradeNode{sb: sandbox.ForTest(t)}
	var err error
	if u.node, err = u.sb.AddNode("node1"); err != nil {
		t.Fatal(err)
	}
	for name, ip := range map[string]string{"pod-a": "10.244.1.10", "pod-b": "10.244.1.11"} {
		if _, err := u.sb.AddServingPod(u.node, name, netip.MustParseAddr(ip), 8080, 8080); err != nil {
			t.Fatal(err)
		}
	}
	if u.cg, err = u.sb.AddCgroup("node1"); err != nil {
		t.Fatal(err)
	}
	if u.pod, err = u.sb.AddClient(u.node, "client", netip.MustParseAddr("10.244.1.100")); err != nil {
		t.Fatal(err)
	}
	u.pod = u.pod.InCgroup(u.cg)
	if u.ext, err = u.sb.AddExternalClient("ext", netip.MustParseAddr("198.18.0.10")); err != nil {
		t.Fatal(err)
	}
	u.bpffs = filepath.Join(u.sb.BPFFS.Path(), "node1")
	t.Cleanup(func() {
		if err := u.node.NS.Do(func() error {
			return errors.Join(loader.CleanupXDP(u.bpffs), loader.Cleanup(u.bpffs), loader.CleanupTC())
		}); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})

	u.state = &model.State{Services: map[model.ServicePortName]*model.Service{}}
	u.state.Node = model.Node{Name: "node1", Addrs: []netip.Addr{u.node.IP},
		NodePorts: model.NodePortAddresses{All: true, Addrs: []netip.Addr{u.node.IP}}}
	eps := []model.Endpoint{
		builders.ModelEndpoint(netip.MustParseAddrPort("10.244.1.10:8080"), "node1"),
		builders.ModelEndpoint(netip.MustParseAddrPort("10.244.1.11:8080"), "node1"),
	}
	web := builders.ModelServicePort("default", "web", model.TCP, upgradeWebVIP, 80, func(sp *model.ServicePort) { sp.NodePort = upgradeNodePort })
	dns := builders.ModelServicePort("default", "dns", model.UDP, upgradeDNSVIP, 53)
	for _, sp := range []*model.ServicePort{web, dns} {
		u.state.Services[sp.Name] = builders.ModelService(sp, eps, &u.state.Node)
	}
	return u
}

// start starts the BPF dataplane on the node as the agent does, with the
// maps of the given sizes.
func (u *upgradeNode) start(t *testing.T, sizes loader.MapSizes, conntrack uint32, log *zap.Logger) (*bpf.Dataplane, *prometheus.Registry) {
	t.Helper()
	m := metrics.New(metrics.IPv4)
	var d *bpf.Dataplane
	if err := u.node.NS.Do(func() (err error) {
		d, err = bpf.New(context.Background(), bpf.Config{
			CgroupPath: u.cg.Path(), BPFFSPath: u.bpffs, Sizes: sizes, ConntrackSize: conntrack,
			Devices: []string{sandbox.IfaceName, sandbox.BridgeName}, XDP: loader.XDPOff,
			SNATPorts: bpf.DefaultSNATPortRange, Metrics: m, Logger: log,
		})
		return err
	}); err != nil {
		t.Fatalf("start the BPF dataplane: %v", err)
	}
	return d, m.Registry()
}

// checkTraffic checks that both Services answer the client pod and the
// NodePort answers the external client.
func (u *upgradeNode) checkTraffic(t *testing.T, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		client *sandbox.Client
		to     netip.AddrPort
		udp    bool
	}{
		{u.pod, netip.AddrPortFrom(upgradeWebVIP, 80), false},
		{u.pod, netip.AddrPortFrom(upgradeDNSVIP, 53), true},
		{u.ext, netip.AddrPortFrom(u.node.IP, upgradeNodePort), false},
	} {
		var servers []string
		if c.udp {
			r, err := c.client.UDP(ctx, c.to, 4)
			if err != nil {
				t.Fatalf("%s: UDP to %s: %v", when, c.to, err)
			}
			for _, a := range r.Results {
				servers = append(servers, a.Server)
			}
		} else {
			r, err := c.client.TCP(ctx, c.to, 4)
			if err != nil {
				t.Fatalf("%s: TCP to %s: %v", when, c.to, err)
			}
			for _, a := range r.Results {
				servers = append(servers, a.Server)
			}
		}
		ok := len(servers) == 4
		for _, s := range servers {
			ok = ok && (s == "pod-a" || s == "pod-b")
		}
		if !ok {
			t.Errorf("%s: 4 attempts to %s answered by %q, want pod-a or pod-b every time", when, c.to, servers)
		}
	}
}

// dump is the canonical dump of the pinned maps: every id, as the
// `ebpf-proxy dump` command shows it.
func (u *upgradeNode) dump(t *testing.T) []string {
	t.Helper()
	sm, err := loader.OpenPinnedSockMaps(u.bpffs)
	if err != nil {
		t.Fatal(err)
	}
	defer sm.Close()
	lines, err := maps.Dump(maps.KernelMaps(sm))
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

func (u *upgradeNode) pin(name string) string { return filepath.Join(u.bpffs, "maps", name) }

// counter is the value of counter name with labels in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// revnatV0 is a made-up older layout of lb4_revnat_v1, pinned by "the
// previous release" as lb4_revnat_v0: the address, 4 bytes nobody reads,
// the port.
const (
	revnatV0      = "lb4_revnat_v0"
	revnatV0Value = 12
)

func revnatV0ToV1(k, v []byte) ([]byte, []byte, error) {
	return k, []byte{v[0], v[1], v[2], v[3], v[8], v[9], 0, 0}, nil
}

// downgradeRevNat turns the pinned lb4_revnat_v1 into the lb4_revnat_v0
// the previous release would have left.
func (u *upgradeNode) downgradeRevNat(t *testing.T) {
	t.Helper()
	cur, err := ebpf.LoadPinnedMap(u.pin(bpfobj.SockMapLb4RevnatV1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: revnatV0Value, MaxEntries: cur.MaxEntries()})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var (
		id uint32
		v  []byte
		n  int
	)
	it := cur.Iterate()
	for it.Next(&id, &v) {
		if err := old.Put(id, []byte{v[0], v[1], v[2], v[3], 0xde, 0xad, 0xbe, 0xef, v[4], v[5], 0, 0}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if err := it.Err(); err != nil || n == 0 {
		t.Fatalf("read %d reverse NAT entries: %v", n, err)
	}
	if err := old.Pin(u.pin(revnatV0)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(u.pin(bpfobj.SockMapLb4RevnatV1)); err != nil {
		t.Fatal(err)
	}
}

func TestAnUpgradeKeepsIDsAndTraffic(t *testing.T) {
	u := newUpgradeNode(t)
	// The previous release: smaller maps (its defaults, or the operator's
	// flags), and lb4_revnat in an older layout under an older name.
	small := loader.MapSizes{Services: 4096, Backends: 1024, RevNat: 512, SockRevNat: 1024, Affinity: 1024,
		MaglevTable: loader.DefaultMapSizes.MaglevTable}
	old, _ := u.start(t, small, 1024, zap.NewNop())
	if err := old.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	u.checkTraffic(t, "before the upgrade")
	before := u.dump(t)
	old.Close()
	u.downgradeRevNat(t)
	t.Cleanup(loader.RegisterMigration(loader.Migration{From: revnatV0, To: bpfobj.SockMapLb4RevnatV1,
		KeySize: 4, ValueSize: revnatV0Value, Convert: revnatV0ToV1}))

	core, logs := observer.New(zap.InfoLevel)
	d, reg := u.start(t, loader.DefaultMapSizes, loader.DefaultConntrackSize, zap.New(core))
	defer d.Close()
	if got := u.dump(t); !slices.Equal(got, before) {
		t.Errorf("maps after the upgrade:\n%s\nwant them as the previous release left them:\n%s", strings.Join(got, "\n"), strings.Join(before, "\n"))
	}
	u.checkTraffic(t, "after the upgrade, before the first sync")
	if err := d.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	if got := u.dump(t); !slices.Equal(got, before) {
		t.Errorf("maps after the first sync:\n%s\nwant every id as before the upgrade:\n%s", strings.Join(got, "\n"), strings.Join(before, "\n"))
	}
	u.checkTraffic(t, "after the first sync")

	if _, err := os.Stat(u.pin(revnatV0)); !os.IsNotExist(err) {
		t.Errorf("the older layout's pin %s is still there (%v)", revnatV0, err)
	}
	for name, want := range map[string]uint32{
		bpfobj.SockMapLb4ServicesV1: loader.DefaultMapSizes.Services,
		bpfobj.SockMapLb4BackendsV1: loader.DefaultMapSizes.Backends,
		bpfobj.SockMapLb4RevnatV1:   loader.DefaultMapSizes.RevNat,
		bpfobj.TcMapTc4CtV1:         loader.DefaultConntrackSize,
	} {
		m, err := ebpf.LoadPinnedMap(u.pin(name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.MaxEntries() != want {
			t.Errorf("pinned %s has %d entries, want the new size %d", name, m.MaxEntries(), want)
		}
		m.Close()
	}
	for _, c := range []struct{ m, result string }{
		{bpfobj.SockMapLb4ServicesV1, loader.MigrationResized},
		{bpfobj.SockMapLb4BackendsV1, loader.MigrationResized},
		{bpfobj.TcMapTc4CtV1, loader.MigrationResized},
		{bpfobj.SockMapLb4RevnatV1, loader.MigrationConverted},
	} {
		if n := counter(t, reg, "ebpfproxy_bpf_map_migrations_total", map[string]string{"map": c.m, "result": c.result}); n != 1 {
			t.Errorf("ebpfproxy_bpf_map_migrations_total{map=%q,result=%q} = %v, want 1", c.m, c.result, n)
		}
	}
	lines := logs.FilterMessage("pinned map migrated").FilterField(zap.String("map", bpfobj.SockMapLb4RevnatV1)).All()
	if len(lines) != 1 || lines[0].ContextMap()["from"] != revnatV0 || lines[0].ContextMap()["result"] != loader.MigrationConverted {
		t.Errorf("log lines about %s: %v, want one saying it was converted from %s", bpfobj.SockMapLb4RevnatV1, lines, revnatV0)
	}
}

func TestAnUpgradeToMapsTooSmallKeepsTheOldMaps(t *testing.T) {
	u := newUpgradeNode(t)
	old, _ := u.start(t, loader.DefaultMapSizes, loader.DefaultConntrackSize, zap.NewNop())
	if err := old.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	before := u.dump(t)
	old.Close()

	// Two backends pinned; room for one.
	sizes := loader.DefaultMapSizes
	sizes.Backends = 1
	core, logs := observer.New(zap.InfoLevel)
	d, reg := u.start(t, sizes, loader.DefaultConntrackSize, zap.New(core))
	defer d.Close()
	if n := counter(t, reg, "ebpfproxy_bpf_map_migrations_total", map[string]string{"map": bpfobj.SockMapLb4BackendsV1, "result": loader.MigrationKept}); n < 1 {
		t.Errorf("ebpfproxy_bpf_map_migrations_total{map=%q,result=%q} = %v, want at least 1", bpfobj.SockMapLb4BackendsV1, loader.MigrationKept, n)
	}
	lines := logs.FilterLevelExact(zapcore.ErrorLevel).FilterField(zap.String("map", bpfobj.SockMapLb4BackendsV1)).All()
	if len(lines) == 0 || !strings.Contains(lines[0].Message, "kept at its old size") {
		t.Errorf("error log lines about %s: %v, want one saying it was kept at its old size", bpfobj.SockMapLb4BackendsV1, lines)
	}
	m, err := ebpf.LoadPinnedMap(u.pin(bpfobj.SockMapLb4BackendsV1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.MaxEntries() != loader.DefaultMapSizes.Backends {
		t.Errorf("pinned backends map has %d entries, want the old map's %d", m.MaxEntries(), loader.DefaultMapSizes.Backends)
	}
	if got := u.dump(t); !slices.Equal(got, before) {
		t.Errorf("maps:\n%s\nwant them untouched:\n%s", strings.Join(got, "\n"), strings.Join(before, "\n"))
	}
	u.checkTraffic(t, "with the old maps kept")
}

// An upgrade from a release without the port filter (lb4_ext_ports_v1)
// keeps a NodePort connection whose Service was deleted before it: the new
// programs pass packets to ports not in the filter, and the deleted
// frontend is not restored, so the port comes from the tracked flow.
func TestAnUpgradeKeepsTheFlowsOfDeletedServicesThroughThePortFilter(t *testing.T) {
	u := newUpgradeNode(t)
	// A second Service keeps web's pods as backends once web is gone: a
	// flow whose backend is removed is reset (tc.c tc_reset).
	web := u.state.Services[model.ServicePortName{ServiceName: model.ServiceName{Namespace: "default", Name: "web"}, Protocol: model.TCP}]
	keep := builders.ModelServicePort("default", "web-keep", model.TCP, netip.MustParseAddr("10.96.0.12"), 80)
	u.state.Services[keep.Name] = builders.ModelService(keep, web.Endpoints, &u.state.Node)
	old, _ := u.start(t, loader.DefaultMapSizes, loader.DefaultConntrackSize, zap.NewNop())
	if err := old.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := u.ext.Hold(ctx, netip.AddrPortFrom(u.node.IP, upgradeNodePort))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if held.First.Err != "" {
		t.Fatalf("connect to the NodePort: %s", held.First.Err)
	}
	ping := func(when string) {
		t.Helper()
		if err := held.Ping(); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	ping("before the Service is deleted")
	for name, svc := range u.state.Services {
		if svc.Port.NodePort == upgradeNodePort {
			delete(u.state.Services, name)
		}
	}
	if err := old.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	ping("after the Service is deleted (its flow lives on, as under kube-proxy's conntrack)")
	old.Close()
	// The release before the filter never created it.
	if err := os.Remove(u.pin(bpfobj.SockMapLb4ExtPortsV1)); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	d, _ := u.start(t, loader.DefaultMapSizes, loader.DefaultConntrackSize, zap.New(core))
	defer d.Close()
	ping("after the upgrade")
	if err := d.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	ping("after the upgrade's first sync")
	if !d.HasPort(upgradeNodePort) {
		t.Errorf("port %d of the tracked flow is not in the new port filter", upgradeNodePort)
	}
	if lines := logs.FilterMessage("port filter holds the ports of the tracked flows").All(); len(lines) != 1 || lines[0].ContextMap()["ipv4Ports"] != int64(1) {
		t.Errorf("log lines about the tracked flows' ports: %v, want one with ipv4Ports=1", lines)
	}
}

// An agent restarted with larger LRU maps (a node that outgrew them: more
// flows than --bpf-map-dynamic-size-ratio or the flags left room for)
// migrates them, and loses neither a tracked flow nor an affinity: a
// NodePort connection the TC programs track and a pod's connection the
// socket programs translated both still carry data, the pod still sees the
// ClusterIP as its peer, and new connections of both clients still go to
// the backend their affinity chose.
func TestLargerLRUMapsKeepTrackedFlowsAndAffinity(t *testing.T) {
	u := newUpgradeNode(t)
	for _, svc := range u.state.Services {
		if svc.Port.Name.Name == "web" {
			svc.Port.AffinityTimeout = time.Hour
		}
	}
	small := loader.DefaultMapSizes
	small.SockRevNat, small.Affinity = 1024, 1024
	old, _ := u.start(t, small, 1024, zap.NewNop())
	if err := old.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	web, nodePort := netip.AddrPortFrom(upgradeWebVIP, 80), netip.AddrPortFrom(u.node.IP, upgradeNodePort)
	type held struct {
		name   string
		client *sandbox.Client
		to     netip.AddrPort
		h      *sandbox.Held
	}
	conns := []*held{{name: "pod to the ClusterIP", client: u.pod, to: web}, {name: "outside to the NodePort", client: u.ext, to: nodePort}}
	for _, c := range conns {
		h, err := c.client.Hold(ctx, c.to)
		if err != nil {
			t.Fatal(err)
		}
		if h.First.Err != "" {
			t.Fatalf("%s: %s", c.name, h.First.Err)
		}
		defer h.Close()
		c.h = h
		u.checkAffinity(ctx, t, c.client, c.to, h.First.Server, "before the upgrade")
	}
	affinities := u.affinities(t)
	if len(affinities) != 2 {
		t.Fatalf("affinity entries %v, want one for each client", affinities)
	}
	old.Close()

	d, reg := u.start(t, loader.DefaultMapSizes, 1<<16, zap.NewNop())
	defer d.Close()
	for _, c := range conns {
		if err := c.h.Ping(); err != nil {
			t.Errorf("%s after the LRU maps grew: %v", c.name, err)
		}
		u.checkAffinity(ctx, t, c.client, c.to, c.h.First.Server, "after the LRU maps grew")
	}
	if got := u.affinities(t); !reflect.DeepEqual(got, affinities) {
		t.Errorf("affinity entries after the LRU maps grew %v, want those before, %v", got, affinities)
	}
	if peer, err := conns[0].h.Peer(); err != nil || peer != web {
		t.Errorf("the pod's connection sees its peer as %v (%v), want the ClusterIP %v", peer, err, web)
	}
	if err := d.Sync(model.Update{State: u.state, Full: true}); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if err := c.h.Ping(); err != nil {
			t.Errorf("%s after the first sync: %v", c.name, err)
		}
	}
	for name, want := range map[string]uint32{bpfobj.TcMapTc4CtV1: 1 << 16, bpfobj.SockMapLb4AffinityV1: loader.DefaultMapSizes.Affinity,
		bpfobj.SockMapSock4RevnatV1: loader.DefaultMapSizes.SockRevNat} {
		m, err := ebpf.LoadPinnedMap(u.pin(name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.MaxEntries() != want {
			t.Errorf("pinned %s has %d entries, want %d", name, m.MaxEntries(), want)
		}
		m.Close()
		if n := counter(t, reg, "ebpfproxy_bpf_map_migrations_total", map[string]string{"map": name, "result": loader.MigrationResized}); n != 1 {
			t.Errorf("ebpfproxy_bpf_map_migrations_total{map=%q,result=%q} = %v, want 1", name, loader.MigrationResized, n)
		}
	}
}

// affinities are the backend ids of the pinned IPv4 affinity entries,
// by key.
func (u *upgradeNode) affinities(t *testing.T) map[bpfobj.SockLb4AffinityKey]uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(u.pin(bpfobj.SockMapLb4AffinityV1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out := map[bpfobj.SockLb4AffinityKey]uint32{}
	var (
		k bpfobj.SockLb4AffinityKey
		v bpfobj.SockLb4Affinity
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v.BackendId
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkAffinity checks that four new connections of client to addr all
// reach server, the backend its affinity holds.
func (u *upgradeNode) checkAffinity(ctx context.Context, t *testing.T, client *sandbox.Client, addr netip.AddrPort, server, when string) {
	t.Helper()
	r, err := client.TCP(ctx, addr, 4)
	if err != nil {
		t.Fatalf("%s: TCP to %s: %v", when, addr, err)
	}
	for _, a := range r.Results {
		if a.Server != server {
			t.Errorf("%s: %s from %s answered by %q, want %q, the backend its affinity holds", when, addr, client.Name, a.Server, server)
		}
	}
}
