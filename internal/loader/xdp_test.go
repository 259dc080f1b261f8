package loader_test

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// xdpState is what the kernel says is attached to a device: the program id
// and mode (netlink's XDP_ATTACHED_*), 0 and 0 for nothing.
type xdpState struct {
	prog uint32
	mode uint32
}

func (f *tcFixture) attachedXDP(t *testing.T, dev string) xdpState {
	t.Helper()
	var st xdpState
	err := f.ns.Do(func() error {
		lk, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if x := lk.Attrs().Xdp; x != nil && x.Attached {
			st = xdpState{prog: x.ProgId, mode: x.AttachMode}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (f *tcFixture) loadXDP(t *testing.T, mode string, devs ...string) (*loader.XDPLoaded, error) {
	t.Helper()
	var l *loader.XDPLoaded
	err := f.ns.Do(func() error {
		var err error
		l, err = loader.LoadXDP(loader.XDPConfig{BPFFSPath: f.bpffs, Sizes: smallSizes, ConntrackSize: 1024, Devices: devs, Mode: mode})
		return err
	})
	if l != nil {
		t.Cleanup(l.Close)
	}
	return l, err
}

// netlink's XDP_ATTACHED_* values.
const (
	xdpAttachedDrv = 1
	xdpAttachedSKB = 2
)

// TestXDPAttachReplaceModeCleanup: the XDP program attaches in the mode
// asked for, a restarted agent replaces it in place, a change of mode
// moves it, and Cleanup detaches it.
func TestXDPAttachReplaceModeCleanup(t *testing.T) {
	f := newTCFixture(t)
	if _, err := f.load(t, loader.TCAttachAuto, "dev0", "dev1"); err != nil {
		t.Fatal(err)
	}
	l, err := f.loadXDP(t, loader.XDPNative, "dev0", "dev1")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Attached) != 2 || len(l.Failed) != 0 {
		t.Fatalf("native on veth: attached %v, failed %v", l.Attached, l.Failed)
	}
	first := f.attachedXDP(t, "dev0")
	if first.prog == 0 || first.mode != xdpAttachedDrv {
		t.Fatalf("dev0 after a native attach: %+v", first)
	}
	var devs []uint32
	var k, v uint32
	for it := l.Maps.Xdp4DevsV1.Iterate(); it.Next(&k, &v); {
		devs = append(devs, k)
	}
	if len(devs) != 2 {
		t.Errorf("device map holds %v, want both devices", devs)
	}
	l.Close()

	// A restart: the pinned link gets the new program.
	l2, err := f.loadXDP(t, loader.XDPNative, "dev0")
	if err != nil {
		t.Fatal(err)
	}
	second := f.attachedXDP(t, "dev0")
	if second.prog == 0 || second.prog == first.prog || second.mode != xdpAttachedDrv {
		t.Errorf("dev0 after a restart: %+v, before %+v", second, first)
	}
	if st := f.attachedXDP(t, "dev1"); st.prog != 0 {
		t.Errorf("dev1 no longer configured still has %+v", st)
	}

	// The agent exits before a restart in another mode.
	l2.Close()
	l3, err := f.loadXDP(t, loader.XDPGeneric, "dev0")
	if err != nil {
		t.Fatal(err)
	}
	if len(l3.Failed) != 0 {
		t.Fatalf("generic after native: %v", l3.Failed)
	}
	if st := f.attachedXDP(t, "dev0"); st.prog == 0 || st.mode != xdpAttachedSKB {
		t.Errorf("dev0 after switching to generic: %+v", st)
	}
	l3.Close()

	if err := loader.CleanupXDP(f.bpffs); err != nil {
		t.Fatal(err)
	}
	if st := f.attachedXDP(t, "dev0"); st.prog != 0 {
		t.Errorf("dev0 after CleanupXDP: %+v", st)
	}
	l4, err := f.loadXDP(t, loader.XDPGeneric, "dev0")
	if err != nil {
		t.Fatal(err)
	}
	l4.Close()
	if err := loader.Cleanup(f.bpffs); err != nil {
		t.Fatal(err)
	}
	if st := f.attachedXDP(t, "dev0"); st.prog != 0 {
		t.Errorf("dev0 after Cleanup: %+v", st)
	}
}

// TestXDPDeviceRefusingNativeFallsBack: a device without native XDP (a
// bridge) and a missing one are reported in Failed, and the others still
// get the program.
func TestXDPDeviceRefusingNativeFallsBack(t *testing.T) {
	f := newTCFixture(t)
	if err := f.ns.Netlink().LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil {
		t.Fatal(err)
	}
	l, err := f.loadXDP(t, loader.XDPNative, "dev0", "br0", "nosuchdev")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Attached) != 1 || l.Attached[0] != "dev0" {
		t.Errorf("attached %v, want dev0", l.Attached)
	}
	if l.Failed["br0"] == nil {
		t.Errorf("br0 did not fail in native mode: %v", l.Failed)
	}
	if !errors.Is(l.Failed["nosuchdev"], loader.ErrNoSuchDevice) {
		t.Errorf("missing device: %v", l.Failed["nosuchdev"])
	}
	if st := f.attachedXDP(t, "br0"); st.prog != 0 {
		t.Errorf("br0 has %+v", st)
	}
	if st := f.attachedXDP(t, "dev0"); st.mode != xdpAttachedDrv {
		t.Errorf("dev0 has %+v", st)
	}
	// Generic mode takes any device.
	l.Close()
	g, err := f.loadXDP(t, loader.XDPGeneric, "br0")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Failed) != 0 {
		t.Errorf("generic on a bridge failed: %v", g.Failed)
	}
	if st := f.attachedXDP(t, "br0"); st.mode != xdpAttachedSKB {
		t.Errorf("br0 has %+v", st)
	}
}

func TestXDPRejectsUnknownMode(t *testing.T) {
	if _, err := loader.LoadXDP(loader.XDPConfig{Mode: "offload"}); !errors.Is(err, loader.ErrXDPMode) {
		t.Errorf("mode offload: %v", err)
	}
}
