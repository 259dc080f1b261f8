package bpf

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// localAddrs are the IPv4 addresses of the node's devices, with the device
// that holds each.
func localAddrs() (map[netip.Addr]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	out := map[netip.Addr]string{}
	for _, lk := range links {
		addrs, err := netlink.AddrList(lk, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", lk.Attrs().Name, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
				out[ip] = lk.Attrs().Name
			}
		}
	}
	return out, nil
}

// tcAttacher attaches the TC programs to the node's devices once it knows
// them: at start-up with --devices, else at the first sync that knows the
// node's addresses (the devices carrying them).
type tcAttacher struct {
	cfg     loader.TCConfig
	devices []string
	log     *zap.Logger
	// xdpMode is --xdp; metrics take the XDP attachment's outcome.
	xdpMode string
	metrics *metrics.Metrics

	loaded *loader.TCLoaded
	xdp    *loader.XDPLoaded
	// local are the node's IPv4 addresses and their devices, read once
	// at start-up: the devices holding the node's addresses are those
	// attached to.
	local  map[netip.Addr]string
	warned bool
	// names are the devices attached to, snat6 the IPv6 source NAT
	// addresses last written for them. nl is a netlink handle in the
	// namespace the attacher was made in, where the devices are: IPv6
	// syncs may run on any thread.
	names []string
	snat6 map[string]netip.Addr
	nl    *netlink.Handle
}

func newTCAttacher(c Config, log *zap.Logger, migrated func(loader.MapMigration)) (*tcAttacher, error) {
	local, err := localAddrs()
	if err != nil {
		return nil, err
	}
	if err := checkSNATPortRange(c.SNATPorts, c.SNATPortRangeForce, ephemeralPortsFile, reservedPortsFile, log); err != nil {
		return nil, err
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	a := &tcAttacher{
		nl: nl,
		cfg: loader.TCConfig{
			BPFFSPath: c.BPFFSPath, Sizes: c.Sizes, ConntrackSize: c.ConntrackSize, Attach: c.TCAttach,
			SNATPortMin: c.SNATPorts.Min, SNATPortMax: c.SNATPorts.Max, Migrated: migrated,
		},
		devices: c.Devices,
		log:     log,
		local:   local,
		xdpMode: c.XDP,
		metrics: c.Metrics,
	}
	if len(a.devices) > 0 {
		if err := a.attach(nil); err != nil {
			nl.Close()
			return nil, err
		}
	}
	return a, nil
}

// prepare is called before every sync: it attaches once the devices
// holding the node's addresses are known.
func (a *tcAttacher) prepare(node *model.Node) error {
	if a.loaded != nil {
		return nil
	}
	return a.attach(node.Addrs)
}

// prepare6 is called before every IPv6 sync: once the TC programs are
// attached, it gives each device the IPv6 source NAT address the IPv6
// State's node addresses say (one on the device, else its first global
// IPv6 address), writing only what changed.
func (a *tcAttacher) prepare6(node *model.Node) error {
	if a.loaded == nil {
		return nil
	}
	addrs := map[int]netip.Addr{}
	next := map[string]netip.Addr{}
	changed := false
	for _, name := range a.names {
		lk, err := a.nl.LinkByName(name)
		if err != nil {
			return fmt.Errorf("device %s: %w", name, err)
		}
		ip, err := snatAddress6(a.nl, name, node.Addrs)
		if err != nil {
			return err
		}
		changed = changed || a.snat6[name] != ip
		addrs[lk.Attrs().Index] = ip
		next[name] = ip
	}
	if !changed {
		return nil
	}
	if err := a.loaded.SetIPv6SNAT(addrs); err != nil {
		return err
	}
	a.snat6 = next
	return nil
}

// attach resolves the devices (--devices, else those carrying nodeAddrs)
// and their source NAT addresses, and loads the TC programs onto them. With
// no device it attaches nothing and says so once.
func (a *tcAttacher) attach(nodeAddrs []netip.Addr) error {
	names := a.devices
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
		if !a.warned {
			a.log.Warn("no device carries the node's addresses and --devices is not set: NodePort, ExternalIP and LoadBalancer-IP traffic from outside is not translated",
				zap.Stringers("nodeAddresses", nodeAddrs))
			a.warned = true
		}
		return nil
	}
	var devs []loader.TCDevice
	for _, name := range names {
		snat, err := snatAddress(name, nodeAddrs)
		if err != nil {
			return err
		}
		// The IPv6 State's node addresses come with the IPv6 sync
		// (prepare6), which refines this choice.
		snat6, err := snatAddress6(a.nl, name, nil)
		if err != nil {
			return err
		}
		devs = append(devs, loader.TCDevice{Name: name, SNAT: snat, SNAT6: snat6})
	}
	cfg := a.cfg
	cfg.Devices = devs
	l, err := loader.LoadTC(cfg)
	if err != nil {
		return fmt.Errorf("attach the TC programs: %w", err)
	}
	a.loaded = l
	a.names = names
	a.snat6 = map[string]netip.Addr{}
	for _, d := range devs {
		a.snat6[d.Name] = d.SNAT6
	}
	a.log.Info("TC programs attached", zap.Strings("devices", names), zap.String("mode", l.Mode))
	return a.attachXDP(cfg, names)
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

// snatAddress is the address source NAT gives traffic leaving dev: a node
// address on it if it has one, else its first IPv4 address.
func snatAddress(dev string, nodeAddrs []netip.Addr) (netip.Addr, error) {
	lk, err := netlink.LinkByName(dev)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--devices: %s: %w", dev, err)
	}
	addrs, err := netlink.AddrList(lk, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", dev, err)
	}
	var first netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		if slices.Contains(nodeAddrs, ip) {
			return ip, nil
		}
		if !first.IsValid() {
			first = ip
		}
	}
	if !first.IsValid() {
		return netip.Addr{}, fmt.Errorf("device %s has no IPv4 address to source-NAT to", dev)
	}
	return first, nil
}

// snatAddress6 is the IPv6 address source NAT gives traffic leaving dev: a
// node address on it if it has one, else its first global IPv6 address, or
// the zero Addr when it has none (its IPv6 traffic to remote backends is
// then dropped and counted).
func snatAddress6(nl *netlink.Handle, dev string, nodeAddrs []netip.Addr) (netip.Addr, error) {
	lk, err := nl.LinkByName(dev)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--devices: %s: %w", dev, err)
	}
	addrs, err := nl.AddrList(lk, netlink.FAMILY_V6)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("IPv6 addresses of %s: %w", dev, err)
	}
	var first netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || !ip.Is6() || ip.Is4In6() || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
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

func (a *tcAttacher) close() {
	a.nl.Close()
	if a.xdp != nil {
		a.xdp.Close()
	}
	if a.loaded != nil {
		a.loaded.Close()
	}
}
