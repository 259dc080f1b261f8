package loader_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// tcFixture is a network namespace with two veth devices and a private
// bpffs; everything the TC loader does happens inside the namespace.
type tcFixture struct {
	ns    *sandbox.Netns
	bpffs string
}

var smallSizes = loader.MapSizes{Services: 1024, Backends: 1024, RevNat: 1024, SockRevNat: 1024, Affinity: 1024}

func newTCFixture(t *testing.T) *tcFixture {
	t.Helper()
	sandbox.RequireRoot(t)
	fs, err := sandbox.NewBPFFS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	ns, err := sandbox.NewNetns("tcload")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	f := &tcFixture{ns: ns, bpffs: filepath.Join(fs.Path(), "ebpf-proxy")}
	t.Cleanup(func() {
		loader.Cleanup(f.bpffs)
		ns.Do(loader.CleanupTC)
	})
	nl := ns.Netlink()
	for i, name := range []string{"dev0", "dev1"} {
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		lk, err := nl.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(192, 168, 77, byte(11+i)), Mask: net.CIDRMask(24, 32)}}
		if err := nl.AddrAdd(lk, addr); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *tcFixture) load(t *testing.T, mode string, devs ...string) (*loader.TCLoaded, error) {
	t.Helper()
	var tds []loader.TCDevice
	for i, d := range devs {
		tds = append(tds, loader.TCDevice{Name: d, SNAT: netip.AddrFrom4([4]byte{192, 168, 77, byte(11 + i)})})
	}
	var l *loader.TCLoaded
	err := f.ns.Do(func() error {
		var err error
		l, err = loader.LoadTC(loader.TCConfig{BPFFSPath: f.bpffs, Sizes: smallSizes, ConntrackSize: 1024, Devices: tds, Attach: mode})
		return err
	})
	if l != nil {
		t.Cleanup(l.Close)
	}
	return l, err
}

// attachedTC returns, per device and direction ("dev0/ingress"), the ids
// of the programs attached with tcx and through our clsact filters.
func (f *tcFixture) attachedTC(t *testing.T) map[string][]ebpf.ProgramID {
	t.Helper()
	out := map[string][]ebpf.ProgramID{}
	haveTCX := loader.ProbeTCX() == nil
	err := f.ns.Do(func() error {
		for _, name := range []string{"dev0", "dev1"} {
			lk, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			for _, d := range []struct {
				dir    string
				at     ebpf.AttachType
				parent uint32
			}{{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS}, {"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS}} {
				key := name + "/" + d.dir
				if haveTCX {
					res, err := link.QueryPrograms(link.QueryOptions{Target: lk.Attrs().Index, Attach: d.at})
					if err != nil {
						return err
					}
					for _, p := range res.Programs {
						out[key] = append(out[key], p.ID)
					}
				}
				fs, err := netlink.FilterList(lk, d.parent)
				if err != nil {
					continue // no clsact qdisc
				}
				for _, fl := range fs {
					if bf, ok := fl.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "ebpf-proxy-") {
						out[key] = append(out[key], ebpf.ProgramID(bf.Id))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func TestTCAttachReplaceDetach(t *testing.T) {
	sandbox.RequireRoot(t)
	tcxErr := loader.ProbeTCX()
	if tcxErr != nil && !errors.Is(tcxErr, ebpf.ErrNotSupported) {
		t.Fatal(tcxErr)
	}
	// Without a mode the loader takes tcx where the kernel has it.
	auto := loader.TCAttachTCX
	if tcxErr != nil {
		auto = loader.TCAttachClsact
	}
	for _, tc := range []struct{ mode, want string }{
		{loader.TCAttachTCX, loader.TCAttachTCX},
		{loader.TCAttachClsact, loader.TCAttachClsact},
		{loader.TCAttachAuto, auto},
	} {
		name := tc.mode
		if name == "" {
			name = "auto"
		}
		t.Run(name, func(t *testing.T) {
			if tc.mode == loader.TCAttachTCX && tcxErr != nil {
				t.Skipf("kernel without tcx; the clsact and auto cases cover it: %v", tcxErr)
			}
			mode := tc.mode
			f := newTCFixture(t)
			first, err := f.load(t, mode, "dev0", "dev1")
			if err != nil {
				t.Fatal(err)
			}
			if first.Mode != tc.want {
				t.Errorf("attached with %s, want %s", first.Mode, tc.want)
			}
			ids := []ebpf.ProgramID{progID(t, first.Objects.TcIngress), progID(t, first.Objects.TcEgress)}
			want := map[string][]ebpf.ProgramID{
				"dev0/ingress": {ids[0]}, "dev0/egress": {ids[1]},
				"dev1/ingress": {ids[0]}, "dev1/egress": {ids[1]},
			}
			if got := f.attachedTC(t); !equalIDs(got, want) {
				t.Fatalf("after the first load: %v, want %v", got, want)
			}

			// A restarted agent replaces the programs in place, and
			// detaches from a device it no longer has.
			first.Close()
			second, err := f.load(t, mode, "dev0")
			if err != nil {
				t.Fatal(err)
			}
			ids = []ebpf.ProgramID{progID(t, second.Objects.TcIngress), progID(t, second.Objects.TcEgress)}
			want = map[string][]ebpf.ProgramID{"dev0/ingress": {ids[0]}, "dev0/egress": {ids[1]}}
			got := f.attachedTC(t)
			if !equalIDs(got, want) {
				t.Fatalf("after the reload: %v, want %v", got, want)
			}
			second.Close()

			if err := loader.Cleanup(f.bpffs); err != nil {
				t.Fatal(err)
			}
			if err := f.ns.Do(loader.CleanupTC); err != nil {
				t.Fatal(err)
			}
			if got := f.attachedTC(t); len(got) != 0 {
				t.Errorf("after cleanup: %v still attached", got)
			}
		})
	}
}

func TestTCUnknownDevice(t *testing.T) {
	f := newTCFixture(t)
	_, err := f.load(t, loader.TCAttachAuto, "nosuchdev")
	if !errors.Is(err, loader.ErrNoSuchDevice) {
		t.Errorf("got %v, want ErrNoSuchDevice", err)
	}
}

func equalIDs(a, b map[string][]ebpf.ProgramID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w := b[k]
		if len(v) != len(w) {
			return false
		}
		for i := range v {
			if v[i] != w[i] {
				return false
			}
		}
	}
	return true
}

// TestTCPreload: the programs an agent preloads before it knows its
// devices attach nowhere and pin nothing until AttachDevices, which pins
// their maps and attaches them as LoadTC would; closed before, they leave
// nothing behind. When a pinned map must migrate, the preload loads
// nothing and leaves the pin alone: the migration happens at LoadTC, when
// the programs attach.
func TestTCPreload(t *testing.T) {
	f := newTCFixture(t)
	cfg := loader.TCConfig{BPFFSPath: f.bpffs, Sizes: smallSizes, ConntrackSize: 1024, Attach: loader.TCAttachClsact}
	pin := filepath.Join(f.bpffs, "maps", bpfobj.TcMapTc4CtV1)
	preload := func() *loader.TCLoaded {
		t.Helper()
		l, err := loader.PreloadTC(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if l == nil {
			t.Fatal("nothing preloaded from an empty bpffs")
		}
		if got := f.attachedTC(t); len(got) != 0 {
			t.Fatalf("preloaded programs attached to %v", got)
		}
		if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the preload pinned %s: %v", pin, err)
		}
		return l
	}
	preload().Close()
	l := preload()
	ids := []ebpf.ProgramID{progID(t, l.Objects.TcIngress), progID(t, l.Objects.TcEgress)}
	cfg.Devices = []loader.TCDevice{{Name: "dev0", SNAT: netip.MustParseAddr("192.168.77.11")}}
	if err := f.ns.Do(func() error { return l.AttachDevices(cfg) }); err != nil {
		t.Fatal(err)
	}
	want := map[string][]ebpf.ProgramID{"dev0/ingress": {ids[0]}, "dev0/egress": {ids[1]}}
	if got := f.attachedTC(t); !equalIDs(got, want) {
		t.Fatalf("attached %v, want the preloaded programs %v", got, want)
	}
	before := pinnedMapID(t, pin)
	if id := mapID(t, l.Objects.Tc4CtV1); id != before {
		t.Fatalf("%s pins map %d, want the preloaded map %d", pin, before, id)
	}
	l.Close()

	// A larger connection tracking size migrates the pinned maps.
	cfg.ConntrackSize = 2048
	migrated := 0
	cfg.Migrated = func(loader.MapMigration) { migrated++ }
	pre, err := loader.PreloadTC(cfg)
	if err != nil || pre != nil {
		t.Fatalf("preload with a map to migrate: loaded %t, error %v; want nothing loaded", pre != nil, err)
	}
	if after := pinnedMapID(t, pin); after != before || migrated != 0 {
		t.Fatalf("the preload migrated: map %d, was %d; %d reported", after, before, migrated)
	}
	var l2 *loader.TCLoaded
	if err := f.ns.Do(func() (err error) { l2, err = loader.LoadTC(cfg); return err }); err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if l2.Objects.Tc4CtV1.MaxEntries() != 2048 || pinnedMapID(t, pin) == before || migrated == 0 {
		t.Errorf("LoadTC after the preload: %d entries, map %d (was %d), %d migrations reported; want 2048, a new map, some",
			l2.Objects.Tc4CtV1.MaxEntries(), pinnedMapID(t, pin), before, migrated)
	}
}

func pinnedMapID(t *testing.T, pin string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return mapID(t, m)
}
