package maps

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// fakes6 are in-memory IPv6 maps in their kernel layouts.
type fakes6 struct {
	services *FakeMap[Service6Key, ServiceValue]
	backends *FakeMap[uint32, Backend6Value]
	revnat   *FakeMap[uint32, RevNat6Value]
	members  *FakeMap[MemberKey, uint8]
	ranges   *FakeMap[SourceRange6Key, uint8]
	maglev   *FakeMaglev
}

func newFakes6() *fakes6 {
	return &fakes6{
		services: NewFakeMap[Service6Key, ServiceValue](0),
		backends: NewFakeMap[uint32, Backend6Value](0),
		revnat:   NewFakeMap[uint32, RevNat6Value](0),
		members:  NewFakeMap[MemberKey, uint8](0),
		ranges:   NewFakeMap[SourceRange6Key, uint8](0),
		maglev:   NewFakeMaglev(FakeMaglevSize),
	}
}

func (f *fakes6) maps() Maps6 {
	return Maps6{Services: f.services, Backends: f.backends, RevNat: f.revnat, Members: f.members, SourceRanges: f.ranges, Maglev: f.maglev}
}

func (f *fakes6) writes() int {
	return f.services.Writes + f.backends.Writes + f.revnat.Writes + f.members.Writes + f.ranges.Writes
}

func dump6(t *testing.T, m Maps6) string {
	t.Helper()
	lines, err := Dump6(m)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

var (
	dns6 = svcSpec{ns: "kube-system", name: "dns", clusterIP: "fd00:10:96::10", port: 53, proto: model.UDP,
		eps: []string{"[fd00:10:244:1::2]:5353", "[fd00:10:244:2::2]:5353"}}
	web6 = svcSpec{ns: "default", name: "web", clusterIP: "fd00:10:96::20", port: 80, proto: model.TCP,
		eps: []string{"[fd00:10:244:1::3]:8080"}, terminate: []string{"[fd00:10:244:2::3]:8080"}, affinity: 3 * time.Hour}
)

// An IPv6 state goes into the IPv6 maps through the same planning as IPv4:
// frontends, slots, backends (a terminating one held, in no slot),
// memberships, affinity and reverse NAT, with the addresses in the IPv6
// layouts.
func TestWriter6ProgramsAnIPv6State(t *testing.T) {
	f := newFakes6()
	w, err := NewWriter6(f.maps(), Limits{Backends: 1000, RevNat: 1000})
	if err != nil {
		t.Fatal(err)
	}
	empty := web6
	empty.name, empty.clusterIP, empty.eps, empty.terminate, empty.affinity = "empty", "fd00:10:96::30", nil, nil, 0
	if err := w.Sync(full(buildState(dns6, web6, empty))); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"backend 1 [fd00:10:244:1::3]:8080/TCP",
		"backend 2 [fd00:10:244:2::3]:8080/TCP terminating",
		"backend 3 [fd00:10:244:1::2]:5353/UDP",
		"backend 4 [fd00:10:244:2::2]:5353/UDP",
		"member svc=2 backend=1 [fd00:10:244:1::3]:8080/TCP",
		"member svc=3 backend=3 [fd00:10:244:1::2]:5353/UDP",
		"member svc=3 backend=4 [fd00:10:244:2::2]:5353/UDP",
		"revnat 1 [fd00:10:96::30]:80",
		"revnat 2 [fd00:10:96::20]:80",
		"revnat 3 [fd00:10:96::10]:53",
		"service [fd00:10:96::10]:53/UDP count=2 revnat=3 svc=3 flags=cluster-ip",
		"service [fd00:10:96::10]:53/UDP slot=1 backend=3 [fd00:10:244:1::2]:5353/UDP",
		"service [fd00:10:96::10]:53/UDP slot=2 backend=4 [fd00:10:244:2::2]:5353/UDP",
		"service [fd00:10:96::20]:80/TCP count=1 revnat=2 svc=2 flags=cluster-ip affinity=10800s",
		"service [fd00:10:96::20]:80/TCP slot=1 backend=1 [fd00:10:244:1::3]:8080/TCP",
		"service [fd00:10:96::30]:80/TCP count=0 revnat=1 svc=1 flags=cluster-ip,reject",
	}, "\n")
	if got := dump6(t, f.maps()); got != want {
		t.Errorf("dump:\n%s\nwant:\n%s", got, want)
	}
	// The kernel layout: the address in network order, word by word.
	k := Service6Key{Address: be128(netip.MustParseAddr("fd00:10:96::10")), Dport: be16(53), Proto: uint8(model.UDP)}
	if _, ok := f.services.Entries[k]; !ok {
		t.Errorf("no master entry under the key %+v", k)
	}
	if got := addrFromBE128(k.Address); got != netip.MustParseAddr("fd00:10:96::10") {
		t.Errorf("address round trip: %s", got)
	}

	// A restarted agent restores ids from the IPv6 maps and rewrites
	// nothing.
	before := f.writes()
	w2, err := NewWriter6(f.maps(), Limits{Backends: 1000, RevNat: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Sync(full(buildState(dns6, web6, empty))); err != nil {
		t.Fatal(err)
	}
	if n := f.writes() - before; n != 0 {
		t.Errorf("restored writer made %d writes for an unchanged state", n)
	}
	// Removing an endpoint takes it out of the slots and the backends.
	dns := dns6
	dns.eps = dns.eps[:1]
	if err := w2.Sync(partial(buildState(dns, web6, empty), spn("kube-system", "dns", model.UDP))); err != nil {
		t.Fatal(err)
	}
	if got := w2.Removed(); len(got) != 1 || got[0].Addr != netip.MustParseAddr("fd00:10:244:2::2") {
		t.Errorf("removed %v, want the second DNS endpoint", got)
	}
	if d := dump6(t, f.maps()); strings.Contains(d, "fd00:10:244:2::2") {
		t.Errorf("removed endpoint still in the maps:\n%s", d)
	}
}

// Each family's Writer programs only its own addresses: the IPv4 one
// writes nothing of an IPv6 state, and the IPv6 one nothing of an IPv4
// state, so that two Writers over one collection never step on each other.
func TestWritersKeepToTheirFamily(t *testing.T) {
	f4 := newFakes(0, 0, 0)
	w4 := newWriter(t, f4.m)
	if err := w4.Sync(full(buildState(dns6, web6))); err != nil {
		t.Fatal(err)
	}
	if d := dump(t, f4.m); strings.Contains(d, "backend") || strings.Contains(d, "fd00") {
		t.Errorf("IPv4 maps after an IPv6 state:\n%s", d)
	}
	f6 := newFakes6()
	w6, err := NewWriter6(f6.maps(), Limits{Backends: 1000, RevNat: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := w6.Sync(full(buildState(dns, web))); err != nil {
		t.Fatal(err)
	}
	if d := dump6(t, f6.maps()); strings.Contains(d, "backend") || strings.Contains(d, "10.") {
		t.Errorf("IPv6 maps after an IPv4 state:\n%s", d)
	}
}

// IPv6 source ranges go into the IPv6 trie with 128-bit addresses; ranges
// of the other family are not the IPv6 LoadBalancer IP's.
func TestWriter6SourceRanges(t *testing.T) {
	f := newFakes6()
	w, err := NewWriter6(f.maps(), Limits{Backends: 1000, RevNat: 1000})
	if err != nil {
		t.Fatal(err)
	}
	st := buildState(web6)
	sp := st.Services[spn("default", "web", model.TCP)].Port
	sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("fd00:198:19::5")}
	sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("fd00:198:18::/120"), netip.MustParsePrefix("198.18.0.0/24")}
	if !WantsSourceRangeCheck(full(st)) {
		t.Error("WantsSourceRangeCheck: false for a Service with IPv6 source ranges")
	}
	if err := w.Sync(full(st)); err != nil {
		t.Fatal(err)
	}
	d := dump6(t, f.maps())
	for _, line := range []string{
		"source-range svc=1 fd00:198:18::/120",
		"service [fd00:198:19::5]:80/TCP count=1 revnat=2 svc=1 flags=load-balancer,source-ranges affinity=10800s",
	} {
		if !strings.Contains(d, line) {
			t.Errorf("dump lacks %q:\n%s", line, d)
		}
	}
	if strings.Contains(d, "198.18.0.0") {
		t.Errorf("an IPv4 range in the IPv6 trie:\n%s", d)
	}
	want := SourceRange6Key{Prefixlen: 32 + 120, SvcId: 1, Address: be128(netip.MustParseAddr("fd00:198:18::"))}
	if _, ok := f.ranges.Entries[want]; !ok || len(f.ranges.Entries) != 1 {
		t.Errorf("trie %v, want exactly %+v", f.ranges.Entries, want)
	}
	if !w.HasSourceRanges() {
		t.Error("HasSourceRanges: false")
	}
}
