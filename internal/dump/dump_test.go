package dump

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

var (
	a = netip.MustParseAddr
	// What the maps hold: web's ClusterIP and NodePort (with the internal
	// entry its external policy Local needs), dns's ClusterIP, a
	// rejecting ClusterIP, and a stale entry the agent does not name.
	v4 = []maps.FrontendEntry{
		{Frontend: maps.Frontend{Addr: a("10.96.0.10"), Port: 53, Proto: model.UDP}, Flags: maps.FlagClusterIP, SvcID: 3, RevNatID: 3, Count: 1,
			Backends: []maps.BackendEntry{{ID: 4, Addr: a("10.244.1.2"), Port: 5353}}},
		{Frontend: maps.Frontend{Addr: a("10.96.0.20"), Port: 80, Proto: model.TCP}, Flags: maps.FlagClusterIP, SvcID: 2, RevNatID: 2, Count: 2, AffinityTimeout: 3600,
			Backends: []maps.BackendEntry{{ID: 1, Addr: a("10.244.1.3"), Port: 8080, Flags: maps.BackendFlagLocal}, {ID: 2, Addr: a("10.244.2.3"), Port: 8080, Flags: maps.BackendFlagTerminating}}},
		{Frontend: maps.Frontend{Addr: a("10.96.0.30"), Port: 80, Proto: model.TCP}, Flags: maps.FlagClusterIP | maps.FlagReject, SvcID: 1, RevNatID: 1},
		{Frontend: maps.Frontend{Addr: a("10.96.0.99"), Port: 80, Proto: model.TCP}, Flags: maps.FlagClusterIP, SvcID: 7, RevNatID: 9, Count: 1,
			Backends: []maps.BackendEntry{{ID: 8, Missing: true}}},
		{Frontend: maps.Frontend{Addr: a("192.0.2.1"), Port: 30080, Proto: model.TCP, Scope: maps.ScopeInternal}, Flags: maps.FlagNodePort, SvcID: 2, RevNatID: 5, Count: 2,
			Backends: []maps.BackendEntry{{ID: 1, Addr: a("10.244.1.3"), Port: 8080, Flags: maps.BackendFlagLocal}, {ID: 2, Addr: a("10.244.2.3"), Port: 8080, Flags: maps.BackendFlagTerminating}}},
		{Frontend: maps.Frontend{Addr: a("192.0.2.1"), Port: 30080, Proto: model.TCP}, Flags: maps.FlagNodePort | maps.FlagTwoScopes | maps.FlagExternalLocal, SvcID: 2, RevNatID: 4, Count: 1,
			Backends: []maps.BackendEntry{{ID: 1, Addr: a("10.244.1.3"), Port: 8080, Flags: maps.BackendFlagLocal}}},
	}
	v6 = []maps.FrontendEntry{
		{Frontend: maps.Frontend{Addr: a("fd00::20"), Port: 80, Proto: model.TCP}, Flags: maps.FlagClusterIP, SvcID: 1, RevNatID: 1, Count: 1,
			Backends: []maps.BackendEntry{{ID: 1, Addr: a("fd00:244::3"), Port: 8080}}},
	}
	names = &api.Services{Node: "node-a", Services: []api.ServicePort{
		{Namespace: "default", Name: "empty", Protocol: "TCP", IPFamily: "IPv4",
			Frontends: []api.Frontend{{Address: a("10.96.0.30"), Port: 80, Kind: api.KindClusterIP, TrafficPolicy: "Cluster"}}},
		{Namespace: "default", Name: "web", Port: "http", Protocol: "TCP", IPFamily: "IPv4", ExternalTrafficPolicy: "Local",
			Frontends: []api.Frontend{{Address: a("10.96.0.20"), Port: 80, Kind: api.KindClusterIP, TrafficPolicy: "Cluster"},
				{Address: a("192.0.2.1"), Port: 30080, Kind: api.KindNodePort, TrafficPolicy: "Local"}},
			Backends: []api.Backend{{Address: a("10.244.1.3"), Port: 8080, State: api.StateReady, Local: true},
				{Address: a("10.244.2.3"), Port: 8080, State: api.StateServing}}},
		{Namespace: "default", Name: "web", Port: "http", Protocol: "TCP", IPFamily: "IPv6",
			Frontends: []api.Frontend{{Address: a("fd00::20"), Port: 80, Kind: api.KindClusterIP, TrafficPolicy: "Cluster"}},
			Backends:  []api.Backend{{Address: a("fd00:244::3"), Port: 8080, State: api.StateReady}}},
		{Namespace: "kube-system", Name: "dns", Protocol: "UDP", IPFamily: "IPv4",
			Frontends: []api.Frontend{{Address: a("10.96.0.10"), Port: 53, Kind: api.KindClusterIP, TrafficPolicy: "Cluster"}},
			Backends:  []api.Backend{{Address: a("10.244.1.2"), Port: 5353, State: api.StateReady}}},
	}}
	fams = []Family{{"IPv4", v4}, {"IPv6", v6}}
)

func TestJoinNamesFrontendsAndBackends(t *testing.T) {
	r := Join(fams, names)
	if !r.Named || r.Node != "node-a" {
		t.Errorf("named %v node %q", r.Named, r.Node)
	}
	var got []string
	for _, s := range r.Services {
		got = append(got, s.Namespace+"/"+s.Name+":"+s.Port+"/"+s.Protocol)
	}
	want := "default/empty:/TCP default/web:http/TCP kube-system/dns:/UDP /:/TCP"
	if strings.Join(got, " ") != want {
		t.Fatalf("services %q, want %q (named ones sorted, the stale entry last)", strings.Join(got, " "), want)
	}
	web := r.Services[1]
	if len(web.Frontends) != 4 {
		t.Fatalf("web: %d frontends, want ClusterIP, NodePort internal and external, IPv6 ClusterIP", len(web.Frontends))
	}
	cip := web.Frontends[0]
	if cip.Kind != api.KindClusterIP || cip.TrafficPolicy != "Cluster" || cip.AffinityTimeoutSeconds != 3600 || cip.Count != 2 ||
		cip.Backends[0].State != api.StateReady || !cip.Backends[0].Local || cip.Backends[1].State != api.StateServing || cip.Backends[1].Local {
		t.Errorf("web's ClusterIP %+v", cip)
	}
	internal, external := web.Frontends[1], web.Frontends[2]
	if internal.Scope != ScopeInternal || internal.TrafficPolicy != "Cluster" || external.Scope != ScopeExternal ||
		external.TrafficPolicy != "Local" || external.Kind != api.KindNodePort || len(external.Backends) != 1 {
		t.Errorf("web's NodePort: internal %+v external %+v", internal, external)
	}
	if v6 := web.Frontends[3]; v6.IPFamily != "IPv6" || v6.Address != a("fd00::20") || v6.Backends[0].State != api.StateReady {
		t.Errorf("web's IPv6 ClusterIP %+v", v6)
	}
	if e := r.Services[0].Frontends[0]; e.Verdict != VerdictReject || len(e.Backends) != 0 {
		t.Errorf("empty: %+v, want reject", e)
	}
	if st := r.Services[3]; st.Named() || st.Frontends[0].ServiceID != 7 || st.Frontends[0].Backends[0].State != "missing" {
		t.Errorf("stale entry %+v", st)
	}
}

// Without the agent every frontend stays, grouped by family and id, with
// the states the map's flags give.
func TestJoinWithoutNames(t *testing.T) {
	r := Join(fams, nil)
	if r.Named {
		t.Error("named without names")
	}
	var n int
	for _, s := range r.Services {
		if s.Named() {
			t.Errorf("%+v named", s)
		}
		n += len(s.Frontends)
		for _, f := range s.Frontends {
			if f.TrafficPolicy != "" {
				t.Errorf("%v: policy %q without the agent", f.Address, f.TrafficPolicy)
			}
		}
	}
	if n != len(v4)+len(v6) {
		t.Errorf("%d frontends, want %d", n, len(v4)+len(v6))
	}
	// IPv4 svc 2 (ClusterIP, NodePort x2) and IPv6 svc 1 are apart from
	// IPv4 svc 1: ids are numbered per family.
	if len(r.Services) != 5 {
		t.Errorf("%d groups, want 5 (IPv4 ids 1, 2, 3, 7; IPv6 id 1)", len(r.Services))
	}
	if b := r.Services[1].Frontends[0].Backends[1]; r.Services[1].Frontends[0].ServiceID != 2 || b.State != api.StateTerminating {
		t.Errorf("IPv4 svc 2's second backend %+v, want terminating from the map's flag", b)
	}
}

func TestFilter(t *testing.T) {
	r := Join(fams, names)
	count := func(r Report) (svcs, fes int) {
		for _, s := range r.Services {
			svcs++
			fes += len(s.Frontends)
		}
		return
	}
	for _, c := range []struct {
		name      string
		o         Options
		svcs, fes int
	}{
		{"none", Options{}, 4, 7},
		{"service", Options{Service: model.ServiceName{Namespace: "default", Name: "web"}}, 1, 4},
		{"unknown service", Options{Service: model.ServiceName{Namespace: "default", Name: "nope"}}, 0, 0},
		{"udp", Options{Protocol: model.UDP}, 1, 1},
		{"frontend address", Options{Address: a("192.0.2.1")}, 1, 2},
		{"backend address", Options{Address: a("10.244.2.3")}, 1, 2},
		{"service and protocol", Options{Service: model.ServiceName{Namespace: "default", Name: "web"}, Protocol: model.UDP}, 0, 0},
	} {
		if s, f := count(Filter(r, c.o)); s != c.svcs || f != c.fes {
			t.Errorf("%s: %d services, %d frontends; want %d, %d", c.name, s, f, c.svcs, c.fes)
		}
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	r := Filter(Join(fams, names), Options{Service: model.ServiceName{Namespace: "default", Name: "web"}})
	if err := WriteTable(&b, r, false); err != nil {
		t.Fatal(err)
	}
	want := `SERVICE      PORT  FRONTEND             KIND               BACKENDS  ADDRESSES
default/web  http  10.96.0.20:80/TCP    ClusterIP          2         10.244.1.3:8080 ready local, 10.244.2.3:8080 serving
default/web  http  192.0.2.1:30080/TCP  NodePort/internal  2         10.244.1.3:8080 ready local, 10.244.2.3:8080 serving
default/web  http  192.0.2.1:30080/TCP  NodePort           1         10.244.1.3:8080 ready local
default/web  http  [fd00::20]:80/TCP    ClusterIP          1         [fd00:244::3]:8080 ready
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestWriteTableWideAndUnnamed(t *testing.T) {
	var b bytes.Buffer
	r := Filter(Join(fams, nil), Options{Address: a("10.96.0.20")})
	if err := WriteTable(&b, r, true); err != nil {
		t.Fatal(err)
	}
	want := `SERVICE  PORT  FRONTEND           KIND       SVC-ID  REVNAT-ID  POLICY  AFFINITY  FLAGS       BACKENDS  ADDRESSES
svc=2    -     10.96.0.20:80/TCP  ClusterIP  2       2          -       3600s     cluster-ip  2         #1 10.244.1.3:8080 ready local, #2 10.244.2.3:8080 terminating
`
	if b.String() != want {
		t.Errorf("wide table:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	if err := WriteTable(&b, Filter(Join(fams, names), Options{Address: a("10.96.0.30")}), false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "default/empty  -     10.96.0.30:80/TCP  ClusterIP  0 (reject)  -") {
		t.Errorf("a rejecting frontend:\n%s", b.String())
	}
}

// The JSON keys are the documented schema (Report's doc comment).
func TestWriteJSONSchema(t *testing.T) {
	var b bytes.Buffer
	r := Filter(Join(fams, names), Options{Protocol: model.UDP})
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := `{"named":true,"node":"node-a","services":[{"namespace":"kube-system","name":"dns","protocol":"UDP","frontends":[` +
		`{"address":"10.96.0.10","port":53,"ipFamily":"IPv4","kind":"ClusterIP","scope":"external","trafficPolicy":"Cluster","verdict":"forward",` +
		`"serviceID":3,"revNatID":3,"flags":"cluster-ip","count":1,"backends":[{"address":"10.244.1.2","port":5353,"id":4,"state":"ready","local":false}]}]}]}`
	if compact, _ := json.Marshal(got); string(compact) != canonical(t, want) {
		t.Errorf("json:\n%s\nwant:\n%s", compact, canonical(t, want))
	}
}

func canonical(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func TestParseOptions(t *testing.T) {
	ok := Flags{Output: "table", Service: "default/web", Address: "10.96.0.20", Protocol: "udp"}
	o, err := ParseOptions(ok)
	if err != nil || o.Service.Name != "web" || o.Address != a("10.96.0.20") || o.Protocol != model.UDP {
		t.Errorf("%+v: %+v, %v", ok, o, err)
	}
	for _, c := range []struct {
		f    Flags
		want string
	}{
		{Flags{Output: "yaml"}, `-o "yaml": want table, wide, json or entries`},
		{Flags{Output: "table", Service: "web"}, `--service "web": want namespace/name`},
		{Flags{Output: "table", Service: "a/b/c"}, `--service "a/b/c": want namespace/name`},
		{Flags{Output: "table", Address: "10.96.0"}, `--address "10.96.0": not an IP address`},
		{Flags{Output: "table", Protocol: "icmp"}, `--protocol "icmp": want tcp, udp or sctp`},
		{Flags{Output: "entries", Protocol: "tcp"}, "do not apply to -o entries"},
	} {
		if _, err := ParseOptions(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.f, err, c.want)
		}
	}
}
