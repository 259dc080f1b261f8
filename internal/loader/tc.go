package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// TC attach modes.
const (
	// TCAttachAuto uses tcx where the kernel has it (6.6 and later), and a
	// clsact qdisc with bpf filters through netlink where it does not.
	TCAttachAuto = ""
	// TCAttachTCX and TCAttachClsact force one of the two.
	TCAttachTCX    = "tcx"
	TCAttachClsact = "clsact"
)

// Defaults of the TC programs' settings.
const (
	// DefaultConntrackSize is the number of flow entries (two per flow).
	DefaultConntrackSize = 262144
	// DefaultSNATPortMin and DefaultSNATPortMax bound the source ports of
	// source-NATed flows: above the kernel's default ephemeral range
	// (32768-60999) and the NodePort range, so that neither collides.
	DefaultSNATPortMin = 61000
	DefaultSNATPortMax = 65535
)

// clsactPriority is the priority of our bpf filters on a clsact qdisc,
// and filterPrefix the start of their names; Cleanup removes only those.
const (
	clsactPriority = 0xeb0f
	filterPrefix   = "ebpf-proxy-"
)

// TCDevice is a device the TC programs attach to, with the addresses source
// NAT gives traffic leaving it: SNAT (IPv4) and SNAT6 (IPv6), each the zero
// Addr when the device has none of its family (flows of that family to
// remote backends through it are then dropped and counted,
// tc_snat_no_address).
type TCDevice struct {
	Name  string
	SNAT  netip.Addr
	SNAT6 netip.Addr
	// Pod says the device is a pod's on the node (the host side of its
	// veth): what the pod sends is translated per packet at its ingress,
	// ClusterIPs included, as the socket programs would translate the
	// pod's sockets, and the replies at its egress. SNAT and SNAT6 are
	// then the address a pod reaching itself through a Service is shown
	// (kube-proxy masquerades that hairpin): the node's address toward
	// its pods.
	Pod bool
}

// TCConfig says what the TC programs attach to.
type TCConfig struct {
	// BPFFSPath is the same directory the socket programs pin under: the
	// TC programs share their maps.
	BPFFSPath string
	// Sizes must be the sizes the socket programs were loaded with (Config.Sizes),
	// or the shared pinned maps are migrated again.
	Sizes         MapSizes
	ConntrackSize uint32
	Devices       []TCDevice
	// Attach is one of the TCAttach* modes.
	Attach string
	// SNATPortMin and SNATPortMax are the source NAT port range; zero
	// means the defaults.
	SNATPortMin, SNATPortMax uint16
	// Migrated is as Config.Migrated.
	Migrated func(MapMigration)
	// BeforeAttach, when set, is called with the loaded objects before any
	// program is attached or replaced: the port filter gets the ports of
	// the flows connection tracking holds (the programs pass packets to
	// other ports). Its error fails LoadTC, leaving attached what was.
	BeforeAttach func(*bpfobj.TcObjects) error
}

// TCLoaded are the TC programs in the kernel and what holds them attached.
type TCLoaded struct {
	Objects bpfobj.TcObjects
	// Mode is how the programs were attached: TCAttachTCX or
	// TCAttachClsact.
	Mode  string
	links []link.Link
	// ConntrackLookup says the programs ask the kernel's conntrack about
	// TCP segments of no flow they track (bpf/lib/nfct.h): the kernel has
	// the kfuncs. Without them, connections kube-proxy opened before the
	// programs attached break at their next segment.
	ConntrackLookup bool
	// unpinned are the maps a preload made, none being pinned under the
	// bpffs path then: they are pinned when the programs attach, so that
	// programs never attached leave no pin behind.
	unpinned []string
	// carries are the connection tracking maps a migration resized,
	// carried over once the programs attach.
	carries []carry
}

// ErrNoSuchDevice is returned (wrapped) when a configured device does not
// exist.
var ErrNoSuchDevice = errors.New("no such network device")

// LoadTC loads the TC programs with the maps pinned under cfg.BPFFSPath
// (shared with the socket programs) and attaches them at ingress and egress
// of every device in cfg.Devices (AttachDevices).
func LoadTC(cfg TCConfig) (*TCLoaded, error) {
	l, err := loadTC(cfg, false)
	if err != nil {
		return nil, err
	}
	if err := l.AttachDevices(cfg); err != nil {
		return nil, err
	}
	return l, nil
}

// PreloadTC is the first half of LoadTC, the one the verifier takes its
// time over, for an agent that learns its devices later (at its first sync):
// the programs are loaded and the pinned maps adopted, nothing is attached
// and nothing pinned (the maps it makes are pinned by AttachDevices, the
// second half, so that an agent that never attaches leaves none). When a
// pinned map must migrate (an upgrade), it loads nothing and returns nil
// and no error: the migration is left to LoadTC, so that the earlier
// agent's programs serve from the old maps until the moment the new ones
// attach, as they do without a preload.
func PreloadTC(cfg TCConfig) (*TCLoaded, error) {
	l, err := loadTC(cfg, true)
	if errors.Is(err, errMigrationPending) {
		return nil, nil
	}
	return l, err
}

func loadTC(cfg TCConfig, adoptOnly bool) (*TCLoaded, error) {
	if err := ensureBPFFS(cfg.BPFFSPath); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(mapsDir(cfg.BPFFSPath), 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", mapsDir(cfg.BPFFSPath), err)
	}
	spec, err := bpfobj.LoadTc()
	if err != nil {
		return nil, fmt.Errorf("load embedded TC object: %w", err)
	}
	if err := patchNodePort(spec, cfg.Sizes, cfg.ConntrackSize, cfg.SNATPortMin, cfg.SNATPortMax); err != nil {
		return nil, err
	}
	l := &TCLoaded{ConntrackLookup: conntrackKfuncs()}
	if err := spec.Variables[bpfobj.TcVarNfctKfuncs].Set(boolToU8(l.ConntrackLookup)); err != nil {
		return nil, fmt.Errorf("set nfct_kfuncs: %w", err)
	}
	if adoptOnly {
		for name, ms := range spec.Maps {
			if ms.Pinning != ebpf.PinByName {
				continue
			}
			if _, err := os.Stat(filepath.Join(mapsDir(cfg.BPFFSPath), name)); errors.Is(err, os.ErrNotExist) {
				ms.Pinning = ebpf.PinNone
				l.unpinned = append(l.unpinned, name)
			}
		}
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapsDir(cfg.BPFFSPath)}}
	if l.carries, err = loadPinned(spec, &l.Objects, opts, cfg.BPFFSPath, "a TC program", "TC objects", cfg.Migrated, adoptOnly); err != nil {
		return nil, err
	}
	return l, nil
}

// pinPreloaded pins the maps a preload made (unpinned) under bpffs.
func (l *TCLoaded) pinPreloaded(bpffs string) error {
	if len(l.unpinned) == 0 {
		return nil
	}
	byName := map[string]*ebpf.Map{}
	v := reflect.ValueOf(&l.Objects.TcMaps).Elem()
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok {
			byName[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	for _, name := range l.unpinned {
		m := byName[name]
		if m == nil {
			return fmt.Errorf("pin %s: not one of the TC maps", name)
		}
		if err := m.Pin(filepath.Join(mapsDir(bpffs), name)); err != nil {
			return fmt.Errorf("pin %s: %w", name, err)
		}
	}
	l.unpinned = nil
	return nil
}

// AttachDevices calls cfg.BeforeAttach and attaches l's programs at ingress
// and egress of every device in cfg.Devices, replacing programs an earlier
// agent attached there in place: tcx links are pinned and updated, clsact
// filters are replaced at the same priority and handle. Devices it attached
// to before and that are no longer configured are detached, in either mode.
// cfg must be the configuration l was loaded with, but for its devices. On
// failure l is closed.
//
// It runs in the network namespace of the calling thread: devices are
// looked up and attached there.
func (l *TCLoaded) AttachDevices(cfg TCConfig) error {
	if err := l.pinPreloaded(cfg.BPFFSPath); err != nil {
		l.Close()
		return err
	}
	if cfg.BeforeAttach != nil {
		if err := cfg.BeforeAttach(&l.Objects); err != nil {
			l.Close()
			return err
		}
	}
	if err := l.attach(cfg); err != nil {
		l.Close()
		return err
	}
	carryOver(l.carries, cfg.Migrated)
	l.carries = nil
	return nil
}

// SetDevices attaches l's programs, already attached by AttachDevices, to
// the devices of cfg instead, as AttachDevices does: new devices get them,
// the others keep theirs (updated in place), those no longer in cfg lose
// them. The agent calls it as pods' devices come and go. On failure l stays
// open and attached where it was.
func (l *TCLoaded) SetDevices(cfg TCConfig) error { return l.attach(cfg) }

// patchNodePort sets the sizes of the maps and the source NAT port range
// in the spec of a program that handles traffic from outside (tc.c, xdp.c):
// both must agree, as they share the maps and the ports.
func patchNodePort(spec *ebpf.CollectionSpec, sizes MapSizes, ct uint32, pmin, pmax uint16) error {
	if sizes == (MapSizes{}) {
		sizes = DefaultMapSizes
	}
	if ct == 0 {
		ct = DefaultConntrackSize
	}
	for name, n := range sharedMapSizes(sizes) {
		spec.Maps[name].MaxEntries = n
	}
	spec.Maps[bpfobj.TcMapTc4CtV1].MaxEntries = ct
	spec.Maps[bpfobj.TcMapTc6CtV1].MaxEntries = sizes.Family6(ct).Conntrack
	if err := patchMaglev(spec, sizes); err != nil {
		return err
	}
	if pmin == 0 && pmax == 0 {
		pmin, pmax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if pmin == 0 || pmax < pmin {
		return fmt.Errorf("source NAT port range %d-%d is empty", pmin, pmax)
	}
	if err := spec.Variables[bpfobj.TcVarSnatPortMin].Set(pmin); err != nil {
		return fmt.Errorf("set snat_port_min: %w", err)
	}
	if err := spec.Variables[bpfobj.TcVarSnatPortMax].Set(pmax); err != nil {
		return fmt.Errorf("set snat_port_max: %w", err)
	}
	return nil
}

// tcHook is one attach point of one device.
type tcHook struct {
	dir    string // "ingress" or "egress"
	tcx    ebpf.AttachType
	parent uint32
	prog   func(*bpfobj.TcPrograms) *ebpf.Program
}

// program is the hook's program for a device, pod as TCDevice.Pod.
func (h tcHook) program(p *bpfobj.TcPrograms, pod bool) *ebpf.Program {
	if pod && h.dir == "ingress" {
		return p.TcPodIngress
	}
	return h.prog(p)
}

var tcHooks = []tcHook{
	{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS, func(p *bpfobj.TcPrograms) *ebpf.Program { return p.TcIngress }},
	{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS, func(p *bpfobj.TcPrograms) *ebpf.Program { return p.TcEgress }},
}

func tcPinName(dir, dev string) string { return "tc_" + dir + "_" + dev }

func (l *TCLoaded) attach(cfg TCConfig) error {
	if err := os.MkdirAll(linksDir(cfg.BPFFSPath), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", linksDir(cfg.BPFFSPath), err)
	}
	type dev struct {
		TCDevice
		link netlink.Link
	}
	var devs []dev
	wanted := map[string]bool{}
	for _, d := range cfg.Devices {
		lk, err := netlink.LinkByName(d.Name)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrNoSuchDevice, d.Name, err)
		}
		devs = append(devs, dev{d, lk})
		for _, h := range tcHooks {
			wanted[tcPinName(h.dir, d.Name)] = true
		}
	}
	// Forget devices an earlier agent attached to that are not wanted.
	if err := detachStaleTC(cfg.BPFFSPath, wanted); err != nil {
		return err
	}
	snat4, snat6 := map[int]netip.Addr{}, map[int]netip.Addr{}
	for _, d := range devs {
		snat4[d.link.Attrs().Index] = d.SNAT
		snat6[d.link.Attrs().Index] = d.SNAT6
	}
	if err := errors.Join(l.SetIPv4SNAT(snat4), l.SetIPv6SNAT(snat6)); err != nil {
		return err
	}

	mode := cfg.Attach
	for _, d := range devs {
		for _, h := range tcHooks {
			prog := h.program(&l.Objects.TcPrograms, d.Pod)
			pin := filepath.Join(linksDir(cfg.BPFFSPath), tcPinName(h.dir, d.Name))
			if mode != TCAttachClsact {
				err := l.attachTCX(d.link, h, prog, pin)
				if err == nil {
					mode = TCAttachTCX
					continue
				}
				if mode == TCAttachTCX || !errors.Is(err, ebpf.ErrNotSupported) {
					return err
				}
				// The kernel has no tcx: clsact from here on.
				mode = TCAttachClsact
			}
			if err := attachClsact(d.link, h, prog); err != nil {
				return err
			}
		}
		if mode == TCAttachClsact {
			// A pinned tcx link from an agent on a newer kernel would
			// run the old program too.
			if err := detachStaleTC(cfg.BPFFSPath, nil, tcPinName("ingress", d.Name), tcPinName("egress", d.Name)); err != nil {
				return err
			}
		} else if err := removeClsactFilters(d.link); err != nil {
			return err
		}
	}
	// And our clsact filters on devices no longer configured.
	all, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list devices: %w", err)
	}
	for _, lk := range all {
		configured := false
		for _, d := range devs {
			configured = configured || d.link.Attrs().Index == lk.Attrs().Index
		}
		if !configured {
			if err := removeClsactFilters(lk); err != nil {
				return err
			}
		}
	}
	l.Mode = mode
	if l.Mode == TCAttachAuto {
		l.Mode = TCAttachTCX
	}
	return nil
}

// attachTCX updates the pinned tcx link of the hook in place, or attaches
// and pins a new one.
func (l *TCLoaded) attachTCX(dev netlink.Link, h tcHook, prog *ebpf.Program, pin string) error {
	idx := dev.Attrs().Index
	lk, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		info, ierr := lk.Info()
		if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == idx && uint32(info.TCX().AttachType) == uint32(h.tcx) {
			if err := lk.Update(prog); err != nil {
				lk.Close()
				return fmt.Errorf("replace the %s program of %s in its pinned link: %w", h.dir, dev.Attrs().Name, err)
			}
			l.links = append(l.links, lk)
			return nil
		}
		// The device was recreated under the same name: a new link.
		if err := lk.Unpin(); err != nil {
			lk.Close()
			return fmt.Errorf("unpin stale link %s: %w", pin, err)
		}
		lk.Close()
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	lk, err = link.AttachTCX(link.TCXOptions{Interface: idx, Program: prog, Attach: h.tcx})
	if err != nil {
		return fmt.Errorf("attach %s program to %s with tcx: %w", h.dir, dev.Attrs().Name, err)
	}
	if err := lk.Pin(pin); err != nil {
		lk.Close()
		return fmt.Errorf("pin tcx link of %s: %w", dev.Attrs().Name, err)
	}
	l.links = append(l.links, lk)
	return nil
}

// attachClsact adds a clsact qdisc to dev if it has none and puts prog in
// our bpf filter, replacing the program of an earlier agent atomically.
func attachClsact(dev netlink.Link, h tcHook, prog *ebpf.Program) error {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc to %s: %w", dev.Attrs().Name, err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: dev.Attrs().Index,
			Parent:    h.parent,
			Handle:    1,
			Protocol:  unix.ETH_P_ALL,
			Priority:  clsactPriority,
		},
		Fd:           prog.FD(),
		Name:         filterPrefix + h.dir,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("attach %s program to %s with a clsact filter: %w", h.dir, dev.Attrs().Name, err)
	}
	return nil
}

// removeClsactFilters deletes our bpf filters from dev; other filters and
// the qdisc stay.
func removeClsactFilters(dev netlink.Link) error {
	var errs []error
	for _, h := range tcHooks {
		fs, err := netlink.FilterList(dev, h.parent)
		if err != nil {
			// A device without clsact has nothing of ours.
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue
			}
			errs = append(errs, fmt.Errorf("list %s filters of %s: %w", h.dir, dev.Attrs().Name, err))
			continue
		}
		for _, f := range fs {
			bf, ok := f.(*netlink.BpfFilter)
			if !ok || !strings.HasPrefix(bf.Name, filterPrefix) {
				continue
			}
			if err := netlink.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove %s filter of %s: %w", h.dir, dev.Attrs().Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// detachStaleTC unpins (and so detaches) the pinned TC links that are not
// in keep, or with names given, exactly those.
func detachStaleTC(bpffs string, keep map[string]bool, names ...string) error {
	return unpinLinks(bpffs, "tc_", keep, names...)
}

// SetIPv4SNAT sets the IPv4 source NAT addresses of the devices the
// programs are attached to, by ifindex: addrs names every attached device,
// and one whose address is the zero Addr, or that addrs leaves out, has
// none afterwards. The agent calls it when a sync's State names the node's
// IPv4 addresses, which may come after LoadTC.
func (l *TCLoaded) SetIPv4SNAT(addrs map[int]netip.Addr) error {
	return setSNAT(l.Objects.Tc4SnatAddrsV1, addrs, "IPv4", netip.Addr.Is4,
		func(a netip.Addr) bpfobj.TcTc4SnatAddr { return bpfobj.TcTc4SnatAddr{Address: be32Addr(a)} })
}

// SetIPv6SNAT is SetIPv4SNAT for the IPv6 source NAT addresses.
func (l *TCLoaded) SetIPv6SNAT(addrs map[int]netip.Addr) error {
	return setSNAT(l.Objects.Tc6SnatAddrsV1, addrs, "IPv6", func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() },
		func(a netip.Addr) bpfobj.TcTc6SnatAddr { return bpfobj.TcTc6SnatAddr{Address: be32Addr6(a)} })
}

// A NexthopShare is how far the new flows of a family share the next hop
// the first of them found in the same second (bpf/lib/nexthop.h): the
// values of tc_nexthop_share_v1, bpf/lib/structs.h's NH_SHARE_* (an enum
// the programs' BTF does not carry).
type NexthopShare uint32

// How far new flows share a next hop.
const (
	// NexthopShareOff looks every new flow up: the programs' default.
	NexthopShareOff NexthopShare = 0
	// NexthopShareClient shares between a client's new flows to a
	// backend, where the client's port cannot change the route.
	NexthopShareClient NexthopShare = 1
	// NexthopShareAll shares between every client's new flows to a
	// backend, where the client's address cannot change it either.
	NexthopShareAll NexthopShare = 2
)

// String names the sharing as the agent's log lines do.
func (s NexthopShare) String() string {
	switch s {
	case NexthopShareOff:
		return "off"
	case NexthopShareClient:
		return "client"
	case NexthopShareAll:
		return "all"
	}
	return fmt.Sprintf("NexthopShare(%d)", uint32(s))
}

// SetNexthopSharing says how far the new flows of a family (v6 for IPv6)
// share a next hop, which the caller judges from the node's routing. Until
// it is called the programs look up every new flow.
func (l *TCLoaded) SetNexthopSharing(v6 bool, share NexthopShare) error {
	return SetNexthopSharing(l.Objects.TcNexthopShareV1, v6, share)
}

// SetNexthopSharing writes a family's next hop sharing to m, a
// tc_nexthop_share_v1 (loaded, or opened from its pin).
func SetNexthopSharing(m *ebpf.Map, v6 bool, share NexthopShare) error {
	if share > NexthopShareAll {
		return fmt.Errorf("next hop sharing %s", share)
	}
	if err := m.Put(nexthopShareKey(v6), uint32(share)); err != nil {
		return fmt.Errorf("next hop sharing of family %d: %w", nexthopShareKey(v6), err)
	}
	return nil
}

// NexthopSharing reads a family's next hop sharing from m, as
// SetNexthopSharing wrote it.
func NexthopSharing(m *ebpf.Map, v6 bool) (NexthopShare, error) {
	var val uint32
	if err := m.Lookup(nexthopShareKey(v6), &val); err != nil {
		return NexthopShareOff, fmt.Errorf("next hop sharing of family %d: %w", nexthopShareKey(v6), err)
	}
	return NexthopShare(val), nil
}

// The keys of tc_nexthop_share_v1: bpf/lib/structs.h's NH_SHARE_IPV4 and
// NH_SHARE_IPV6.
const (
	nexthopShareIPv4 uint32 = 0
	nexthopShareIPv6 uint32 = 1
)

func nexthopShareKey(v6 bool) uint32 {
	if v6 {
		return nexthopShareIPv6
	}
	return nexthopShareIPv4
}

// setSNAT writes addrs (ifindex -> address of the family, which is checks)
// to m, a source NAT address map, and removes every other device's entry.
func setSNAT[V any](m *ebpf.Map, addrs map[int]netip.Addr, family string, is func(netip.Addr) bool, enc func(netip.Addr) V) error {
	var keep []uint32
	for idx, a := range addrs {
		if !a.IsValid() {
			continue
		}
		if !is(a) {
			return fmt.Errorf("ifindex %d: %s source NAT address %s is not %s", idx, family, a, family)
		}
		if err := m.Put(uint32(idx), enc(a)); err != nil {
			return fmt.Errorf("%s source NAT address of ifindex %d: %w", family, idx, err)
		}
		keep = append(keep, uint32(idx))
	}
	return pruneKeys[V](m, keep, family+" source NAT address")
}

// be32Addr6 is a in the C side's __be32[4] layout: network order.
func be32Addr6(a netip.Addr) [4]uint32 {
	b := a.As16()
	var out [4]uint32
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return out
}

// be32Addr is a in network order, as the C side's __be32 holds it.
func be32Addr(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// ProbeTCX reports whether the kernel attaches TC programs with tcx links
// (6.6 and later): nil if it does, an error wrapping ebpf.ErrNotSupported if
// it does not. It attaches a trivial program to an interface index no
// device has, so that it touches nothing.
func ProbeTCX() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		return fmt.Errorf("load a probe TC program: %w", err)
	}
	defer prog.Close()
	lk, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	switch {
	case err == nil:
		lk.Close()
		return errors.New("tcx probe attached to a device that does not exist")
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("tcx: %w", err)
	case errors.Is(err, unix.ENODEV):
		return nil
	}
	return fmt.Errorf("probe tcx: %w", err)
}

// CleanupTC removes the clsact filters LoadTC added to any device of the
// calling thread's network namespace. Pinned tcx links go with Cleanup.
func CleanupTC() error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list devices: %w", err)
	}
	var errs []error
	for _, lk := range links {
		errs = append(errs, removeClsactFilters(lk))
	}
	return errors.Join(errs...)
}

// Close releases the agent's handles; the programs stay attached.
func (l *TCLoaded) Close() {
	for _, lk := range l.links {
		lk.Close()
	}
	l.links = nil
	// Maps kept for a carry-over that never came (the attach failed).
	closeCarries(l.carries)
	l.carries = nil
	l.Objects.Close()
}

// conntrackKfuncs says whether the kernel has the conntrack kfuncs the TC
// programs call (bpf/lib/nfct.h): in vmlinux, or in the BTF of the
// nf_conntrack module, as the loader finds a kfunc. A kfunc it cannot find
// is left out of the program (its call poisoned), so the two agree.
func conntrackKfuncs() bool {
	has := func(spec *btf.Spec) bool {
		for _, name := range []string{"bpf_skb_ct_lookup", "bpf_ct_release"} {
			var fn *btf.Func
			if err := spec.TypeByName(name, &fn); err != nil {
				return false
			}
		}
		return true
	}
	if spec, err := btf.LoadKernelSpec(); err == nil && has(spec) {
		return true
	}
	spec, err := btf.LoadKernelModuleSpec("nf_conntrack")
	return err == nil && has(spec)
}
