// Package bpf is the BPF dataplane, the proxy mode ebpf-proxy exists for:
// socket load balancing in cgroup hooks for the node's own processes and
// pods, TC (and optionally XDP) programs on the node's devices for
// NodePort, ExternalIP and LoadBalancer-IP traffic from outside. It loads
// and attaches the programs (internal/loader), adopting what an earlier
// agent pinned, and drives the only writer of their maps (internal/maps)
// from the sync loop's updates, as the fallback dataplanes drive their
// netfilter or IPVS configuration.
package bpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf/sockterm"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// Name is the proxy mode this dataplane implements.
const Name = dataplane.EBPF

// Config is the BPF dataplane's configuration: the agent's flags of the
// same names.
type Config struct {
	// CgroupPath is the cgroup v2 directory the socket programs attach to;
	// "" is the node's cgroup2 root (mounted under /run/ebpf-proxy when
	// the node has none mounted).
	CgroupPath string
	// BPFFSPath is where maps and links are pinned (--bpffs-path).
	BPFFSPath string
	// Sizes are the maps' capacities.
	Sizes loader.MapSizes
	// TerminateSockets ends the sockets translated to a removed backend
	// (--terminate-removed-backend-sockets).
	TerminateSockets bool
	// Devices carry NodePort, ExternalIP and LoadBalancer-IP traffic
	// (--devices); empty means the devices holding the node's addresses,
	// attached at the first sync that knows them.
	Devices []string
	// TCAttach is --tc-attach: loader.TCAttachAuto, TCAttachTCX or
	// TCAttachClsact.
	TCAttach string
	// XDP is --xdp: loader.XDPOff, XDPNative or XDPGeneric.
	XDP string
	// ConntrackSize is the TC connection tracking LRU's capacity.
	ConntrackSize uint32
	// SNATPorts is --nodeport-snat-port-range; SNATPortRangeForce skips
	// its overlap checks.
	SNATPorts          PortRange
	SNATPortRangeForce bool
	// Logger receives the dataplane's log lines; nil logs nothing.
	Logger *zap.Logger
	// Metrics receives the XDP attachment gauges; its registry takes the
	// BPF event counters, the maps' fill levels and the terminated-sockets
	// counter (see DescribeMetrics). Required.
	Metrics *metrics.Metrics
	// MapCountInterval is how long the counts of the LRU maps the
	// programs fill (connection tracking, session affinity) are reused by
	// scrapes before the maps are counted again; 0 means
	// DefaultMapCountInterval. Counting reads the whole map, so it bounds
	// what frequent scrapes cost.
	MapCountInterval time.Duration
	// NoTC attaches the socket programs alone: no TC or XDP program,
	// whatever the node's devices. The kernel suites of the socket load
	// balancer drive the dataplane so.
	NoTC bool
	// SocketLBScope is --socket-lb-scope: SocketLBAll ("" too) or
	// SocketLBNode, which translates the node's own sockets only and
	// pods' packets at their devices (never with NoTC).
	SocketLBScope string
	// PinCheckInterval is how often the pins under BPFFSPath are checked
	// and those removed behind the agent's back pinned again (every sync
	// checks them too); 0 means DefaultPinCheckInterval.
	PinCheckInterval time.Duration
	// Written, if set, is called once per IP family (metrics.IPv4 or
	// metrics.IPv6), right after the first sync of the family has written
	// its maps, before the sync goes on: the socket programs translate
	// the family's new connections from then on, and what of another
	// mode would break them goes at once (mode.Env.Written).
	Written func(family string)
}

// DefaultPinCheckInterval is how often the dataplane checks its pins: a
// few stat calls each time.
const DefaultPinCheckInterval = time.Second

// ValidateAttach checks --tc-attach and --xdp.
func ValidateAttach(tcAttach, xdp string) error {
	switch tcAttach {
	case loader.TCAttachAuto, loader.TCAttachTCX, loader.TCAttachClsact:
	default:
		return fmt.Errorf("unknown --tc-attach %q: use tcx or clsact, or leave it empty", tcAttach)
	}
	switch xdp {
	case loader.XDPOff, loader.XDPNative, loader.XDPGeneric:
	default:
		return fmt.Errorf("unknown --xdp %q: use native, generic or off", xdp)
	}
	return nil
}

// testFailureEnv makes the dataplane fail at start-up, for the tests of
// the fallback (test/modes), since no test can make a real kernel reject a
// program on demand: "load" fails after the feature probe passed, as a
// verifier rejection would. Nothing but tests sets it.
const testFailureEnv = "EBPF_PROXY_TEST_BPF_FAILURE"

// errForced is the failure EBPF_PROXY_TEST_BPF_FAILURE asks for.
var errForced = errors.New("forced by " + testFailureEnv)

// forcedFailure returns what EBPF_PROXY_TEST_BPF_FAILURE asks to fail:
// "probe", "load" or "".
func forcedFailure() string { return os.Getenv(testFailureEnv) }

// Probe checks, with real probe programs, that the kernel can run the
// socket load balancer. cgroup v2 is checked where the programs attach
// (New), since the agent mounts it when the node has none mounted.
func Probe() error {
	if forcedFailure() == "probe" {
		return fmt.Errorf("%w: %w", loader.ErrUnsupported, errForced)
	}
	_, err := loader.Probe()
	return err
}

// New loads and attaches the BPF programs, replacing those of an earlier
// agent in place, and restores the maps' state from their pins. A failure
// leaves an earlier agent's programs attached and serving. Until ctx ends,
// the dataplane ends the sockets of removed backends in the background.
func New(ctx context.Context, cfg Config) (*Dataplane, error) {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	cgroupPath := cfg.CgroupPath
	if cgroupPath == "" {
		var err error
		if cgroupPath, err = defaultCgroupPath(); err != nil {
			return nil, fmt.Errorf("find the cgroup v2 root: %w", err)
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(cgroupPath, &fs); err != nil {
		return nil, fmt.Errorf("cgroup path %s: %w", cgroupPath, err)
	} else if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("%w: cgroup path %s is not on a cgroup v2 filesystem", loader.ErrUnsupported, cgroupPath)
	}
	if err := ensureBPFFS(cfg.BPFFSPath, log); err != nil {
		return nil, err
	}
	if forcedFailure() == "load" {
		return nil, fmt.Errorf("load BPF programs: %w", errForced)
	}
	// The agent runs in the node's network namespace (hostNetwork).
	nodeNetns, err := loader.NetnsCookie()
	if err != nil {
		return nil, err
	}
	if cfg.SocketLBScope == "" {
		cfg.SocketLBScope = SocketLBAll
	}
	if err := ValidateSocketLBScope(cfg.SocketLBScope); err != nil {
		return nil, err
	}
	nodeOnly := cfg.SocketLBScope == SocketLBNode
	if nodeOnly && cfg.NoTC {
		return nil, errors.New("--socket-lb-scope=node needs the TC programs, which translate the pods' packets")
	}
	mig := newMigrations(log)
	l, err := loader.Load(loader.Config{BPFFSPath: cfg.BPFFSPath, CgroupPath: cgroupPath, Sizes: cfg.Sizes, NodeNetnsCookie: nodeNetns,
		NodeSocketsOnly: nodeOnly, Migrated: mig.report})
	if err != nil {
		return nil, fmt.Errorf("load BPF programs: %w", err)
	}
	km := maps.KernelMaps(&l.Objects.SockMaps)
	km.Maglev = maps.KernelMaglev(l.Maglev.Tables, l.Maglev.Fingerprints, l.Maglev.Table)
	lim := maps.Limits{Backends: l.Sizes.Backends, RevNat: l.Sizes.RevNat}
	w, err := maps.NewWriter(km, lim)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("restore state from pinned maps: %w", err)
	}
	km6 := maps.KernelMaps6(&l.Objects.SockMaps)
	km6.Maglev = maps.KernelMaglev(l.Maglev6.Tables, l.Maglev6.Fingerprints, l.Maglev6.Table)
	s6 := l.Sizes.Family6(0)
	w6, err := maps.NewWriter6(km6, maps.Limits{Backends: s6.Backends, RevNat: s6.RevNat})
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("restore IPv6 state from pinned maps: %w", err)
	}
	var term *sockterm.Terminator
	if cfg.TerminateSockets {
		// An IPv4 backend's sockets are in sock4_revnat_v1, also the
		// AF_INET6 ones that reached it through an IPv4-mapped address.
		v4, v6 := maps.SockTranslated(l.Objects.Sock4RevnatV1), maps.SockTranslated6(l.Objects.Sock6RevnatV1)
		translated := func(cookie uint64, backend netip.AddrPort) bool {
			if backend.Addr().Is4() {
				return v4(cookie, backend)
			}
			return v6(cookie, backend)
		}
		if term, err = sockterm.New(sockterm.Config{Translated: translated, Logger: log.Named("sockterm")}); err != nil {
			l.Close()
			return nil, err
		}
	}
	if !l.Features.SetRetval {
		log.Warn("kernel lacks bpf_set_retval in cgroup programs: connections to Services without endpoints fail with EPERM instead of ECONNREFUSED")
	}
	var tc *tcAttacher
	pods := newPodMetrics() // the attacher's, with TC
	published := func() *loader.TCLoaded { return nil }
	if !cfg.NoTC {
		if tc, err = newTCAttacher(cfg, log, mig.report, addTrackedPorts(w, w6, log)); err != nil {
			l.Close()
			return nil, err
		}
		published = tc.published.Load
		pods = tc.podMetrics
	}
	fe, be := w.Counts()
	fe6, be6 := w6.Counts()
	log.Info("BPF programs attached", zap.String("cgroupPath", cgroupPath), zap.String("bpffsPath", cfg.BPFFSPath),
		zap.String("socketLBScope", cfg.SocketLBScope),
		zap.Int("restoredFrontends", fe), zap.Int("restoredBackends", be),
		zap.Int("restoredIPv6Frontends", fe6), zap.Int("restoredIPv6Backends", be6))

	optOutMetrics := newOptOutMetrics()
	d := &Dataplane{Writer: w, w6: w6, term: term, log: log, loaded: l, tc: tc, wake: make(chan struct{}, 1), written: cfg.Written,
		ranges:       &sourceRangeCheck{set: l.SetSourceRangeCheck, on: l.SourceRangeCheck, log: log},
		terminated:   newTerminatedCounter(),
		pins:         loader.NewPinGuard(cfg.BPFFSPath),
		pinsRestored: newPinsRestoredCounter(),
		mapFull:      newMapFullCounter(),
	}
	if tc != nil && !nodeOnly {
		d.optOut = &optOut{reported: -1, metrics: optOutMetrics, lister: sockterm.NodeNamespaces}
	}
	if err := d.pins.Refresh(); err != nil {
		log.Warn("cannot hold every pin under the bpffs path; those not held are not restored if removed", zap.Error(err))
	}
	cfg.Metrics.Registry().MustRegister(
		dataplaneCollectors(newCollector(l, w, w6, published, cfg.MapCountInterval), mig, d.terminated, d.pinsRestored, d.mapFull, pods, optOutMetrics)...)
	if term != nil {
		go d.run(ctx)
	}
	interval := cfg.PinCheckInterval
	if interval <= 0 {
		interval = DefaultPinCheckInterval
	}
	go d.guardPins(ctx, interval)
	if nodeOnly || d.optOut != nil {
		go d.watchPods(ctx)
	}
	return d, nil
}

func newMapFullCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ebpfproxy_bpf_map_full_total",
		Help: "Syncs of the BPF dataplane that found a map full; the ServicePorts that did not fit were left as they were.",
	})
}

func newPinsRestoredCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ebpfproxy_bpf_pins_restored_total",
		Help: "Pins of maps and links under the bpffs path that were removed behind the agent's back and pinned again.",
	})
}

// guardPins checks the pins every interval until ctx is done.
func (d *Dataplane) guardPins(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		d.syncMu.Lock()
		if !d.closed {
			d.repairPins()
		}
		d.syncMu.Unlock()
	}
}

// repairPins pins again what was unpinned behind the agent's back, and
// says so. Called with syncMu held.
func (d *Dataplane) repairPins() {
	restored, err := d.pins.Repair()
	if len(restored) > 0 {
		d.pinsRestored.Add(float64(len(restored)))
		d.log.Warn("pins removed behind the agent's back were restored: the programs kept running, and an agent restarted now adopts them",
			zap.Int("pins", len(restored)), zap.Strings("paths", restored))
	}
	if err != nil {
		d.log.Error("cannot restore pins removed behind the agent's back: a restarted agent would start without them", zap.Error(err))
	}
}

// refreshPins makes the pins that exist after a sync, which may have
// attached or detached programs, the ones to guard. Called with syncMu
// held.
func (d *Dataplane) refreshPins() {
	if err := d.pins.Refresh(); err != nil {
		d.log.Warn("cannot hold every pin under the bpffs path; those not held are not restored if removed", zap.Error(err))
	}
}

func newTerminatedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ebpfproxy_sockets_terminated_total",
		Help: "Sockets ended because the backend they were connected to through a Service was removed, by protocol.",
	}, []string{"protocol"})
}

// dataplaneCollectors are the collectors New registers on the agent's
// registry, and DescribeMetrics describes.
func dataplaneCollectors(c *collector, mig *migrations, terminated *prometheus.CounterVec, pinsRestored, mapFull prometheus.Counter, pods podMetrics, optOut optOutMetrics) []prometheus.Collector {
	return []prometheus.Collector{c, mig.total, terminated, pinsRestored, mapFull, pods.devices, pods.failures, optOut.pods, optOut.unresolved}
}

// DescribeMetrics sends the descriptors of the metrics the BPF dataplane
// registers on the agent's registry (those of package metrics aside),
// without loading anything: for checks that dashboards and alerts name
// metrics the agent really exports.
func DescribeMetrics(ch chan<- *prometheus.Desc) {
	for _, c := range dataplaneCollectors(newCollector(nil, nil, nil, nil, 0), newMigrations(zap.NewNop()), newTerminatedCounter(), newPinsRestoredCounter(), newMapFullCounter(), newPodMetrics(), newOptOutMetrics()) {
		c.Describe(ch)
	}
}

// Dataplane is the BPF dataplane: the maps Writer, the programs it
// attached, and the ending of sockets still connected to backends a sync
// removed: TCP connections are aborted rather than left hanging on a dead
// pod, and connected UDP sockets (a DNS client's) are closed so that the
// application reconnects to a live backend.
type Dataplane struct {
	*maps.Writer
	// w6 writes the IPv6 maps, for the dataplane IPv6 returns.
	w6 *maps.Writer
	// syncMu serialises the syncs of both families, which share the
	// source range check, and the checks of the pins.
	syncMu sync.Mutex
	// closed is set under syncMu by Close.
	closed bool
	// pins holds the pinned maps and links, to pin again those removed
	// behind the agent's back; guarded by syncMu.
	pins         *loader.PinGuard
	pinsRestored prometheus.Counter
	// mapFull counts the syncs that found a map full.
	mapFull prometheus.Counter
	term    *sockterm.Terminator
	log     *zap.Logger
	loaded  *loader.Loaded
	// tc attaches the TC and XDP programs once the node's devices are
	// known; nil with Config.NoTC.
	tc *tcAttacher
	// ranges attaches and detaches the source range check around syncs.
	ranges *sourceRangeCheck

	mu      sync.Mutex
	pending []sockterm.Backend
	wake    chan struct{}

	terminated *prometheus.CounterVec

	// optOut are the pods opted out of the socket hooks
	// (SetOptedOutPods); nil under --socket-lb-scope=node or without TC.
	optOut *optOut

	// written calls Config.Written; wrote says, per family (IPv4, IPv6),
	// that it was called. Guarded by syncMu.
	written func(family string)
	wrote   [2]bool
}

// Loaded returns the loaded socket programs and their maps: for the
// kernel suites and benchmarks that run the programs directly or read
// their counters, never to write the maps (the Writer does).
func (d *Dataplane) Loaded() *loader.Loaded { return d.loaded }

// Name implements dataplane.Dataplane.
func (d *Dataplane) Name() string { return Name }

// SetSourceRangeCheck attaches or detaches the socket programs'
// loadBalancerSourceRanges check as a sync does, and has the pin guard
// follow: for the benchmarks that compare traffic with and without it,
// whatever the maps hold. The next sync attaches or detaches it again as
// the maps need.
func (d *Dataplane) SetSourceRangeCheck(on bool) error {
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	defer d.refreshPins()
	return d.ranges.set(on)
}

// Sync implements dataplane.Dataplane. Sockets are ended after the maps no
// longer name the removed backends, so a reconnecting client cannot land on
// them again, and outside the sync loop, which must not wait for a scan of
// every network namespace.
func (d *Dataplane) Sync(up model.Update) error { return d.sync(up, false) }

// sync writes up, a model of the family v6 says, to that family's maps.
func (d *Dataplane) sync(up model.Update, v6 bool) error {
	w := d.Writer
	if v6 {
		w = d.w6
	}
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	d.repairPins()
	defer d.refreshPins()
	if d.tc != nil {
		attached := d.tc.loaded != nil
		err := d.tc.prepare(&up.State.Node, v6)
		if !attached && d.tc.loaded != nil {
			// The TC (and XDP) programs were attached just now: their
			// pins are guarded from here on, not only once the maps
			// are written.
			d.refreshPins()
			if d.optOut != nil && len(d.optOut.want) > 0 {
				if err := d.refreshOptOut(context.Background()); err != nil {
					d.log.Warn("pods opted out of the socket hooks", zap.Error(err))
				}
			}
		}
		if err != nil {
			return err
		}
	}
	if err := d.ranges.before(up); err != nil {
		return err
	}
	if err := w.Sync(up); err != nil {
		return d.failed(err)
	}
	d.firstWritten(v6)
	d.ranges.after(d.Writer, d.w6)
	d.terminate(w)
	return nil
}

// firstWritten calls Config.Written after the first sync of the family v6
// says has written its maps.
func (d *Dataplane) firstWritten(v6 bool) {
	i, family := 0, metrics.IPv4
	if v6 {
		i, family = 1, metrics.IPv6
	}
	if d.wrote[i] || d.written == nil {
		return
	}
	d.wrote[i] = true
	d.written(family)
}

// failed counts a sync that found a map full, and says which flags size
// the maps.
func (d *Dataplane) failed(err error) error {
	if !errors.Is(err, maps.ErrMapFull) {
		return err
	}
	d.mapFull.Inc()
	return fmt.Errorf("%w (what does not fit is left as it was and retried, the rest is programmed; "+
		"--bpf-map-services-max, --bpf-map-backends-max and --bpf-map-revnat-max set the maps' capacities)", err)
}

// terminate hands the backends the last sync of w removed to the goroutine
// that ends their sockets.
func (d *Dataplane) terminate(w *maps.Writer) {
	if d.term == nil {
		return
	}
	var gone []sockterm.Backend
	for _, b := range w.Removed() {
		if b.Proto == model.TCP || b.Proto == model.UDP {
			gone = append(gone, sockterm.Backend{Addr: netipAddrPort(b), Proto: b.Proto})
		}
	}
	if len(gone) == 0 {
		return
	}
	d.mu.Lock()
	d.pending = append(d.pending, gone...)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// run ends the sockets of removed backends until ctx is done.
func (d *Dataplane) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		}
		d.mu.Lock()
		batch := d.pending
		d.pending = nil
		d.mu.Unlock()
		st, err := d.term.Terminate(ctx, batch)
		d.terminated.WithLabelValues("TCP").Add(float64(st.DestroyedTCP))
		d.terminated.WithLabelValues("UDP").Add(float64(st.DestroyedUDP))
		switch {
		case errors.Is(err, sockterm.ErrNamespaceAccess) && st.NamespaceErrors == 0:
			// A namespace of the node hidden from the agent (not run
			// with hostPID, or a process shielded by a security
			// module): the others were searched.
			d.log.Warn("could not read some network namespaces: sockets of removed backends in them were not ended (the agent needs root and hostPID to read them all)",
				zap.Int("backends", len(batch)), zap.Int("searched", st.Namespaces), zap.Error(err))
		case err != nil:
			d.log.Warn("ending sockets of removed backends", zap.Int("backends", len(batch)), zap.Error(err))
		}
		if st.DestroyedTCP+st.DestroyedUDP > 0 {
			d.log.Info("ended sockets connected to removed backends", zap.Int("backends", len(batch)),
				zap.Int("tcp", st.DestroyedTCP), zap.Int("udp", st.DestroyedUDP), zap.Int("namespaces", st.Namespaces))
		}
	}
}

func netipAddrPort(b maps.Backend) netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

// IPv6 returns the dataplane of the IPv6 Services, which programs the
// IPv6 maps of the programs d loaded: the socket programs translate IPv6
// destinations (AF_INET6 sockets) through them, as they translate IPv4
// ones through the maps d's own Sync writes.
//
// Its contract is dataplane.Dataplane's, for the IPv6 model: every
// model.Update it syncs holds an IPv6 State (IPv6 ClusterIPs, external and
// LoadBalancer IPs, endpoints and source ranges; addresses of another
// family in it are ignored), and the first Sync after New is a full one.
// Its ids (backends, reverse NAT, ServicePorts) are restored at New from
// the pinned IPv6 maps, apart from the IPv4 ones. It may be synced from its
// own goroutine: its Syncs and d's are serialised. It shares d's lifetime:
// d.Close closes it; it has no Close of its own. Every call returns the
// same dataplane.
//
// NodePorts are served on the IPv6 addresses of up.State.Node.NodePorts
// (nodeaddrs.Local lists both families for the trackers). The TC programs
// translate IPv6 traffic from outside to NodePorts, external and
// LoadBalancer IPs as they do IPv4's, source-NATing to each device's IPv6
// address (a node address of up.State.Node.Addrs on it, else its first
// global one), and translate ICMPv6 errors about those flows as ICMP ones
// (a packet too big about a reply reaches its backend: path MTU discovery
// through an IPv6 NodePort). The XDP fast path, where --xdp attaches it,
// forwards IPv6 flows to remote backends as it does IPv4 ones, with the
// same flow entries as the TC programs.
//
// IPv6 ServicePorts that use Maglev get their tables (lb6_maglev_v1), which
// the TC programs choose by for new flows from outside, as for IPv4.
// Sockets connected through the socket hooks to a removed IPv6 backend are
// ended as IPv4 ones are.
func (d *Dataplane) IPv6() dataplane.Dataplane { return ipv6Dataplane{d} }

// ipv6Dataplane is what IPv6 returns.
type ipv6Dataplane struct{ d *Dataplane }

// Name implements dataplane.Dataplane.
func (p ipv6Dataplane) Name() string { return Name }

// Sync implements dataplane.Dataplane: it writes up, an IPv6 model, to
// the IPv6 maps, with the source range check attached around it as for
// IPv4.
func (p ipv6Dataplane) Sync(up model.Update) error { return p.d.sync(up, true) }

// Close releases the dataplane's handles. The programs stay attached and
// the maps pinned: they keep serving until the next agent adopts them.
func (d *Dataplane) Close() {
	d.syncMu.Lock()
	d.closed = true
	d.pins.Close()
	d.syncMu.Unlock()
	if d.tc != nil {
		d.tc.close()
	}
	d.loaded.Close()
}
