package nfconntrack

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// tcpFlow is flow for TCP in the conntrack state given (enum
// tcp_conntrack: 3 ESTABLISHED, 7 TIME_WAIT).
func tcpFlow(state uint8, src, dst, replySrc string) *netlink.ConntrackFlow {
	f := flow(unix.IPPROTO_TCP, src, dst, replySrc)
	f.ProtoInfo = &netlink.ProtoInfoTCP{State: state}
	return f
}

// keepTable says whether the namespace at path holds KeepTable.
func keepTable(t *testing.T, path string) bool {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(path), "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return strings.Contains(string(out), "inet "+KeepTable)
}

// TestKeepCountsOnlyOpenTranslatedTCPConnections: Keep counts the open TCP
// connections whose destination netfilter translated, of both families,
// and no other entry: an untranslated connection, one in TIME_WAIT, a
// translated UDP flow.
func TestKeepCountsOnlyOpenTranslatedTCPConnections(t *testing.T) {
	ns := sandbox.TestNetns(t, "ct-keep")
	createEntries(t, ns.Netlink(),
		tcpFlow(3, "198.18.0.10:40000", "192.168.77.11:30080", "10.244.1.10:8080"),
		tcpFlow(3, "[fd00:198:18::10]:40000", "[fd00:192:168:77::11]:30080", "[fd00:10:244:1::10]:8080"),
		tcpFlow(3, "198.18.0.10:40001", "192.168.77.11:22", "192.168.77.11:22"),
		tcpFlow(7, "198.18.0.10:40002", "192.168.77.11:30080", "10.244.1.10:8080"),
		flow(unix.IPPROTO_UDP, "198.18.0.10:40003", "192.168.77.11:30053", "10.244.1.10:5353"),
	)
	n, err := Translated(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("Translated counted %d connections, want the 2 open translated TCP ones", n)
	}
}

// TestKeepHoldsTheTableWhileTranslatedConnectionsLast: with a translated
// connection open, Keep adds KeepTable and reports it; once the connection
// is gone, the table goes and the gauge reads 0. With none, Keep removes
// a table an earlier agent left. RemoveKeep removes it, and finds nothing
// to do where it is absent.
func TestKeepHoldsTheTableWhileTranslatedConnectionsLast(t *testing.T) {
	ns := sandbox.TestNetns(t, "ct-keep")
	conn := tcpFlow(3, "198.18.0.10:40000", "192.168.77.11:30080", "10.244.1.10:8080")
	createEntries(t, ns.Netlink(), conn)
	held := prometheus.NewGauge(prometheus.GaugeOpts{Name: "held"})
	n, err := Keep(t.Context(), KeepConfig{Netns: ns.Path(), Interval: 50 * time.Millisecond, Held: held})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || testutil.ToFloat64(held) != 1 {
		t.Errorf("Keep counted %d (gauge %v), want 1", n, testutil.ToFloat64(held))
	}
	if !keepTable(t, ns.Path()) {
		t.Fatalf("no table %s with a translated connection open", KeepTable)
	}
	if err := ns.Netlink().ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for keepTable(t, ns.Path()) {
		if time.Now().After(deadline) {
			t.Fatalf("table %s still there 10 s after the connection went", KeepTable)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := testutil.ToFloat64(held); v != 0 {
		t.Errorf("gauge reads %v once no connection is left, want 0", v)
	}

	if err := addKeep(t.Context(), ns.Path()); err != nil {
		t.Fatal(err)
	}
	if n, err := Keep(t.Context(), KeepConfig{Netns: ns.Path()}); err != nil || n != 0 {
		t.Fatalf("Keep without translated connections: %d, %v", n, err)
	}
	if keepTable(t, ns.Path()) {
		t.Errorf("an earlier agent's table %s stays without translated connections", KeepTable)
	}
	if err := addKeep(t.Context(), ns.Path()); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := RemoveKeep(t.Context(), ns.Path()); err != nil {
			t.Fatalf("RemoveKeep #%d: %v", i+1, err)
		}
	}
	if keepTable(t, ns.Path()) {
		t.Errorf("table %s stays after RemoveKeep", KeepTable)
	}
}
