package proxymode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
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
		o := options(t, "--proxy-mode=auto", "--cgroup-path="+sb.Cgroup.Path(), "--bpffs-path="+bpffs)
		started, err = modes.Start(context.Background(), o, proxymode.Config{}, zap.New(core))
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

// modes are the agent's modes, in its order (cmd/ebpf-proxy).
var modes = proxymode.Modes{bpf.Mode, nftables.Mode, iptables.Mode, ipvs.Mode}

// options are the agent's settings from args, as the agent reads them.
func options(t *testing.T, args ...string) *config.Options {
	t.Helper()
	o := modes.NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if _, err := config.FinishFlags(o, fs); err != nil {
		t.Fatal(err)
	}
	if err := modes.Validate(o); err != nil {
		t.Fatal(err)
	}
	return o
}
