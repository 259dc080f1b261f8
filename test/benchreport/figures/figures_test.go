package figures

import (
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkXDPPaths/xdp/not_a_frontend/IPv4-2         	     200	    746649 ns/op	       116.0 ns/pkt
BenchmarkXDPPaths/xdp/not_TCP_or_UDP_(ARP,_neighbour_solicitation)/IPv4-2         	     200	    137174 ns/op	        27.00 ns/pkt
BenchmarkXDPPaths/xdp/tracked_flow,_remote_backend_(SNAT)/IPv4-2                  	     200	      3186 ns/op	       413.0 ns/pkt	        68.33 overhead-ns
BenchmarkPathsIPv6VsIPv4/tc/ingress/not_a_frontend-2 	200	 9000 ns/op	40.00 ipv4-ns/pkt	44.00 ipv6-ns/pkt	1.100 ipv6/ipv4
BenchmarkPathsIPv6VsIPv4/xdp/policy_Local,_none_here:_drop-2 	200	 9000 ns/op	100.0 ipv4-ns/pkt	131.0 ipv6-ns/pkt	1.310 ipv6/ipv4
BenchmarkPathsIPv6VsIPv4/xdp/not_a_frontend-2 	200	 9000 ns/op	20.00 ipv4-ns/pkt	19.00 ipv6-ns/pkt	0.9500 ipv6/ipv4
BenchmarkConnectRate/services=1-2 	1	6000000000 ns/op	1450 clusterip_conn/s	4700 hook_ns/conn
BenchmarkConnectRate/services=10000-2 	1	6000000000 ns/op	1400 clusterip_conn/s	900.5 hook_ns/conn
    bench_test.go:12: some log line
bench: pps_xdp_vs_iptables=3.40 ratio target=3 met=yes
PASS
`

func TestParseAndCollect(t *testing.T) {
	res, printed, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 8 {
		t.Fatalf("parsed %d results, want 8: %+v", len(res), res)
	}
	got := Collect(res, printed)
	want := map[string]float64{"xdp_miss": 116, "xdp_trivial": 27, "xdp_tracked": 413, "sock_hook": 900.5, "pps_xdp_vs_iptables": 3.4,
		// The worst of the three paths' ratios, not the last one's.
		"ipv6_vs_ipv4": 1.31}
	if len(got) != len(want) {
		t.Errorf("collected %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestLine(t *testing.T) {
	for _, c := range []struct {
		name string
		v    float64
		want string
	}{
		{"xdp_miss_x_base", 1.62, "bench: xdp_miss_x_base=1.62 ratio target=1.5 met=no"},
		{"xdp_miss_x_base", 0.7, "bench: xdp_miss_x_base=0.70 ratio target=1.5 met=yes"},
		// Nanoseconds differ between machines: printed, without a target.
		{"xdp_miss", 116, "bench: xdp_miss=116 ns"},
		{"pps_tc_vs_iptables", 1.52, "bench: pps_tc_vs_iptables=1.52 ratio target=1.5 met=yes"},
		{"pps_tc_vs_iptables", 1.2, "bench: pps_tc_vs_iptables=1.20 ratio target=1.5 met=no"},
		{"xdp_trivial", 27, "bench: xdp_trivial=27.0 ns"},
	} {
		f, ok := ByName(c.name)
		if !ok {
			t.Fatalf("no figure %s", c.name)
		}
		if got := f.Line(c.v); got != c.want {
			t.Errorf("Line(%v) = %q, want %q", c.v, got, c.want)
		}
		// What a line says can be read back.
		if name, v, ok := parseLine(f.Line(c.v)); !ok || name != c.name || v != c.v {
			t.Errorf("parseLine(%q) = %s %v %v", f.Line(c.v), name, v, ok)
		}
	}
}

func TestNamesAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range All {
		if seen[f.Name] {
			t.Errorf("figure %s twice", f.Name)
		}
		seen[f.Name] = true
		if f.Source == "" || f.Doc == "" || f.Unit == "" {
			t.Errorf("figure %s lacks a source, doc or unit", f.Name)
		}
	}
}

func TestMediansFoldRepeatedRuns(t *testing.T) {
	const runs = `BenchmarkPaths/ingress/not_a_frontend-2 	200	1 ns/op	76.00 ns/pkt
BenchmarkPaths/ingress/tracked-2 	200	1 ns/op	700 ns/pkt
BenchmarkPaths/ingress/not_a_frontend-2 	200	1 ns/op	142.0 ns/pkt
BenchmarkPaths/ingress/tracked-2 	200	1 ns/op	600 ns/pkt
BenchmarkPaths/ingress/not_a_frontend-2 	200	1 ns/op	75.00 ns/pkt
`
	res, _, err := Parse(strings.NewReader(runs))
	if err != nil {
		t.Fatal(err)
	}
	got := Medians(res)
	if len(got) != 2 || got[0].Name != "BenchmarkPaths/ingress/not_a_frontend" || got[1].Name != "BenchmarkPaths/ingress/tracked" {
		t.Fatalf("folded into %+v, want the two benchmarks in their first run's order", got)
	}
	if v := got[0].Metrics["ns/pkt"]; v != 76 || got[0].Runs != 3 {
		t.Errorf("median of 76, 142, 75 over %d runs = %v, want 76 over 3", got[0].Runs, v)
	}
	if v := got[1].Metrics["ns/pkt"]; v != 650 {
		t.Errorf("median of two runs, 700 and 600 = %v, want their mean 650", v)
	}
}
