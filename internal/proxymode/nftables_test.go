package proxymode_test

import (
	"context"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/nftables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// --proxy-mode=nftables on a dual-stack node starts one dataplane per
// family, each writing its own table. Everything, the syncs included, runs
// inside a sandbox node's namespace. (--cleanup is not called from here:
// its iptables part forks its tools from a fresh thread, which is in the
// test process's namespace, not the node's; test/modes runs it in the
// agent binary inside the node.)
func TestNFTablesModeStartsBothFamilies(t *testing.T) {
	sb := sandbox.ForTest(t)
	node, err := sb.AddNode("node1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = node.NS.Do(func() error {
		o := options(t, "--proxy-mode=nftables", "--cluster-cidr="+example.ClusterCIDR.String()+","+example.ClusterCIDR6.String())
		s, err := modes.Start(ctx, o, proxymode.Config{Families: []string{metrics.IPv6, metrics.IPv4}}, zap.NewNop())
		if err != nil {
			return err
		}
		defer s.Close()
		if s.Mode != nftables.Name || s.Reason != proxymode.ReasonConfigured {
			t.Errorf("mode %s (%s), want nftables (configured)", s.Mode, s.Reason)
		}
		var fams []string
		for _, f := range s.Families {
			fams = append(fams, f.IPFamily)
			if f.Name() != nftables.Name {
				t.Errorf("%s is served by %s", f.IPFamily, f.Name())
			}
			up := example.NewSource(t, example.Node(example.NodeA)).Add(example.Example()...).Update()
			if f.IPFamily == metrics.IPv6 {
				up = example.NewSource6(t, example.Node6(example.NodeA)).Add(example.Example6()...).Update()
			}
			if err := f.Sync(up); err != nil {
				t.Errorf("sync %s: %v", f.IPFamily, err)
			}
		}
		if !slices.Equal(fams, []string{metrics.IPv6, metrics.IPv4}) || len(s.Skipped) != 0 {
			t.Errorf("families %v (skipped %v), want IPv6 and IPv4, primary first", fams, s.Skipped)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	present, err := nftables.Present(ctx, node.NS.Path())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ip ebpf-proxy", "ip6 ebpf-proxy"}; !slices.Equal(present, want) {
		t.Errorf("tables %v, want %v", present, want)
	}
	if err := nftables.Cleanup(ctx, node.NS.Path()); err != nil {
		t.Fatal(err)
	}
	if present, err := nftables.Present(ctx, node.NS.Path()); err != nil || len(present) > 0 {
		t.Errorf("after Cleanup: tables %v (%v)", present, err)
	}
}
