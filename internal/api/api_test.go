package api

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/builders"
)

func webState() (*model.State, model.ServicePortName) {
	st := &model.State{Node: model.Node{Name: "node-a", NodePorts: model.NodePortAddresses{
		Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.1")}}},
		Services: map[model.ServicePortName]*model.Service{}}
	sp := builders.ModelServicePort("default", "web", model.TCP, netip.MustParseAddr("10.96.0.20"), 80, func(sp *model.ServicePort) {
		sp.Name.Port = "http"
		sp.NodePort = 30080
		sp.ExternalPolicy = model.PolicyLocal
		sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.7")}
		sp.AffinityTimeout = time.Hour
	})
	eps := []model.Endpoint{
		builders.ModelEndpoint(netip.MustParseAddrPort("10.244.1.3:8080"), "node-a"),
		builders.ModelEndpoint(netip.MustParseAddrPort("10.244.2.3:8080"), "node-b", builders.ModelTerminating),
	}
	st.Services[sp.Name] = builders.ModelService(sp, eps, &st.Node)
	return st, sp.Name
}

func TestServicesDescribesFrontendsAndBackends(t *testing.T) {
	s := NewState()
	st, _ := webState()
	s.Family("IPv4").Sync(model.Update{State: st, Full: true})
	got := s.Services()
	if got.Node != "node-a" || len(got.Services) != 1 {
		t.Fatalf("got %+v, want node-a with one ServicePort", got)
	}
	sp := got.Services[0]
	if sp.Namespace != "default" || sp.Name != "web" || sp.Port != "http" || sp.Protocol != "TCP" || sp.IPFamily != "IPv4" ||
		sp.ExternalTrafficPolicy != "Local" || sp.InternalTrafficPolicy != "Cluster" || sp.AffinityTimeoutSeconds != 3600 {
		t.Errorf("ServicePort %+v", sp)
	}
	want := []Frontend{
		{netip.MustParseAddr("10.96.0.20"), 80, KindClusterIP, "Cluster"},
		{netip.MustParseAddr("192.0.2.1"), 30080, KindNodePort, "Local"},
		{netip.MustParseAddr("203.0.113.7"), 80, KindLoadBalancer, "Local"},
	}
	if len(sp.Frontends) != len(want) {
		t.Fatalf("frontends %+v, want %+v", sp.Frontends, want)
	}
	for i := range want {
		if sp.Frontends[i] != want[i] {
			t.Errorf("frontend %d: %+v, want %+v", i, sp.Frontends[i], want[i])
		}
	}
	wantB := []Backend{
		{netip.MustParseAddr("10.244.1.3"), 8080, StateReady, true, "node-a"},
		{netip.MustParseAddr("10.244.2.3"), 8080, StateServing, false, "node-b"},
	}
	if len(sp.Backends) != 2 || sp.Backends[0] != wantB[0] || sp.Backends[1] != wantB[1] {
		t.Errorf("backends %+v, want %+v", sp.Backends, wantB)
	}
}

// A partial update replaces or removes only the changed ServicePorts; a
// full one replaces everything.
func TestRecorderFollowsUpdates(t *testing.T) {
	s := NewState()
	rec := s.Family("IPv4")
	st, name := webState()
	rec.Sync(model.Update{State: st, Full: true})
	other := builders.ModelServicePort("kube-system", "dns", model.UDP, netip.MustParseAddr("10.96.0.10"), 53)
	st.Services[other.Name] = builders.ModelService(other, nil, &st.Node)
	delete(st.Services, name)
	rec.Sync(model.Update{State: st, Changed: model.ChangeSet{other.Name: {}}})
	if got := s.Services().Services; len(got) != 2 {
		t.Fatalf("after a partial update naming dns only: %d ServicePorts, want web kept and dns added", len(got))
	}
	rec.Sync(model.Update{State: st, Changed: model.ChangeSet{name: {}}})
	got := s.Services().Services
	if len(got) != 1 || got[0].Name != "dns" || len(got[0].Backends) != 0 {
		t.Fatalf("after web's removal: %+v, want dns alone", got)
	}
	s.Family("IPv6").Sync(model.Update{State: &model.State{Services: map[model.ServicePortName]*model.Service{}}, Full: true})
	if got := s.Services().Services; len(got) != 1 {
		t.Errorf("an empty IPv6 family changed the IPv4 one: %+v", got)
	}
}

func TestStateOf(t *testing.T) {
	for _, c := range []struct {
		ep   model.Endpoint
		want string
	}{
		{model.Endpoint{Ready: true, Serving: true}, StateReady},
		{model.Endpoint{Serving: true, Terminating: true}, StateServing},
		{model.Endpoint{Terminating: true}, StateTerminating},
		{model.Endpoint{}, StateNotReady},
	} {
		if got := StateOf(&c.ep); got != c.want {
			t.Errorf("%+v: %s, want %s", c.ep, got, c.want)
		}
	}
}

// The server answers on a socket only its owner may use, replaces a stale
// socket, refuses to replace anything else, and removes its socket when
// closed.
func TestServeOnUnixSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run", "agent.sock")
	s := NewState()
	st, _ := webState()
	s.Family("IPv4").Sync(model.Update{State: st, Full: true})

	stale, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	stale.Close() // leaves the socket file, as a killed agent does
	srv, err := Serve(path, s, nil, zap.NewNop())
	if err != nil {
		t.Fatalf("serve over a stale socket: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := Get(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Services) != 1 || got.Services[0].Name != "web" || got.Services[0].Frontends[0].Address != netip.MustParseAddr("10.96.0.20") {
		t.Errorf("GET %s: %+v", ServicesPath, got)
	}
	srv.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket left after Close: %v", err)
	}
	if _, err := Get(ctx, path); err == nil {
		t.Error("Get succeeded with no server")
	}

	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Serve(regular, s, nil, zap.NewNop()); err == nil {
		t.Error("Serve replaced a regular file")
	}
}

// Requests read while the sync loops record (go test -race checks the
// guarding): every answer is one whole update or the other.
func TestServicesWhileRecording(t *testing.T) {
	s := NewState()
	rec := s.Family("IPv4")
	st, name := webState()
	empty := &model.State{Node: st.Node, Services: map[model.ServicePortName]*model.Service{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 500 {
			if i%2 == 0 {
				rec.Sync(model.Update{State: st, Full: true})
			} else {
				rec.Sync(model.Update{State: empty, Changed: model.ChangeSet{name: {}}})
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		if got := s.Services().Services; len(got) > 1 || (len(got) == 1 && len(got[0].Frontends) != 3) {
			t.Fatalf("a torn answer: %+v", got)
		}
	}
}
