// Package loader loads ebpf-proxy's BPF programs, adopts the maps and links
// an earlier agent pinned, attaches the socket programs to a cgroup v2
// directory and replaces running programs in place, so that traffic never
// sees an empty hook.
package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// Defaults of the agent's flags.
const (
	DefaultBPFFSPath = "/sys/fs/bpf/ebpf-proxy"
)

// MapSizes are the capacities of the maps, patched into the spec. A pinned
// map of another size is migrated into a map of the new size (see
// MapMigration).
type MapSizes struct {
	Services   uint32
	Backends   uint32
	RevNat     uint32
	SockRevNat uint32
	// Affinity is the number of (client, ServicePort) pairs remembered
	// for session affinity; the least recently used are forgotten first.
	Affinity uint32
	// MaglevTable is the number of entries of a Maglev table (a prime);
	// each ServicePort that uses Maglev has one, of 4 bytes per entry.
	MaglevTable uint32
	// IPv6 are the capacities of the IPv6 maps where they differ from
	// the IPv4 ones (above; the TC programs' ConntrackSize): a zero
	// capacity takes the IPv4 map's.
	IPv6 FamilySizes
}

// FamilySizes are the capacities of one family's maps.
type FamilySizes struct {
	Services, Backends, RevNat, SockRevNat, Affinity uint32
	// Conntrack is the TC connection tracking map's.
	Conntrack uint32
}

// Family6 are the IPv6 maps' capacities: IPv6's, or where it has none, the
// IPv4 maps' (ct the IPv4 connection tracking map's).
func (s MapSizes) Family6(ct uint32) FamilySizes {
	return s.IPv6.or(FamilySizes{Services: s.Services, Backends: s.Backends, RevNat: s.RevNat, SockRevNat: s.SockRevNat,
		Affinity: s.Affinity, Conntrack: ct})
}

// DefaultMapSizes fit 10,000 Services of 10 endpoints with room to spare.
var DefaultMapSizes = MapSizes{Services: 262144, Backends: 262144, RevNat: 65536, SockRevNat: 262144, Affinity: 262144,
	MaglevTable: 16381}

// Config says where to pin and what to attach to.
type Config struct {
	// BPFFSPath is a directory on a bpf filesystem; it is created.
	BPFFSPath string
	// CgroupPath is the cgroup v2 directory the socket programs attach to.
	CgroupPath string
	Sizes      MapSizes
	// NodeNetnsCookie is the cookie of the node's own network namespace
	// (see NetnsCookie), whose UDP sockets a refusing Service answers with
	// EPERM as kube-proxy's OUTPUT-path REJECT and DROP do. 0 treats the
	// node like a pod.
	NodeNetnsCookie uint64
	// NodeSocketsOnly translates only the sockets of the node's own
	// network namespace (NodeNetnsCookie, which must then be set): pods'
	// sockets are left alone, and their packets are translated at their
	// devices (TCDevice.Pod).
	NodeSocketsOnly bool
	// Migrated, if set, is told about every pinned map of another size or
	// layout that was migrated, or kept because its entries did not fit.
	Migrated func(MapMigration)
}

// ErrPinnedMapMismatch is returned (wrapped) when a pinned map exists with a
// layout other than the one being loaded and no migration converts it (see
// Migration), or a migration fails. The running programs and the pinned
// maps are left untouched.
var ErrPinnedMapMismatch = errors.New("pinned map does not match the new program's map")

// Loaded is the result of Load: the programs and maps in the kernel, and
// the links that keep the programs attached.
type Loaded struct {
	Objects bpfobj.SockObjects
	// Maglev are the TC programs' Maglev tables of IPv4 ServicePorts,
	// which the maps writer fills; Maglev6 those of IPv6 ServicePorts,
	// which the IPv6 writer fills.
	Maglev   MaglevMaps
	Maglev6  MaglevMaps
	Features Features
	Sizes    MapSizes
	links    []link.Link
	// egress is the source range check's link while it is attached.
	egress     link.Link
	bpffs      string
	cgroupPath string
}

type cgroupProg struct {
	name   string
	attach ebpf.AttachType
	prog   func(*bpfobj.SockPrograms) *ebpf.Program
}

var cgroupProgs = []cgroupProg{
	{bpfobj.SockProgCgConnect4, ebpf.AttachCGroupInet4Connect, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgConnect4 }},
	{bpfobj.SockProgCgSendmsg4, ebpf.AttachCGroupUDP4Sendmsg, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgSendmsg4 }},
	{bpfobj.SockProgCgRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgRecvmsg4 }},
	{bpfobj.SockProgCgGetpeername4, ebpf.AttachCgroupInet4GetPeername, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgGetpeername4 }},
	// IPv6, and IPv4-mapped destinations of AF_INET6 sockets.
	{bpfobj.SockProgCgConnect6, ebpf.AttachCGroupInet6Connect, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgConnect6 }},
	{bpfobj.SockProgCgSendmsg6, ebpf.AttachCGroupUDP6Sendmsg, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgSendmsg6 }},
	{bpfobj.SockProgCgRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgRecvmsg6 }},
	{bpfobj.SockProgCgGetpeername6, ebpf.AttachCgroupInet6GetPeername, func(p *bpfobj.SockPrograms) *ebpf.Program { return p.CgGetpeername6 }},
}

func mapsDir(bpffs string) string  { return filepath.Join(bpffs, "maps") }
func linksDir(bpffs string) string { return filepath.Join(bpffs, "links") }

// Load probes the kernel, loads the socket programs with the maps pinned
// under cfg.BPFFSPath (adopting those already pinned), and attaches the
// programs to cfg.CgroupPath. Where a pinned link exists its program is
// replaced atomically; otherwise a new link is created and pinned.
//
// Load changes nothing attached until every program has passed the
// verifier: a rejected program leaves the old ones running.
func Load(cfg Config) (*Loaded, error) {
	feat, err := Probe()
	if err != nil {
		return nil, err
	}
	if err := ensureBPFFS(cfg.BPFFSPath); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(mapsDir(cfg.BPFFSPath), 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", mapsDir(cfg.BPFFSPath), err)
	}
	spec, err := bpfobj.LoadSock()
	if err != nil {
		return nil, fmt.Errorf("load embedded BPF object: %w", err)
	}
	sizes := cfg.Sizes
	if sizes == (MapSizes{}) {
		sizes = DefaultMapSizes
	}
	for name, n := range sharedMapSizes(sizes) {
		spec.Maps[name].MaxEntries = n
	}
	for name, n := range sockMapSizes(sizes) {
		spec.Maps[name].MaxEntries = n
	}
	if err := spec.Variables[bpfobj.SockVarHaveSetRetval].Set(boolToU8(feat.SetRetval)); err != nil {
		return nil, fmt.Errorf("set have_set_retval: %w", err)
	}
	if err := spec.Variables[bpfobj.SockVarNodeNetnsCookie].Set(cfg.NodeNetnsCookie); err != nil {
		return nil, fmt.Errorf("set node_netns_cookie: %w", err)
	}
	if cfg.NodeSocketsOnly && cfg.NodeNetnsCookie == 0 {
		return nil, errors.New("translating the node's sockets only needs the node's network namespace cookie")
	}
	if err := spec.Variables[bpfobj.SockVarNodeSocketsOnly].Set(boolToU8(cfg.NodeSocketsOnly)); err != nil {
		return nil, fmt.Errorf("set node_sockets_only: %w", err)
	}

	l := &Loaded{Features: feat, Sizes: sizes, bpffs: cfg.BPFFSPath, cgroupPath: cfg.CgroupPath}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapsDir(cfg.BPFFSPath)}}
	// The Maglev maps belong to the TC programs, which attach later, when
	// the node's devices are known; the maps writer needs them from the
	// start, so they are made (or adopted) here and pinned for the TC
	// programs to adopt.
	if l.Maglev, l.Maglev6, err = loadMaglevMaps(cfg.BPFFSPath, sizes, cfg.Migrated); err != nil {
		return nil, err
	}
	carries, err := loadPinned(spec, &l.Objects, opts, cfg.BPFFSPath, "a program", "BPF objects", cfg.Migrated, false)
	if err != nil {
		l.Maglev.Close()
		l.Maglev6.Close()
		return nil, err
	}
	l.Sizes = loadedSizes(&l.Objects.SockMaps, sizes)
	if err := l.attach(cfg); err != nil {
		closeCarries(carries)
		l.Close()
		return nil, err
	}
	carryOver(carries, cfg.Migrated)
	return l, nil
}

// sharedMapSizes are the sizes of the maps every object (sock.c, tc.c,
// xdp.c) defines, by name: each loader patches them alike, so that none
// finds a pinned map of another size.
func sharedMapSizes(sizes MapSizes) map[string]uint32 {
	s6 := sizes.Family6(0)
	return map[string]uint32{
		bpfobj.SockMapLb4ServicesV1: sizes.Services,
		bpfobj.SockMapLb4BackendsV1: sizes.Backends,
		bpfobj.SockMapLb4RevnatV1:   sizes.RevNat,
		bpfobj.SockMapLb4AffinityV1: sizes.Affinity,
		// Every (backend, ServicePort) pair fits, as every backend slot
		// does in the services map.
		bpfobj.SockMapLb4MembersV1:  sizes.Services,
		bpfobj.SockMapLb6ServicesV1: s6.Services,
		bpfobj.SockMapLb6BackendsV1: s6.Backends,
		bpfobj.SockMapLb6RevnatV1:   s6.RevNat,
		bpfobj.SockMapLb6AffinityV1: s6.Affinity,
		bpfobj.SockMapLb6MembersV1:  s6.Services,
	}
}

// sockMapSizes are the sizes of the maps of the socket hooks alone
// (bpf/lib/sockmaps.h), by name.
func sockMapSizes(sizes MapSizes) map[string]uint32 {
	s6 := sizes.Family6(0)
	return map[string]uint32{
		bpfobj.SockMapSock4RevnatV1: sizes.SockRevNat,
		bpfobj.SockMapSock4UdpFwdV1: sizes.SockRevNat,
		bpfobj.SockMapSock6RevnatV1: s6.SockRevNat,
		bpfobj.SockMapSock6UdpFwdV1: s6.SockRevNat,
	}
}

// loadedSizes are the sizes of the maps as loaded: those asked for, except
// where a pinned map whose entries did not fit was kept at its old size.
func loadedSizes(m *bpfobj.SockMaps, asked MapSizes) MapSizes {
	asked.Services = m.Lb4ServicesV1.MaxEntries()
	asked.Backends = m.Lb4BackendsV1.MaxEntries()
	asked.RevNat = m.Lb4RevnatV1.MaxEntries()
	asked.SockRevNat = m.Sock4RevnatV1.MaxEntries()
	asked.Affinity = m.Lb4AffinityV1.MaxEntries()
	differs := func(v6, v4 uint32) uint32 {
		if v6 == v4 {
			return 0
		}
		return v6
	}
	asked.IPv6.Services = differs(m.Lb6ServicesV1.MaxEntries(), asked.Services)
	asked.IPv6.Backends = differs(m.Lb6BackendsV1.MaxEntries(), asked.Backends)
	asked.IPv6.RevNat = differs(m.Lb6RevnatV1.MaxEntries(), asked.RevNat)
	asked.IPv6.SockRevNat = differs(m.Sock6RevnatV1.MaxEntries(), asked.SockRevNat)
	asked.IPv6.Affinity = differs(m.Lb6AffinityV1.MaxEntries(), asked.Affinity)
	return asked
}

func boolToU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func (l *Loaded) attach(cfg Config) error {
	cgID, err := cgroupID(cfg.CgroupPath)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(linksDir(cfg.BPFFSPath), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", linksDir(cfg.BPFFSPath), err)
	}
	for _, cp := range cgroupProgs {
		prog := cp.prog(&l.Objects.SockPrograms)
		pin := filepath.Join(linksDir(cfg.BPFFSPath), cp.name)
		lk, err := adoptLink(pin, cgID)
		if err != nil {
			return err
		}
		if lk != nil {
			if err := lk.Update(prog); err != nil {
				lk.Close()
				return fmt.Errorf("replace %s in its pinned link: %w", cp.name, err)
			}
			l.links = append(l.links, lk)
			continue
		}
		lk, err = link.AttachCgroup(link.CgroupOptions{Path: cfg.CgroupPath, Attach: cp.attach, Program: prog})
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", cp.name, cfg.CgroupPath, err)
		}
		if err := lk.Pin(pin); err != nil {
			lk.Close()
			return fmt.Errorf("pin link of %s: %w", cp.name, err)
		}
		l.links = append(l.links, lk)
	}
	return l.adoptSourceRangeCheck(cgID)
}

// adoptLink opens the pinned link at pin when it is attached to the cgroup
// with id cgID. A link pinned for another cgroup (the flag changed) is
// unpinned, which detaches it, so that the programs move rather than run
// twice.
func adoptLink(pin string, cgID uint64) (link.Link, error) {
	lk, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	info, err := lk.Info()
	if err == nil {
		if cg := info.Cgroup(); cg != nil && cg.CgroupId == cgID {
			return lk, nil
		}
	}
	if err := lk.Unpin(); err != nil {
		lk.Close()
		return nil, fmt.Errorf("unpin stale link %s: %w", pin, err)
	}
	lk.Close()
	return nil, nil
}

// cgroupID is the id the kernel reports for a cgroup v2 directory: its
// inode number.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup path %s: %w", path, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("cgroup path %s: %w", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("cgroup path %s is not on a cgroup v2 filesystem", path)
	}
	return st.Ino, nil
}

// ensureBPFFS creates dir, which must be on a bpf filesystem.
func ensureBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if fs.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("%s is not on a bpf filesystem (mount one with `mount -t bpf bpf /sys/fs/bpf`)", dir)
	}
	return nil
}

// Close releases the agent's handles. The programs stay attached and the
// maps stay pinned, so traffic keeps flowing while no agent runs.
func (l *Loaded) Close() {
	for _, lk := range l.links {
		lk.Close()
	}
	l.links = nil
	if l.egress != nil {
		l.egress.Close()
		l.egress = nil
	}
	l.Objects.Close()
	l.Maglev.Close()
	l.Maglev6.Close()
}

// Cleanup detaches and unpins everything an agent pinned under bpffs: links
// first, so that no program runs against maps being removed, then maps.
// It is not an error if nothing is pinned.
func Cleanup(bpffs string) error {
	errs := []error{unpinLinks(bpffs, "", nil)}
	for _, dir := range []string{linksDir(bpffs), mapsDir(bpffs), bpffs} {
		if err := removeDirPins(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unpinLinks unpins, and so detaches, the links pinned under bpffs whose
// names start with prefix and are not in keep; with names given, exactly
// those (a missing one is no error). A missing links directory is no error.
func unpinLinks(bpffs, prefix string, keep map[string]bool, names ...string) error {
	if names == nil {
		entries, err := os.ReadDir(linksDir(bpffs))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("read %s: %w", linksDir(bpffs), err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), prefix) && !keep[e.Name()] {
				names = append(names, e.Name())
			}
		}
	}
	var errs []error
	for _, n := range names {
		pin := filepath.Join(linksDir(bpffs), n)
		lk, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("open %s: %w", pin, err))
			continue
		}
		if err := lk.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
		// Closing the last reference detaches the program.
		lk.Close()
	}
	return errors.Join(errs...)
}

// loadPinned loads spec into objs with its maps pinned (and adopted) under
// bpffs, naming in its errors the program (a verifier rejection) and the
// objects being loaded.
//
// Pinned maps of another size or an older layout are migrated first (see
// migratePins): the programs load with the new maps, which then replace
// the old pins; migrated reports each. If anything fails before that, the
// old pins are left as they were. With adoptOnly nothing migrates: a pinned
// map that would makes it return errMigrationPending, having changed
// nothing.
//
// The LRU maps it resized are returned, for carryOver once the programs
// attached.
// afterMigrationCopy, set by tests, runs between the copy of migrated
// maps and the load of the programs that use them: the moment the
// earlier programs still write the old maps.
var afterMigrationCopy func()

func loadPinned(spec *ebpf.CollectionSpec, objs interface{ Close() error }, opts *ebpf.CollectionOptions, bpffs, program, objects string, migrated func(MapMigration), adoptOnly bool) ([]carry, error) {
	mig, err := migratePins(spec, mapsDir(bpffs), adoptOnly)
	if err != nil {
		return nil, err
	}
	if afterMigrationCopy != nil && len(mig.replacements) > 0 {
		afterMigrationCopy()
	}
	o := *opts
	o.MapReplacements = mig.replacements
	err = spec.LoadAndAssign(objs, &o)
	if err == nil {
		carries := mig.carries
		if err := mig.commit(); err != nil {
			closeCarries(carries)
			objs.Close()
			return nil, fmt.Errorf("migrate pinned maps under %s: %w", mapsDir(bpffs), err)
		}
		mig.report(migrated)
		return carries, nil
	}
	mig.abort()
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return nil, fmt.Errorf("%w under %s (run with --cleanup to start afresh): %w", ErrPinnedMapMismatch, mapsDir(bpffs), err)
	}
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return nil, fmt.Errorf("verifier rejected %s: %+v", program, verr)
	}
	return nil, fmt.Errorf("load %s: %w%s", objects, err, memoryHint(err))
}

// memoryHint explains an ENOMEM from the kernel as what it is on a node:
// the agent's container is out of memory.
func memoryHint(err error) string {
	if !errors.Is(err, unix.ENOMEM) {
		return ""
	}
	return " (the BPF maps and programs are charged to the memory of the agent's cgroup, its container's: " +
		"raise its memory limit, or make the maps smaller with the --bpf-map-*-max flags)"
}

// pruneKeys deletes the entries of m, a map keyed by uint32, whose keys are
// not in keep; what names the entries in errors. V is the map's value type.
func pruneKeys[V any](m *ebpf.Map, keep []uint32, what string) error {
	var (
		k     uint32
		v     V
		stale []uint32
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !slices.Contains(keep, k) {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget %s of ifindex %d: %w", what, k, err)
		}
	}
	return nil
}

func removeDirPins(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CounterNames name the programs' event counters (enum lb_metric), in
// index order, as they appear in the ebpfproxy_bpf_events_total metric.
var CounterNames = []string{
	bpfobj.SockLbMetricLB_M_XLATE_TCP:          "translated_tcp",
	bpfobj.SockLbMetricLB_M_XLATE_UDP:          "translated_udp",
	bpfobj.SockLbMetricLB_M_REJECT:             "rejected_no_endpoints",
	bpfobj.SockLbMetricLB_M_DROP:               "dropped_no_local_endpoints",
	bpfobj.SockLbMetricLB_M_NO_SLOT:            "missing_slot",
	bpfobj.SockLbMetricLB_M_NO_BACKEND:         "missing_backend",
	bpfobj.SockLbMetricLB_M_REVNAT_HIT:         "reverse_translated",
	bpfobj.SockLbMetricLB_M_REVNAT_STALE:       "reverse_entry_stale",
	bpfobj.SockLbMetricLB_M_REVNAT_UPDATE_ERR:  "reverse_entry_update_failed",
	bpfobj.SockLbMetricLB_M_AFFINITY_HIT:       "affinity_hit",
	bpfobj.SockLbMetricLB_M_AFFINITY_STALE:     "affinity_stale",
	bpfobj.SockLbMetricLB_M_UDP_STICKY:         "udp_sticky",
	bpfobj.SockLbMetricLB_M_TC_NEW_LOCAL:       "tc_new_flow_local",
	bpfobj.SockLbMetricLB_M_TC_NEW_SNAT:        "tc_new_flow_snat",
	bpfobj.SockLbMetricLB_M_TC_FWD:             "tc_translated",
	bpfobj.SockLbMetricLB_M_TC_REPLY:           "tc_reply_translated",
	bpfobj.SockLbMetricLB_M_TC_ICMP_FAIL:       "tc_icmp_unreachable_failed",
	bpfobj.SockLbMetricLB_M_TC_SNAT_NO_PORT:    "tc_snat_no_free_port",
	bpfobj.SockLbMetricLB_M_TC_SNAT_NO_ADDR:    "tc_snat_no_address",
	bpfobj.SockLbMetricLB_M_TC_NO_ROUTE:        "tc_no_route",
	bpfobj.SockLbMetricLB_M_TC_CT_FULL:         "tc_conntrack_update_failed",
	bpfobj.SockLbMetricLB_M_TC_FRAGMENT:        "tc_fragment_not_translated",
	bpfobj.SockLbMetricLB_M_TC_SOURCE_RANGE:    "tc_dropped_source_range",
	bpfobj.SockLbMetricLB_M_MAGLEV:             "tc_maglev_selected",
	bpfobj.SockLbMetricLB_M_TC_ICMP_XLATE:      "tc_icmp_error_translated",
	bpfobj.SockLbMetricLB_M_TC_STALE_REPLY:     "tc_stale_reply_dropped",
	bpfobj.SockLbMetricLB_M_XDP_NEW_SNAT:       "xdp_new_flow_snat",
	bpfobj.SockLbMetricLB_M_XDP_FWD:            "xdp_translated",
	bpfobj.SockLbMetricLB_M_XDP_REPLY:          "xdp_reply_translated",
	bpfobj.SockLbMetricLB_M_XDP_TO_TC:          "xdp_passed_to_tc",
	bpfobj.SockLbMetricLB_M_XDP_MULTIBUF:       "xdp_multibuffer_passed",
	bpfobj.SockLbMetricLB_M_SOCK_SOURCE_RANGE:  "sock_dropped_source_range",
	bpfobj.SockLbMetricLB_M_SOCK_RANGE_TAG_ERR: "sock_source_range_tag_failed",
	bpfobj.SockLbMetricLB_M_TC_SNAT_REUSED:     "tc_snat_port_reused_closed",
	bpfobj.SockLbMetricLB_M_TC_SNAT_LATE:       "tc_snat_late_packet_to_stack",
	bpfobj.SockLbMetricLB_M_TC_RESET:           "tc_reset_backend_removed",
	bpfobj.SockLbMetricLB_M_TC_RESET_FAIL:      "tc_reset_failed",
	bpfobj.SockLbMetricLB_M_TC_NEXTHOP_SHARED:  "tc_nexthop_shared",
	bpfobj.SockLbMetricLB_M_TC_NF_TRACKED:      "tc_conntrack_flow_to_stack",
	bpfobj.SockLbMetricLB_M_TC_POD_NEW:         "tc_pod_new_flow",
	bpfobj.SockLbMetricLB_M_TC_POD_SNAT:        "tc_pod_new_flow_snat",
	bpfobj.SockLbMetricLB_M_TC_PORT_CLASH:      "tc_source_port_clash",
}

// CounterDescriptions say in words what each counter of CounterNames
// counts (the comments of enum lb_metric), in the same order.
var CounterDescriptions = []string{
	bpfobj.SockLbMetricLB_M_XLATE_TCP:          "socket: TCP connect() to a Service translated to a backend",
	bpfobj.SockLbMetricLB_M_XLATE_UDP:          "socket: UDP connect() or sendmsg() to a Service translated",
	bpfobj.SockLbMetricLB_M_REJECT:             "refused: the Service has no endpoint (ECONNREFUSED, or an ICMP port unreachable at TC)",
	bpfobj.SockLbMetricLB_M_DROP:               "refused: traffic policy Local and no endpoint on this node",
	bpfobj.SockLbMetricLB_M_NO_SLOT:            "a master entry without its backend slot (a bug: the writer's order prevents it)",
	bpfobj.SockLbMetricLB_M_NO_BACKEND:         "a slot naming a missing backend (a bug: the writer's order prevents it)",
	bpfobj.SockLbMetricLB_M_REVNAT_HIT:         "socket: a reply's or peer's backend address shown as the Service again",
	bpfobj.SockLbMetricLB_M_REVNAT_STALE:       "socket: a reply's reverse entry names a frontend deleted or renumbered since: dropped, the backend shown",
	bpfobj.SockLbMetricLB_M_REVNAT_UPDATE_ERR:  "socket: a reverse entry could not be recorded",
	bpfobj.SockLbMetricLB_M_AFFINITY_HIT:       "backend chosen by the client's session affinity entry",
	bpfobj.SockLbMetricLB_M_AFFINITY_STALE:     "session affinity entry expired or its backend gone: chosen again",
	bpfobj.SockLbMetricLB_M_UDP_STICKY:         "socket: an unconnected UDP socket's datagram kept on its backend",
	bpfobj.SockLbMetricLB_M_TC_NEW_LOCAL:       "TC: new flow from outside to a backend on this node",
	bpfobj.SockLbMetricLB_M_TC_NEW_SNAT:        "TC: new flow from outside with source NAT (a backend elsewhere)",
	bpfobj.SockLbMetricLB_M_TC_FWD:             "TC: packet of a tracked flow translated",
	bpfobj.SockLbMetricLB_M_TC_REPLY:           "TC: backend's reply translated back",
	bpfobj.SockLbMetricLB_M_TC_ICMP_FAIL:       "TC: the ICMP port unreachable could not be built",
	bpfobj.SockLbMetricLB_M_TC_SNAT_NO_PORT:    "TC: no free source NAT port, packet dropped",
	bpfobj.SockLbMetricLB_M_TC_SNAT_NO_ADDR:    "TC: no source NAT address for the device, packet dropped",
	bpfobj.SockLbMetricLB_M_TC_NO_ROUTE:        "TC: no route or neighbour for a translated packet, dropped",
	bpfobj.SockLbMetricLB_M_TC_CT_FULL:         "TC: a flow could not be recorded in the conntrack map, dropped",
	bpfobj.SockLbMetricLB_M_TC_FRAGMENT:        "TC: a fragment to a frontend passed untranslated",
	bpfobj.SockLbMetricLB_M_TC_SOURCE_RANGE:    "TC: client outside loadBalancerSourceRanges, dropped",
	bpfobj.SockLbMetricLB_M_MAGLEV:             "backend chosen by a Maglev table",
	bpfobj.SockLbMetricLB_M_TC_ICMP_XLATE:      "TC: ICMP error about a tracked flow translated",
	bpfobj.SockLbMetricLB_M_TC_STALE_REPLY:     "TC: stale reply entry of a reused tuple forgotten",
	bpfobj.SockLbMetricLB_M_XDP_NEW_SNAT:       "XDP: new flow with source NAT, sent",
	bpfobj.SockLbMetricLB_M_XDP_FWD:            "XDP: packet of a source-NATed flow translated, sent",
	bpfobj.SockLbMetricLB_M_XDP_REPLY:          "XDP: reply translated back, sent",
	bpfobj.SockLbMetricLB_M_XDP_TO_TC:          "XDP: a packet passed to TC (a flow's next hop or device, or a TCP segment of no tracked flow other than a SYN)",
	bpfobj.SockLbMetricLB_M_XDP_MULTIBUF:       "XDP: multi-buffer frame passed to TC",
	bpfobj.SockLbMetricLB_M_SOCK_SOURCE_RANGE:  "socket: a pod's or the node's packet outside loadBalancerSourceRanges dropped",
	bpfobj.SockLbMetricLB_M_SOCK_RANGE_TAG_ERR: "socket: a socket could not be tagged for the source range check, refused",
	bpfobj.SockLbMetricLB_M_TC_SNAT_REUSED:     "TC/XDP: a closed flow's source NAT port reused",
	bpfobj.SockLbMetricLB_M_TC_SNAT_LATE:       "TC: a backend's late packet of a reused port handed to the stack",
	bpfobj.SockLbMetricLB_M_TC_RESET:           "TC: TCP flow to a removed backend reset",
	bpfobj.SockLbMetricLB_M_TC_RESET_FAIL:      "TC: that reset could not be built",
	bpfobj.SockLbMetricLB_M_TC_NEXTHOP_SHARED:  "TC/XDP: a new flow's next hop taken from the client's earlier flow of the second, not looked up",
	bpfobj.SockLbMetricLB_M_TC_NF_TRACKED:      "TC: a packet of a TCP connection the kernel's conntrack translated before the takeover (kube-proxy's) handed to the stack",
	bpfobj.SockLbMetricLB_M_TC_POD_NEW:         "TC: new flow of a pod translated per packet at its device (a pod the socket programs leave alone), its address kept",
	bpfobj.SockLbMetricLB_M_TC_POD_SNAT:        "TC: new flow of a pod translated per packet and masqueraded as kube-proxy does: to itself through a Service (hairpin), or to a NodePort, ExternalIP or LoadBalancer IP under policy Cluster",
	bpfobj.SockLbMetricLB_M_TC_PORT_CLASH:      "TC: a new flow that keeps its client's address found its reply tuple held by a live flow of the same client port to another frontend of the backend: given another source port of the client's address, as kube-proxy's conntrack does",
}

// Counters returns the programs' per-CPU event counters summed over CPUs,
// indexed like CounterNames.
func (l *Loaded) Counters() ([]uint64, error) { return ReadCounters(l.Objects.LbMetricsV1) }

// ReadCounters reads lb_metrics_v1 (loaded, or opened from its pin) as
// Counters does: every counter the programs know, summed over CPUs.
func ReadCounters(m *ebpf.Map) ([]uint64, error) {
	n := int(bpfobj.SockLbMetricLB_M_MAX)
	out := make([]uint64, n)
	for i := 0; i < n; i++ {
		var perCPU []uint64
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %d: %w", i, err)
		}
		for _, v := range perCPU {
			out[i] += v
		}
	}
	return out, nil
}
