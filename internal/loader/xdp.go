package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// XDP modes (--xdp).
const (
	// XDPOff attaches no XDP program: the TC programs do everything.
	XDPOff = "off"
	// XDPNative runs the program in the driver, before the kernel builds
	// an skb; the driver must support it.
	XDPNative = "native"
	// XDPGeneric runs it on the skb at the start of the receive path: on
	// every device, for less gain.
	XDPGeneric = "generic"
)

// XDPConfig says where the XDP fast path (bpf/xdp.c) attaches. The TC
// programs must be attached to the same devices (LoadTC): the XDP program
// passes them everything it does not forward itself.
type XDPConfig struct {
	// BPFFSPath, Sizes, ConntrackSize and the source NAT port range must
	// be those of the TC programs, whose pinned maps it shares.
	BPFFSPath                string
	Sizes                    MapSizes
	ConntrackSize            uint32
	SNATPortMin, SNATPortMax uint16
	Devices                  []string
	// Mode is XDPNative or XDPGeneric.
	Mode string
	// Migrated is as Config.Migrated.
	Migrated func(MapMigration)
}

// XDPLoaded is the XDP program in the kernel and where it is attached.
type XDPLoaded struct {
	// Maps are the program's maps: its device map, and the TC programs'
	// pinned maps it shares.
	Maps bpfobj.XdpMaps
	// Program is the mode's program: xdp_nodeport in the driver,
	// xdp_nodeport_skb in generic mode. The other is never loaded: the
	// verifier would walk it for nothing.
	Program *ebpf.Program
	Mode    string
	// Attached are the devices the program runs on.
	Attached []string
	// Failed are the devices that refused it in Mode, with the reason:
	// their traffic goes through TC only.
	Failed map[string]error
	links  []link.Link
}

// xdpNative and xdpGeneric are what LoadXDP loads in each mode: the maps
// and the mode's program, multi-buffer aware in the driver, so that
// devices with a jumbo MTU take it; not in generic mode, where that makes
// the kernel copy skbs in a way the TC programs do not handle (see
// bpf/xdp.c).
type xdpNative struct {
	bpfobj.XdpMaps
	Program *ebpf.Program `ebpf:"xdp_nodeport"`
}

type xdpGeneric struct {
	bpfobj.XdpMaps
	Program *ebpf.Program `ebpf:"xdp_nodeport_skb"`
}

func (o *xdpNative) parts() (bpfobj.XdpMaps, *ebpf.Program)  { return o.XdpMaps, o.Program }
func (o *xdpGeneric) parts() (bpfobj.XdpMaps, *ebpf.Program) { return o.XdpMaps, o.Program }
func (o *xdpNative) Close() error                            { return closeXDP(o.parts()) }
func (o *xdpGeneric) Close() error                           { return closeXDP(o.parts()) }

// xdpMode is xdpNative or xdpGeneric.
type xdpMode interface {
	parts() (bpfobj.XdpMaps, *ebpf.Program)
	Close() error
}

func closeXDP(m bpfobj.XdpMaps, p *ebpf.Program) error {
	err := m.Close()
	if p != nil {
		err = errors.Join(err, p.Close())
	}
	return err
}

// ErrXDPMode is returned (wrapped) for a mode other than native or generic.
var ErrXDPMode = errors.New("unknown XDP mode")

func xdpPinName(mode, dev string) string { return "xdp_" + mode + "_" + dev }

// LoadXDP loads the XDP program with the maps pinned under cfg.BPFFSPath and
// attaches it to every device of cfg.Devices that accepts it in cfg.Mode,
// through links pinned there: a restarted agent replaces the program in
// place. A device that refuses is not an error: it is in Failed and keeps
// the TC programs only. Devices attached before and no longer configured,
// or in another mode, are detached. It fails only when the program cannot
// be loaded (then nothing attached changes) or the pins cannot be managed.
//
// It runs in the network namespace of the calling thread.
func LoadXDP(cfg XDPConfig) (*XDPLoaded, error) {
	flags := link.XDPDriverMode
	switch cfg.Mode {
	case XDPNative:
	case XDPGeneric:
		flags = link.XDPGenericMode
	default:
		return nil, fmt.Errorf("%w %q: use %s or %s", ErrXDPMode, cfg.Mode, XDPNative, XDPGeneric)
	}
	if err := ensureBPFFS(cfg.BPFFSPath); err != nil {
		return nil, err
	}
	for _, dir := range []string{mapsDir(cfg.BPFFSPath), linksDir(cfg.BPFFSPath)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	spec, err := bpfobj.LoadXdp()
	if err != nil {
		return nil, fmt.Errorf("load embedded XDP object: %w", err)
	}
	if err := patchNodePort(spec, cfg.Sizes, cfg.ConntrackSize, cfg.SNATPortMin, cfg.SNATPortMax); err != nil {
		return nil, err
	}
	l := &XDPLoaded{Mode: cfg.Mode, Failed: map[string]error{}}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapsDir(cfg.BPFFSPath)}}
	var objs xdpMode = &xdpNative{}
	if cfg.Mode == XDPGeneric {
		objs = &xdpGeneric{}
	}
	carries, err := loadPinned(spec, objs, opts, cfg.BPFFSPath, "the XDP program", "XDP objects", cfg.Migrated, false)
	if err != nil {
		return nil, err
	}
	// The TC programs, which load first, migrate the maps both use; one
	// left to this load is carried over once the devices are attached.
	defer carryOver(carries, cfg.Migrated)
	l.Maps, l.Program = objs.parts()
	wanted := map[string]bool{}
	for _, d := range cfg.Devices {
		wanted[xdpPinName(cfg.Mode, d)] = true
	}
	// A device has one XDP program, native or generic: links of devices
	// no longer configured or of the other mode go first.
	if err := detachStaleXDP(cfg.BPFFSPath, wanted); err != nil {
		l.Close()
		return nil, err
	}
	var ifindexes []uint32
	for _, d := range cfg.Devices {
		idx, err := l.attachDevice(cfg.BPFFSPath, d, flags)
		if err != nil {
			var pinErr *xdpPinError
			if errors.As(err, &pinErr) {
				l.Close()
				return nil, err
			}
			l.Failed[d] = err
			continue
		}
		l.Attached = append(l.Attached, d)
		ifindexes = append(ifindexes, idx)
	}
	if err := l.setDevices(ifindexes); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// xdpPinError is a failure to manage a pinned link, as opposed to a device
// refusing the program.
type xdpPinError struct{ err error }

func (e *xdpPinError) Error() string { return e.err.Error() }
func (e *xdpPinError) Unwrap() error { return e.err }

// attachDevice replaces the program of dev's pinned link, or attaches and
// pins a new link. It returns dev's ifindex.
func (l *XDPLoaded) attachDevice(bpffs, dev string, flags link.XDPAttachFlags) (uint32, error) {
	nl, err := netlink.LinkByName(dev)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrNoSuchDevice, dev, err)
	}
	idx := nl.Attrs().Index
	pin := filepath.Join(linksDir(bpffs), xdpPinName(l.Mode, dev))
	lk, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		info, ierr := lk.Info()
		if ierr == nil && info.XDP() != nil && int(info.XDP().Ifindex) == idx {
			if err := lk.Update(l.Program); err != nil {
				lk.Close()
				return 0, fmt.Errorf("replace the XDP program of %s in its pinned link: %w", dev, err)
			}
			l.links = append(l.links, lk)
			return uint32(idx), nil
		}
		// The device was recreated under the same name (or the link
		// was detached with it): a new link.
		if err := lk.Unpin(); err != nil {
			lk.Close()
			return 0, &xdpPinError{fmt.Errorf("unpin stale link %s: %w", pin, err)}
		}
		lk.Close()
	case !errors.Is(err, os.ErrNotExist):
		return 0, &xdpPinError{fmt.Errorf("open pinned link %s: %w", pin, err)}
	}
	lk, err = link.AttachXDP(link.XDPOptions{Program: l.Program, Interface: idx, Flags: flags})
	if err != nil {
		return 0, fmt.Errorf("attach the XDP program to %s in %s mode: %w", dev, l.Mode, err)
	}
	if err := lk.Pin(pin); err != nil {
		lk.Close()
		return 0, &xdpPinError{fmt.Errorf("pin XDP link of %s: %w", dev, err)}
	}
	l.links = append(l.links, lk)
	return uint32(idx), nil
}

// setDevices makes ifindexes the devices the program redirects to, and no
// others.
func (l *XDPLoaded) setDevices(ifindexes []uint32) error {
	m := l.Maps.Xdp4DevsV1
	for _, idx := range ifindexes {
		if err := m.Put(idx, idx); err != nil {
			return fmt.Errorf("device map entry of ifindex %d: %w", idx, err)
		}
	}
	return pruneKeys[uint32](m, ifindexes, "XDP device map entry")
}

// detachStaleXDP unpins (and so detaches) the pinned XDP links not in keep.
func detachStaleXDP(bpffs string, keep map[string]bool) error {
	return unpinLinks(bpffs, "xdp_", keep)
}

// CleanupXDP detaches every XDP program an agent attached (its pinned links
// under bpffs), for --cleanup and for --xdp=off: Cleanup removes them too,
// with everything else.
func CleanupXDP(bpffs string) error {
	return detachStaleXDP(bpffs, nil)
}

// Close releases the agent's handles; the program stays attached.
func (l *XDPLoaded) Close() {
	for _, lk := range l.links {
		lk.Close()
	}
	l.links = nil
	closeXDP(l.Maps, l.Program)
}
