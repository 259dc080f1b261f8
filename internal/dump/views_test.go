package dump

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

var ap = netip.MustParseAddrPort

// A NodePort flow of web under source NAT (both its entries), a flow to a
// frontend the agent does not name, and an expired one.
var cts = []CTFamily{{"IPv4", []maps.CTEntry{
	{Proto: model.TCP, Client: ap("198.51.100.7:40112"), Frontend: ap("192.0.2.1:30080"), Backend: ap("10.244.1.3:8080"),
		SNAT: ap("192.0.2.1:61001"), BackendID: 1, SvcID: 2, Expires: 1100, Born: 990, Flags: maps.CTFlagSNAT},
	{Reply: true, Proto: model.TCP, Client: ap("198.51.100.7:40112"), Frontend: ap("192.0.2.1:30080"), Backend: ap("10.244.1.3:8080"),
		SNAT: ap("192.0.2.1:61001"), BackendID: 1, SvcID: 2, Expires: 1100, Born: 990, Flags: maps.CTFlagSNAT | maps.CTFlagFinReply},
	{Proto: model.TCP, Client: ap("198.51.100.8:5000"), Frontend: ap("10.96.0.99:80"), Backend: ap("10.244.9.9:80"),
		BackendID: 8, SvcID: 7, Expires: 900, Born: 100, Flags: maps.CTFlagClosing},
}}}

func TestConntrackNamesFlowsByFrontend(t *testing.T) {
	now := 1000 * time.Second
	r := BuildConntrack(cts, fams, names, now, Options{})
	if !r.Named || r.Node != "node-a" || len(r.Flows) != 3 {
		t.Fatalf("report %+v, want 3 flows named on node-a", r)
	}
	f := r.Flows[0]
	if f.Service.String() != "default/web:http" || f.Direction != DirectionOriginal || f.Client != ap("198.51.100.7:40112") ||
		f.Backend != ap("10.244.1.3:8080") || f.SNAT != ap("192.0.2.1:61001") || f.Flags != "snat" || f.ExpiresInSeconds != 100 || f.AgeSeconds != 10 {
		t.Errorf("web's flow %+v", f)
	}
	if r.Flows[1].Direction != DirectionReply {
		t.Errorf("second entry %+v, want web's reply entry", r.Flows[1])
	}
	if s := r.Flows[2].Service.String(); s != "svc=7" || r.Flows[2].ExpiresInSeconds != -100 {
		t.Errorf("unnamed flow %+v (%s), want svc=7, expired 100 s ago", r.Flows[2], s)
	}

	var buf bytes.Buffer
	if err := WriteConntrackTable(&buf, r, false); err != nil {
		t.Fatal(err)
	}
	// One line per flow, its two entries' flags together.
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[1]), " ") != "default/web:http TCP 198.51.100.7:40112 192.0.2.1:30080 10.244.1.3:8080 192.0.2.1:61001 snat,fin-reply 100s" ||
		!strings.HasSuffix(lines[2], "expired") {
		t.Errorf("table:\n%s", buf.String())
	}
	// wide: one line per entry, with its direction.
	buf.Reset()
	if err := WriteConntrackTable(&buf, r, true); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(buf.String()), "\n"); len(lines) != 4 || !strings.Contains(lines[2], " reply ") {
		t.Errorf("wide table:\n%s", buf.String())
	}

	// Filters: by Service, by an address of the flow, by protocol.
	if got := BuildConntrack(cts, fams, names, now, Options{Service: model.ServiceName{Namespace: "default", Name: "web"}}); len(got.Flows) != 2 {
		t.Errorf("--service default/web: %d flows, want web's 2", len(got.Flows))
	}
	if got := BuildConntrack(cts, fams, names, now, Options{Address: a("10.244.9.9")}); len(got.Flows) != 1 || got.Flows[0].BackendID != 8 {
		t.Errorf("--address of a backend: %+v", got.Flows)
	}
	if got := BuildConntrack(cts, fams, names, now, Options{Protocol: model.UDP}); len(got.Flows) != 0 {
		t.Errorf("--protocol udp: %+v", got.Flows)
	}
	// Without the agent: ids only.
	if got := BuildConntrack(cts, fams, nil, now, Options{}); got.Named || got.Flows[0].Service.String() != "svc=2" {
		t.Errorf("without names: %+v", got)
	}

	buf.Reset()
	if err := writeJSON(&buf, r); err != nil {
		t.Fatal(err)
	}
	var back ConntrackReport
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || len(back.Flows) != 3 || back.Flows[0].SNAT != f.SNAT || back.Flows[2].SNAT.IsValid() {
		t.Errorf("JSON round trip: %v\n%s", err, buf.String())
	}
	if strings.Count(buf.String(), `"snat": "`) != 2 {
		t.Errorf("JSON: want snat on the two source NAT entries only:\n%s", buf.String())
	}
}

func TestAffinityNamesClientsServicesAndBackends(t *testing.T) {
	afs := []AffinityFamily{{"IPv4", []maps.AffinityEntry{
		{NetnsCookie: 4097, SvcID: 2, BackendID: 2, LastUsedNs: uint64(8 * time.Second)},
		{ClientAddr: a("198.51.100.7"), SvcID: 2, BackendID: 1, LastUsedNs: uint64(9500 * time.Millisecond)},
	}}}
	r := BuildAffinity(afs, fams, names, 10*time.Second, Options{})
	if len(r.Entries) != 2 {
		t.Fatalf("entries %+v", r.Entries)
	}
	e := r.Entries[1]
	if e.Service.String() != "default/web:http" || e.Protocol != "TCP" || e.Client != a("198.51.100.7") || e.Backend != ap("10.244.1.3:8080") ||
		e.AgeSeconds != 0.5 || len(e.Frontends) != 2 {
		t.Errorf("entry %+v, want web, client 198.51.100.7, backend 10.244.1.3:8080, 0.5 s, both frontends", e)
	}
	var buf bytes.Buffer
	if err := WriteAffinityTable(&buf, r, false); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"netns:4097", "10.244.2.3:8080", "2.0s", "198.51.100.7", "10.96.0.20:80,192.0.2.1:30080"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if got := BuildAffinity(afs, fams, names, 10*time.Second, Options{Address: a("198.51.100.7")}); len(got.Entries) != 1 {
		t.Errorf("--address of a client: %+v", got.Entries)
	}
}

func TestMaglevShowsSlotsPerBackend(t *testing.T) {
	mfs := []MaglevFamily{{"IPv4", []maps.MaglevEntry{{SvcID: 2, Size: 7, Slots: map[uint32]int{1: 4, 2: 3}}}}}
	r := BuildMaglev(mfs, fams, names, Options{})
	if len(r.Tables) != 1 {
		t.Fatalf("tables %+v", r.Tables)
	}
	m := r.Tables[0]
	if m.Service.String() != "default/web:http" || m.Size != 7 || len(m.Backends) != 2 ||
		m.Backends[0] != (MaglevBackend{Address: a("10.244.1.3"), Port: 8080, ID: 1, Slots: 4}) || m.Backends[1].Slots != 3 {
		t.Errorf("table %+v", m)
	}
	var buf bytes.Buffer
	if err := WriteMaglevTable(&buf, r, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "7     10.244.1.3:8080=4, 10.244.2.3:8080=3") {
		t.Errorf("table:\n%s", buf.String())
	}
	if got := BuildMaglev(mfs, fams, names, Options{Service: model.ServiceName{Namespace: "kube-system", Name: "dns"}}); len(got.Tables) != 0 {
		t.Errorf("--service kube-system/dns: %+v", got.Tables)
	}
}

func TestSourceRangesPerFrontend(t *testing.T) {
	lb := []maps.FrontendEntry{{Frontend: maps.Frontend{Addr: a("192.0.2.10"), Port: 80, Proto: model.TCP},
		Flags: maps.FlagLoadBalancer | maps.FlagSourceRanges, SvcID: 5, RevNatID: 6}}
	rfs := []RangeFamily{{"IPv4", []maps.SourceRangeEntry{{SvcID: 5, Prefix: netip.MustParsePrefix("203.0.113.0/24")}, {SvcID: 5, Node: true}}}}
	r := BuildSourceRanges(rfs, []Family{{"IPv4", lb}}, nil, Options{})
	if len(r.Frontends) != 1 {
		t.Fatalf("frontends %+v", r.Frontends)
	}
	s := r.Frontends[0]
	if s.Service.String() != "svc=5" || s.Frontend != ap("192.0.2.10:80") || !s.AdmitsNode || len(s.CIDRs) != 1 {
		t.Errorf("%+v", s)
	}
	if got := BuildSourceRanges(rfs, []Family{{"IPv4", lb}}, nil, Options{Address: a("203.0.113.9")}); len(got.Frontends) != 1 {
		t.Errorf("--address in a range: %+v", got.Frontends)
	}
	if got := BuildSourceRanges(rfs, []Family{{"IPv4", lb}}, nil, Options{Address: a("198.51.100.1")}); len(got.Frontends) != 0 {
		t.Errorf("--address elsewhere: %+v", got.Frontends)
	}
	var buf bytes.Buffer
	if err := WriteSourceRangesTable(&buf, r, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "192.0.2.10:80/TCP  admitted  203.0.113.0/24") {
		t.Errorf("table:\n%s", buf.String())
	}
}

// The counters are named and described in the programs' order; the table
// shows those that happened and says how many it left out, wide shows all.
func TestCountersNamesEveryEvent(t *testing.T) {
	r := BuildCounters([]uint64{5, 0, 2}, []string{"translated_tcp", "translated_udp"}, []string{"TCP translated", "UDP translated"})
	if len(r.Counters) != 3 || r.Counters[0] != (Counter{"translated_tcp", "TCP translated", 5}) || r.Counters[2].Event != "event_2" || r.Counters[2].Count != 2 {
		t.Errorf("counters %+v, want 3 in order, the unnamed one as event_2", r.Counters)
	}
	var b bytes.Buffer
	if err := WriteCountersTable(&b, r, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "translated_tcp") || strings.Contains(out, "translated_udp") || !strings.Contains(out, "(1 events at 0 not shown") {
		t.Errorf("table:\n%s", out)
	}
	b.Reset()
	if err := WriteCountersTable(&b, r, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "translated_udp") || strings.Contains(b.String(), "not shown") {
		t.Errorf("wide table:\n%s", b.String())
	}
	js, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(js), `{"event":"translated_tcp","description":"TCP translated","count":5}`) {
		t.Errorf("JSON %s %v", js, err)
	}
}
