package bpf

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// localAddrs are the addresses of both families of the node's devices,
// with the device that holds each.
func localAddrs(nl *netlink.Handle) (map[netip.Addr]string, error) {
	links, err := nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	out := map[netip.Addr]string{}
	for _, lk := range links {
		addrs, err := nl.AddrList(lk, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", lk.Attrs().Name, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out[ip.Unmap()] = lk.Attrs().Name
			}
		}
	}
	return out, nil
}

// Families of the attacher's per-family state.
const (
	fam4 = iota
	fam6
)

// tcAttacher attaches the TC programs to the node's devices once it knows
// them: at start-up with --devices, else at the first sync that knows some
// of the node's addresses, of either family (the devices carrying them), so
// that an IPv6-only node is served as a dual-stack or IPv4 one is. In the
// latter case the programs are loaded (verified) in the background from
// start-up, while the agent lists the API, and that sync only attaches
// them.
type tcAttacher struct {
	cfg     loader.TCConfig
	devices []string
	log     *zap.Logger
	// xdpMode is --xdp; metrics take the XDP attachment's outcome.
	xdpMode string
	metrics *metrics.Metrics

	loaded *loader.TCLoaded
	// published is loaded for the metrics collector, which reads it
	// from scrapes, outside the syncs that set loaded.
	published atomic.Pointer[loader.TCLoaded]
	xdp       *loader.XDPLoaded
	// local are the node's addresses and their devices, read once at
	// start-up: the devices holding the node's addresses are those
	// attached to.
	local map[netip.Addr]string
	// nodeAddrs are each family's node addresses as its last sync gave
	// them, synced which families have synced. warned says that the
	// missing device was logged; strays the node addresses already
	// logged as on a device without the programs.
	nodeAddrs [2][]netip.Addr
	synced    [2]bool
	warned    bool
	strays    map[netip.Addr]bool
	// names are the devices attached to, snat each family's source NAT
	// addresses last written for them. ns and nl are the namespace the
	// attacher was made in, where the devices are, and a netlink handle
	// in it: syncs may run on any thread.
	names []string
	snat  [2]map[string]netip.Addr
	// pods says pods' devices get the TC programs too (their sockets are
	// not translated: --socket-lb-scope=node); podNames are those attached
	// to, sorted, and podMetrics count them.
	pods       bool
	podNames   []string
	podMetrics podMetrics
	// optedOut are, without pods, the devices of pods opted out of the
	// socket hooks (Dataplane.SetOptedOutPods) ever found, which get the
	// TC programs while they exist.
	optedOut map[string]bool
	ns       vnetns.NsHandle
	nl       *netlink.Handle
	// shareWritten says that a family's next hop sharing was written,
	// share how far it goes and shareWhy why not further ("": every
	// client's flows share); sys is where its parameters are read
	// (nexthopSharing).
	shareWritten [2]bool
	share        [2]loader.NexthopShare
	shareWhy     [2]string
	sys          sysctl.Sysctl
	// preloaded gives, once, the TC programs loaded in the background
	// from start-up, when the devices are known only at the first sync:
	// that sync then attaches them, not waiting for the verifier. nil
	// once taken, or with --devices.
	preloaded chan tcPreload
}

// tcPreload is what loader.PreloadTC gave.
type tcPreload struct {
	l   *loader.TCLoaded
	err error
}

// preloadTC is loader.PreloadTC; a test may hold it back.
var preloadTC = loader.PreloadTC

// newTCAttacher returns the attacher of the TC and XDP programs;
// beforeAttach is loader.TCConfig.BeforeAttach.
func newTCAttacher(c Config, log *zap.Logger, migrated func(loader.MapMigration), beforeAttach func(*bpfobj.TcObjects) error) (*tcAttacher, error) {
	if err := checkSNATPortRange(c.SNATPorts, c.SNATPortRangeForce, ephemeralPortsFile, reservedPortsFile, log); err != nil {
		return nil, err
	}
	ns, err := vnetns.Get()
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	local, err := localAddrs(nl)
	if err != nil {
		nl.Close()
		ns.Close()
		return nil, err
	}
	a := &tcAttacher{
		ns: ns,
		nl: nl,
		cfg: loader.TCConfig{
			BPFFSPath: c.BPFFSPath, Sizes: c.Sizes, ConntrackSize: c.ConntrackSize, Attach: c.TCAttach,
			SNATPortMin: c.SNATPorts.Min, SNATPortMax: c.SNATPorts.Max, Migrated: migrated,
			BeforeAttach: beforeAttach,
		},
		devices:    c.Devices,
		log:        log,
		local:      local,
		xdpMode:    c.XDP,
		metrics:    c.Metrics,
		strays:     map[netip.Addr]bool{},
		sys:        sysctl.Default,
		pods:       c.SocketLBScope == SocketLBNode,
		optedOut:   map[string]bool{},
		podMetrics: newPodMetrics(),
	}
	if len(a.devices) > 0 {
		if err := a.attach(); err != nil {
			a.close()
			return nil, err
		}
		return a, nil
	}
	a.preloaded = make(chan tcPreload, 1)
	go func() {
		l, err := preloadTC(a.cfg)
		a.preloaded <- tcPreload{l, err}
	}()
	return a, nil
}

// load gives the TC programs attached to cfg's devices: those preloaded at
// start-up, the first time, else (a preload that found pinned maps to
// migrate, a later attempt) loaded now. A failed preload fails this
// attempt as a load now would; the next one loads again.
func (a *tcAttacher) load(cfg loader.TCConfig) (*loader.TCLoaded, error) {
	if a.preloaded != nil {
		p := <-a.preloaded
		a.preloaded = nil
		if p.err != nil {
			return nil, p.err
		}
		if p.l != nil {
			if err := p.l.AttachDevices(cfg); err != nil {
				return nil, err
			}
			return p.l, nil
		}
	}
	return loader.LoadTC(cfg)
}

// prepare is called before every sync of a family (v6 for IPv6) with the
// node of its State: it attaches once the devices holding the node's
// addresses are known, and then gives each device the family's source NAT
// address the State's node addresses say (one on the device, else its
// first global address of the family), writing only what changed.
func (a *tcAttacher) prepare(node *model.Node, v6 bool) error {
	f := fam4
	if v6 {
		f = fam6
	}
	prev := a.nodeAddrs[f]
	a.nodeAddrs[f], a.synced[f] = node.Addrs, true
	if a.loaded == nil {
		if err := netns.DoHandle(a.ns, a.attach); err != nil || a.loaded == nil {
			return err
		}
	}
	a.warnStrays(node.Addrs)
	if err := a.shareNexthops(f, v6); err != nil {
		return err
	}
	next := map[string]netip.Addr{}
	addrs := map[int]netip.Addr{}
	changed := false
	add := func(name string, pod bool) error {
		lk, err := a.nl.LinkByName(name)
		if err != nil {
			if pod {
				return nil // a pod's, gone: the next refreshPods forgets it
			}
			return fmt.Errorf("device %s: %w", name, err)
		}
		ip, err := a.deviceAddress(name, pod, v6, node.Addrs)
		if err != nil {
			return err
		}
		changed = changed || a.snat[f][name] != ip
		addrs[lk.Attrs().Index] = ip
		next[name] = ip
		return nil
	}
	for _, name := range a.names {
		if err := add(name, false); err != nil {
			return err
		}
	}
	// A sync changes pods' devices' addresses (refreshPods sets them) only
	// through the node's: a node with a hundred pods is not asked for
	// five hundred netlink answers at every sync.
	if !changed && slices.Equal(prev, node.Addrs) {
		return nil
	}
	for _, name := range a.podNames {
		if err := add(name, true); err != nil {
			return err
		}
	}
	if !changed {
		return nil
	}
	set := a.loaded.SetIPv4SNAT
	if v6 {
		set = a.loaded.SetIPv6SNAT
	}
	if err := set(addrs); err != nil {
		return err
	}
	a.snat[f] = next
	return nil
}

// shareNexthops tells the programs how far new flows of family f share
// their next hop (nexthopSharing), when that changed since the last sync
// of the family, and logs the change. What cannot be read turns sharing
// off, which is always correct, rather than failing the sync.
func (a *tcAttacher) shareNexthops(f int, v6 bool) error {
	var share loader.NexthopShare
	var why string
	err := netns.DoHandle(a.ns, func() error {
		var err error
		share, why, err = nexthopSharing(a.nl, a.sys, v6)
		return err
	})
	if err != nil {
		share, why = loader.NexthopShareOff, err.Error()
	}
	if a.shareWritten[f] && a.share[f] == share && a.shareWhy[f] == why {
		return nil
	}
	if err := a.loaded.SetNexthopSharing(v6, share); err != nil {
		return err
	}
	family := "IPv4"
	if v6 {
		family = "IPv6"
	}
	switch share {
	case loader.NexthopShareAll:
		a.log.Info("new flows to a backend share the next hop found in the same second, whatever their client", zap.String("family", family))
	case loader.NexthopShareClient:
		a.log.Info("a client's new flows to a backend share the next hop found in the same second; other clients' look it up", zap.String("family", family), zap.String("reason", why))
	default:
		a.log.Info("every new flow's next hop is looked up", zap.String("family", family), zap.String("reason", why))
	}
	a.shareWritten[f], a.share[f], a.shareWhy[f] = true, share, why
	return nil
}

// warnStrays logs once each node address that is on a device the programs
// are not attached to, found after they were (the other family's first
// sync, a new address): traffic from outside to it is not translated.
func (a *tcAttacher) warnStrays(nodeAddrs []netip.Addr) {
	if len(a.devices) > 0 {
		return
	}
	for _, ip := range nodeAddrs {
		dev, ok := a.local[ip]
		if !ok || slices.Contains(a.names, dev) || a.strays[ip] {
			continue
		}
		a.strays[ip] = true
		a.log.Warn("a node address is on a device the TC programs are not attached to: traffic from outside to it is not translated; list the devices with --devices",
			zap.Stringer("address", ip), zap.String("device", dev), zap.Strings("attached", a.names))
	}
}

// attach resolves the devices (--devices, else those carrying the node
// addresses of the families synced so far) and their source NAT addresses,
// and loads the TC programs onto them. It runs in the attacher's
// namespace. With no device it attaches nothing, and says so once every
// family has synced.
func (a *tcAttacher) attach() error {
	names := a.devices
	nodeAddrs := slices.Concat(a.nodeAddrs[fam4], a.nodeAddrs[fam6])
	if len(names) == 0 {
		for _, ip := range nodeAddrs {
			if dev, ok := a.local[ip]; ok && !slices.Contains(names, dev) {
				names = append(names, dev)
			}
		}
	}
	if len(names) == 0 {
		// Guessing a device (the one with the default route, say)
		// could put the programs on an interface nobody meant to
		// proxy on: say so and wait for a Node address or --devices.
		if !a.warned && a.synced[fam4] && a.synced[fam6] {
			a.log.Warn("no device carries the node's addresses and --devices is not set: NodePort, ExternalIP and LoadBalancer-IP traffic from outside is not translated",
				zap.Stringers("nodeAddresses", nodeAddrs))
			a.warned = true
		}
		return nil
	}
	podNames, err := a.podDevices(names)
	if err != nil {
		return err
	}
	devs, snat, err := a.tcDevices(names, podNames)
	if err != nil {
		return err
	}
	cfg := a.cfg
	cfg.Devices = devs
	l, err := a.load(cfg)
	if err != nil {
		return fmt.Errorf("attach the TC programs: %w", err)
	}
	a.loaded = l
	a.published.Store(l)
	a.names = names
	a.podNames = podNames
	a.snat = snat
	a.log.Info("TC programs attached", zap.Strings("devices", names), zap.String("mode", l.Mode),
		zap.Bool("conntrackLookup", l.ConntrackLookup))
	a.podMetrics.devices.Set(float64(len(podNames)))
	if a.pods {
		a.log.Info("pods' devices: TC programs attached; pods' sockets are not translated (--socket-lb-scope=node), their packets are",
			zap.Int("devices", len(podNames)), zap.Strings("added", podNames))
	}
	// Without nf_conntrack no connection can be netfilter's.
	if !l.ConntrackLookup && nfconntrack.Node.Tracking() {
		a.log.Warn("the kernel lacks the conntrack kfuncs (6.0 and later, nf_conntrack loaded with its BTF): connections netfilter translated before the TC programs attached (kube-proxy's) break at their next segment")
	}
	return a.attachXDP(cfg, names)
}

// tcDevices are the TC devices names (the node's) and podNames (pods') with
// their source NAT addresses of each family (pods': the hairpin address),
// and those addresses by family and name. It runs in the attacher's
// namespace.
func (a *tcAttacher) tcDevices(names, podNames []string) ([]loader.TCDevice, [2]map[string]netip.Addr, error) {
	var devs []loader.TCDevice
	snat := [2]map[string]netip.Addr{{}, {}}
	for _, name := range slices.Concat(names, podNames) {
		pod := !slices.Contains(names, name)
		snat4, err := a.deviceAddress(name, pod, false, a.nodeAddrs[fam4])
		if err != nil {
			return nil, snat, err
		}
		snat6, err := a.deviceAddress(name, pod, true, a.nodeAddrs[fam6])
		if err != nil {
			return nil, snat, err
		}
		devs = append(devs, loader.TCDevice{Name: name, SNAT: snat4, SNAT6: snat6, Pod: pod})
		snat[fam4][name], snat[fam6][name] = snat4, snat6
	}
	return devs, snat, nil
}

// deviceAddress is the source NAT address of family v6 of the device name:
// snatAddress for the node's devices, hairpinAddress for pods' (pod).
func (a *tcAttacher) deviceAddress(name string, pod, v6 bool, nodeAddrs []netip.Addr) (netip.Addr, error) {
	if pod {
		return hairpinAddress(a.nl, name, v6, nodeAddrs)
	}
	return snatAddress(a.nl, name, v6, nodeAddrs)
}

// attachXDP puts the XDP fast path on the TC programs' devices, as far as
// they take it in --xdp's mode: a device that refuses it, or a kernel that
// cannot load it, leaves TC alone doing the work, which is logged and
// counted rather than fatal. With --xdp=off it detaches what an earlier run
// attached.
func (a *tcAttacher) attachXDP(tc loader.TCConfig, names []string) error {
	if a.xdpMode == loader.XDPOff {
		if err := loader.CleanupXDP(tc.BPFFSPath); err != nil {
			return fmt.Errorf("detach the XDP programs of an earlier run: %w", err)
		}
		return nil
	}
	l, err := loader.LoadXDP(loader.XDPConfig{
		BPFFSPath: tc.BPFFSPath, Sizes: tc.Sizes, ConntrackSize: tc.ConntrackSize,
		SNATPortMin: tc.SNATPortMin, SNATPortMax: tc.SNATPortMax,
		Devices: names, Mode: a.xdpMode, Migrated: tc.Migrated,
	})
	if err != nil {
		a.log.Error("XDP fast path not loaded: the TC programs handle all traffic", zap.String("mode", a.xdpMode), zap.Error(err))
		for _, d := range names {
			a.xdpFailed(d)
		}
		return nil
	}
	a.xdp = l
	for _, d := range names {
		if err, failed := l.Failed[d]; failed {
			a.log.Warn("device refused the XDP program: the TC programs handle its traffic", zap.String("device", d), zap.String("mode", l.Mode), zap.Error(err))
			a.xdpFailed(d)
		}
	}
	for _, d := range l.Attached {
		if a.metrics != nil {
			a.metrics.XDPAttached.WithLabelValues(d, l.Mode).Set(1)
		}
	}
	if len(l.Attached) > 0 {
		a.log.Info("XDP fast path attached", zap.Strings("devices", l.Attached), zap.String("mode", l.Mode))
	}
	return nil
}

func (a *tcAttacher) xdpFailed(dev string) {
	if a.metrics == nil {
		return
	}
	a.metrics.XDPAttachFailuresTotal.WithLabelValues(dev, a.xdpMode).Inc()
	a.metrics.XDPAttached.WithLabelValues(dev, a.xdpMode).Set(0)
}

// snatAddress is the address of family v6 that source NAT gives traffic
// leaving dev: a node address on it if it has one, else its first global
// address of the family, or the zero Addr when it has none (its flows of
// that family to remote backends are then dropped and counted,
// tc_snat_no_address).
func snatAddress(nl *netlink.Handle, dev string, v6 bool, nodeAddrs []netip.Addr) (netip.Addr, error) {
	lk, err := nl.LinkByName(dev)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--devices: %s: %w", dev, err)
	}
	family := netlink.FAMILY_V4
	if v6 {
		family = netlink.FAMILY_V6
	}
	addrs, err := nl.AddrList(lk, family)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", dev, err)
	}
	var first netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is6() != v6 || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		if slices.Contains(nodeAddrs, ip) {
			return ip, nil
		}
		if !first.IsValid() {
			first = ip
		}
	}
	return first, nil
}

// close releases what the attacher holds. A preload still verifying is
// not waited for: it pins and attaches nothing, so nothing depends on it,
// and on a slow node the verifier could hold the agent's stop for many
// seconds; its programs are closed when it ends (or with the process).
func (a *tcAttacher) close() {
	if a.preloaded != nil {
		go func(c <-chan tcPreload) {
			if p := <-c; p.l != nil {
				p.l.Close()
			}
		}(a.preloaded)
		a.preloaded = nil
	}
	a.published.Store(nil)
	a.nl.Close()
	a.ns.Close()
	if a.xdp != nil {
		a.xdp.Close()
	}
	if a.loaded != nil {
		a.loaded.Close()
	}
}

// addTrackedPorts returns what LoadTC calls before it attaches: the
// frontend ports of the flows connection tracking holds go into the port
// filters of w4 and w6, so that the new programs keep translating a flow
// whose frontend is gone (deleted while an agent without the filter ran,
// say), as they did before.
func addTrackedPorts(w4, w6 *maps.Writer, log *zap.Logger) func(*bpfobj.TcObjects) error {
	return func(o *bpfobj.TcObjects) error {
		p4, err := maps.TrackedPorts(maps.FromKernel[maps.CTKey, maps.CTValue](o.Tc4CtV1))
		if err != nil {
			return fmt.Errorf("read the tracked IPv4 flows: %w", err)
		}
		p6, err := maps.TrackedPorts6(maps.FromKernel[maps.CT6Key, maps.CT6Value](o.Tc6CtV1))
		if err != nil {
			return fmt.Errorf("read the tracked IPv6 flows: %w", err)
		}
		if err := w4.AddPorts(p4); err != nil {
			return err
		}
		if err := w6.AddPorts(p6); err != nil {
			return err
		}
		log.Info("port filter holds the ports of the tracked flows", zap.Int("ipv4Ports", len(p4)), zap.Int("ipv6Ports", len(p6)))
		return nil
	}
}
