package bpf_test

import (
	"errors"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// recorder is the BPF dataplane's stand-in: it records what it is given.
type recorder struct{ ups []model.Update }

func (r *recorder) Name() string               { return "ebpf" }
func (r *recorder) Sync(up model.Update) error { r.ups = append(r.ups, up); return nil }

func sctpState(names ...string) *model.State {
	node := model.Node{Name: "node-a", Addrs: []netip.Addr{netip.MustParseAddr("192.168.77.11")}}
	st := &model.State{Node: node, Services: map[model.ServicePortName]*model.Service{}}
	ep := []model.Endpoint{builders.ModelEndpoint(netip.MustParseAddrPort("10.244.1.10:9999"), "node-a")}
	for i, name := range names {
		proto := model.SCTP
		if strings.HasPrefix(name, "tcp") {
			proto = model.TCP
		}
		sp := builders.ModelServicePort("default", name, proto, netip.AddrFrom4([4]byte{10, 96, 0, byte(50 + i)}), 9999)
		st.Services[sp.Name] = builders.ModelService(sp, ep, &st.Node)
	}
	return st
}

func nameOf(st *model.State, name string) model.ServicePortName {
	for n := range st.Services {
		if n.Name == name {
			return n
		}
	}
	panic(name)
}

// TestSCTPTableFollowsTheSCTPServicePorts: WithSCTP hands every update to
// the BPF dataplane as it is, and keeps the nftables table of the SCTP
// ServicePorts only while there are some: an earlier agent's table goes at
// the first sync without them, the first SCTP ServicePort of a partial
// sync brings it, holding that ServicePort alone, and the last one's
// removal takes it away; the gauge follows.
func TestSCTPTableFollowsTheSCTPServicePorts(t *testing.T) {
	ns := sandbox.TestNetns(t, "sctp-table")
	tables := func() string {
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(ns.Path()), "nft", "list", "tables").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list tables: %v: %s", err, out)
		}
		return string(out)
	}
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(ns.Path()), "nft", "add", "table", "ip", bpf.SCTPTable).CombinedOutput(); err != nil {
		t.Fatalf("an earlier agent's table: %v: %s", err, out)
	}
	m := metrics.New(metrics.IPv4)
	inner := &recorder{}
	d := bpf.WithSCTP(inner, bpf.SCTPConfig{Netfilter: xtables.Netfilter{Netns: ns.Path()}, Gauge: m.SCTPServicePorts})
	gauge := func(by string) float64 {
		return testutil.ToFloat64(m.SCTPServicePorts.WithLabelValues(metrics.IPv4, by))
	}
	sync := func(up model.Update) {
		t.Helper()
		if err := d.Sync(up); err != nil {
			t.Fatal(err)
		}
		if last := inner.ups[len(inner.ups)-1]; last.State != up.State || last.Full != up.Full || len(last.Changed) != len(up.Changed) {
			t.Errorf("the BPF dataplane got %+v, want the update as it is", last)
		}
	}

	st := sctpState("tcp-web")
	sync(model.Update{State: st, Full: true})
	if strings.Contains(tables(), bpf.SCTPTable) {
		t.Errorf("an earlier agent's table stays without SCTP ServicePorts:\n%s", tables())
	}

	st2 := sctpState("tcp-web", "sctp-a")
	sync(model.Update{State: st2, Changed: model.ChangeSet{nameOf(st2, "sctp-a"): {}}})
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(ns.Path()), "nft", "list", "table", "ip", bpf.SCTPTable).CombinedOutput()
	if err != nil {
		t.Fatalf("no table for the first SCTP ServicePort: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "10.96.0.51") || strings.Contains(string(out), "10.96.0.50") {
		t.Errorf("the table holds, want the SCTP ClusterIP 10.96.0.51 alone:\n%s", out)
	}
	if gauge(bpf.SCTPServedByNFTables) != 1 || gauge(bpf.SCTPServedByNone) != 0 {
		t.Errorf("gauge nftables=%v none=%v, want 1 and 0", gauge(bpf.SCTPServedByNFTables), gauge(bpf.SCTPServedByNone))
	}

	st3 := sctpState("tcp-web")
	sync(model.Update{State: st3, Changed: model.ChangeSet{nameOf(st2, "sctp-a"): {}}})
	if strings.Contains(tables(), bpf.SCTPTable) {
		t.Errorf("the table stays once the last SCTP ServicePort is gone:\n%s", tables())
	}
	if gauge(bpf.SCTPServedByNFTables) != 0 {
		t.Errorf("gauge nftables=%v, want 0", gauge(bpf.SCTPServedByNFTables))
	}
}

// TestSCTPUnservedIsSaid: where nftables cannot serve them, the SCTP
// ServicePorts are counted as unserved and an error line says why, once;
// the BPF dataplane's sync goes on.
func TestSCTPUnservedIsSaid(t *testing.T) {
	m := metrics.New(metrics.IPv4)
	core, logs := observer.New(zap.InfoLevel)
	inner := &recorder{}
	d := bpf.WithSCTP(inner, bpf.SCTPConfig{Gauge: m.SCTPServicePorts, Logger: zap.New(core),
		Unavailable: errors.New("--detect-local-mode: bad")})
	st := sctpState("tcp-web", "sctp-a", "sctp-b")
	for range 2 {
		if err := d.Sync(model.Update{State: st, Full: true}); err != nil {
			t.Fatal(err)
		}
	}
	if len(inner.ups) != 2 {
		t.Errorf("the BPF dataplane got %d syncs, want 2", len(inner.ups))
	}
	if v := testutil.ToFloat64(m.SCTPServicePorts.WithLabelValues(metrics.IPv4, bpf.SCTPServedByNone)); v != 2 {
		t.Errorf("gauge none=%v, want 2", v)
	}
	if lines := logs.FilterLevelExact(zap.ErrorLevel).FilterMessageSnippet("SCTP ServicePorts are not served").All(); len(lines) != 1 {
		t.Errorf("error lines: %v, want one", lines)
	}
}
