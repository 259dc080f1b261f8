package proxymode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// TestAutoDoesNotFallBackOverPinnedMapsItCannotMigrate pins a map of a
// layout no migration converts where the agent pins its maps, and checks
// that --proxy-mode=auto fails, naming the map, rather than starting IPVS
// or iptables. It runs in a sandbox node's namespace, so that even a
// regression only touches that namespace's netfilter.
func TestAutoDoesNotFallBackOverPinnedMapsItCannotMigrate(t *testing.T) {
	sb := sandbox.ForTest(t)
	node, err := sb.AddNode("node1")
	if err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(sb.BPFFS.Path(), "node1")
	if err := os.MkdirAll(filepath.Join(bpffs, "maps"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := node.NS.Do(func() error { return errors.Join(loader.Cleanup(bpffs), loader.CleanupTC()) }); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	// lb4_revnat_v1 with a 12-byte value: no release wrote that, and no
	// migration reads it.
	bogus, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 12, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer bogus.Close()
	if err := bogus.Pin(filepath.Join(bpffs, "maps", bpfobj.SockMapLb4RevnatV1)); err != nil {
		t.Fatal(err)
	}

	core, logs := observer.New(zap.InfoLevel)
	var started *proxymode.Started
	err = node.NS.Do(func() (err error) {
		started, err = proxymode.Start(context.Background(), proxymode.Config{
			Mode: proxymode.Auto,
			BPF: bpf.Config{CgroupPath: sb.Cgroup.Path(), BPFFSPath: bpffs, Sizes: loader.DefaultMapSizes,
				ConntrackSize: loader.DefaultConntrackSize, SNATPorts: bpf.DefaultSNATPortRange, XDP: loader.XDPOff,
				Metrics: metrics.New(metrics.IPv4)},
		}, zap.New(core))
		return err
	})
	if started != nil {
		started.Close()
		t.Fatalf("auto started the %s mode (reason %s) over a pinned map it cannot migrate, want an error", started.Mode, started.Reason)
	}
	if !errors.Is(err, loader.ErrPinnedMapMismatch) {
		t.Fatalf("got %v, want ErrPinnedMapMismatch", err)
	}
	for _, s := range []string{bpfobj.SockMapLb4RevnatV1, "value 12 B", "does not fall back"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if n := logs.FilterMessageSnippet("proxy mode chosen").Len(); n != 0 {
		t.Errorf("%d log lines say a proxy mode was chosen", n)
	}
	// The pinned map is still the one that was there.
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "maps", bpfobj.SockMapLb4RevnatV1), nil)
	if err != nil {
		t.Fatalf("the pinned map is gone: %v", err)
	}
	defer m.Close()
	if m.ValueSize() != 12 {
		t.Errorf("pinned %s has a %d-byte value, want the untouched 12", bpfobj.SockMapLb4RevnatV1, m.ValueSize())
	}
}
