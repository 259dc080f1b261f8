package ipvs

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Addresses from the project's test address plan.
const (
	clientAddr  = "198.18.0.2"
	gatewayAddr = "198.18.0.1"
	vip         = "10.96.0.10"
	vipPort     = 80
	serverPort  = 8080
	connections = 8
)

var realServers = []struct{ name, addr, gateway string }{
	{"server-a", "10.244.1.2", "10.244.1.1"},
	{"server-b", "10.244.2.2", "10.244.2.1"},
}

func TestVirtualServerPassesTrafficToRealServers(t *testing.T) {
	requireIPVS(t)
	tests := []struct {
		name      string
		scheduler string
		// check judges how many of the connections each real server
		// accepted.
		check func(t *testing.T, perServer map[string]int)
	}{
		{
			name:      "round robin spreads connections evenly over the real servers",
			scheduler: libipvs.RoundRobin,
			check: func(t *testing.T, perServer map[string]int) {
				for _, s := range realServers {
					if got, want := perServer[s.name], connections/len(realServers); got != want {
						t.Errorf("%s accepted %d connections, want %d (all: %v)", s.name, got, want, perServer)
					}
				}
			},
		},
		{
			name:      "source hashing keeps one client on one real server",
			scheduler: libipvs.SourceHashing,
			check: func(t *testing.T, perServer map[string]int) {
				if len(perServer) != 1 {
					t.Errorf("connections from one client reached %d real servers, want 1: %v", len(perServer), perServer)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requireModule(t, "ip_vs_"+tt.scheduler)
			lab := newLab(t)
			svc := lab.addVirtualServer(t, tt.scheduler)

			perServer := map[string]int{}
			for i := range connections {
				perServer[lab.request(t, i)]++
			}
			tt.check(t, perServer)

			// What the real servers saw: every connection, from the
			// client's own address (IPVS NAT rewrites only the
			// destination).
			seen := lab.seen()
			total := 0
			for _, s := range realServers {
				total += len(seen[s.name])
				if len(seen[s.name]) != perServer[s.name] {
					t.Errorf("%s accepted %d connections, the client got %d replies from it", s.name, len(seen[s.name]), perServer[s.name])
				}
				for _, src := range seen[s.name] {
					if src != clientAddr {
						t.Errorf("%s saw a connection from %s, want the client's %s", s.name, src, clientAddr)
					}
				}
			}
			if total != connections {
				t.Errorf("real servers accepted %d connections, want %d", total, connections)
			}

			// IPVS's connection table (ipvsadm's ActiveConn and
			// InActConn) holds every connection, on the real server
			// that answered it. Its byte and packet counters would
			// not do: the kernel refreshes them only every two
			// seconds.
			dests, err := lab.ipvs.GetDestinations(svc)
			if err != nil {
				t.Fatalf("list real servers: %v", err)
			}
			if len(dests) != len(realServers) {
				t.Fatalf("virtual server has %d real servers, want %d", len(dests), len(realServers))
			}
			for _, d := range dests {
				name := serverAt(d.Address)
				if got := d.ActiveConnections + d.InactiveConnections; got != perServer[name] {
					t.Errorf("IPVS tracks %d connections to %s (%s), want %d", got, name, d.Address, perServer[name])
				}
			}
		})
	}
}

func TestDeletedVirtualServerStopsForwarding(t *testing.T) {
	requireIPVS(t)
	requireModule(t, "ip_vs_rr")
	lab := newLab(t)
	svc := lab.addVirtualServer(t, libipvs.RoundRobin)
	lab.request(t, 0)

	if err := lab.ipvs.DelService(svc); err != nil {
		t.Fatalf("delete virtual server: %v", err)
	}
	services, err := lab.ipvs.GetServices()
	if err != nil {
		t.Fatalf("list virtual servers: %v", err)
	}
	if len(services) != 0 {
		t.Errorf("%d virtual servers left after deleting the only one", len(services))
	}
	// The VIP is still a local address of the load balancer, with no
	// listener behind it: the connection is refused, not forwarded.
	err = lab.dial(func(net.Conn) error { return nil })
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connect to the deleted virtual server: %v, want connection refused", err)
	}
	if n := len(lab.seen()["server-a"]) + len(lab.seen()["server-b"]); n != 1 {
		t.Errorf("real servers accepted %d connections, want only the 1 from before the deletion", n)
	}
}

func serverAt(ip net.IP) string {
	for _, s := range realServers {
		if ip.Equal(net.ParseIP(s.addr)) {
			return s.name
		}
	}
	return ip.String()
}

// requireIPVS loads ip_vs. Inside the VM it must work, so any failure fails
// the test; on a host it skips only when the kernel genuinely has no IPVS
// (the CI host's kernel is built without it).
func requireIPVS(t *testing.T) {
	t.Helper()
	requireModule(t, "ip_vs")
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		unavailable(t, fmt.Sprintf("ip_vs loaded but /proc/net/ip_vs is missing: %v", err))
	}
}

// requireModule loads a module with modprobe, failing or skipping as
// requireIPVS does.
func requireModule(t *testing.T, name string) {
	t.Helper()
	out, err := exec.Command("modprobe", name).CombinedOutput()
	if err != nil {
		unavailable(t, fmt.Sprintf("modprobe %s: %v: %s", name, err, strings.TrimSpace(string(out))))
	}
}

func unavailable(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("EBPF_PROXY_VMTEST") != "" {
		t.Fatalf("IPVS must work inside the vmtest VM: %s", reason)
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	release := unix.ByteSliceToString(uts.Release[:])
	t.Skipf("IPVS is not available on this host's kernel %s (%s); the VM kernels run this test", release, reason)
}

// lab is a load balancer namespace with a virtual server address, a client
// namespace in front of it and one namespace per real server behind it:
//
//	client 198.18.0.2 -- 198.18.0.1 lb (VIP 10.96.0.10 on lo) 10.244.1.1 -- 10.244.1.2 server-a
//	                                                            10.244.2.1 -- 10.244.2.2 server-b
//
// The client's only route leads to the load balancer, and the servers' only
// routes lead back to it.
type lab struct {
	client, lb vnetns.NsHandle
	ipvs       *libipvs.Handle

	mu sync.Mutex
	// accepted records the source address of every connection each
	// real server accepted.
	accepted map[string][]string
}

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{client: newNetns(t), lb: newNetns(t), accepted: map[string][]string{}}
	link(t, l.client, "eth0", clientAddr+"/24", l.lb, "to-client", gatewayAddr+"/24")
	route(t, handleIn(t, l.client), "10.96.0.0/16", gatewayAddr)

	lbh := handleIn(t, l.lb)
	configure(t, lbh, "lo", vip+"/32")
	err := netns.DoHandle(l.lb, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		t.Fatalf("enable forwarding in the load balancer: %v", err)
	}
	for i, s := range realServers {
		ns := newNetns(t)
		link(t, l.lb, fmt.Sprintf("to-%s", s.name), s.gateway+"/24", ns, "eth0", s.addr+"/24")
		route(t, handleIn(t, ns), "198.18.0.0/24", s.gateway)
		l.serve(t, ns, realServers[i].name)
	}

	// moby/ipvs opens its netlink socket in the namespace at this path.
	h, err := libipvs.New(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(l.lb)))
	if err != nil {
		t.Fatalf("IPVS handle in the load balancer namespace: %v", err)
	}
	t.Cleanup(h.Close)
	l.ipvs = h
	return l
}

// serve starts a TCP server in ns that answers each connection with its
// name and records the peer's address.
func (l *lab) serve(t *testing.T, ns vnetns.NsHandle, name string) {
	t.Helper()
	var ln net.Listener
	err := netns.DoHandle(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", serverPort))
		return err
	})
	if err != nil {
		t.Fatalf("%s: listen: %v", name, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
			l.mu.Lock()
			l.accepted[name] = append(l.accepted[name], host)
			l.mu.Unlock()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err == nil {
				fmt.Fprintf(conn, "%s %s", name, line)
			}
			conn.Close()
		}
	}()
}

func (l *lab) seen() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]string{}
	for k, v := range l.accepted {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// addVirtualServer creates the TCP virtual server VIP:80 with the real
// servers behind it in NAT (masquerade) mode, as kube-proxy does, and
// deletes it when the test ends.
func (l *lab) addVirtualServer(t *testing.T, scheduler string) *libipvs.Service {
	t.Helper()
	svc := &libipvs.Service{
		AddressFamily: syscall.AF_INET,
		Protocol:      syscall.IPPROTO_TCP,
		Address:       net.ParseIP(vip),
		Port:          vipPort,
		Netmask:       0xffffffff,
		SchedName:     scheduler,
	}
	if err := l.ipvs.NewService(svc); err != nil {
		t.Fatalf("create virtual server %s:%d (%s): %v", vip, vipPort, scheduler, err)
	}
	t.Cleanup(func() {
		if l.ipvs.IsServicePresent(svc) {
			if err := l.ipvs.DelService(svc); err != nil {
				t.Errorf("delete virtual server: %v", err)
			}
		}
	})
	for _, s := range realServers {
		d := &libipvs.Destination{
			AddressFamily:   syscall.AF_INET,
			Address:         net.ParseIP(s.addr),
			Port:            serverPort,
			Weight:          1,
			ConnectionFlags: libipvs.ConnectionFlagMasq,
		}
		if err := l.ipvs.NewDestination(svc, d); err != nil {
			t.Fatalf("add real server %s: %v", s.addr, err)
		}
	}
	return svc
}

// dial connects from the client namespace to the virtual server and runs fn
// on the connection.
func (l *lab) dial(fn func(net.Conn) error) error {
	return netns.DoHandle(l.client, func() error {
		conn, err := net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", vip, vipPort), 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			return err
		}
		return fn(conn)
	})
}

// request sends one request through the virtual server and returns the name
// of the real server that answered.
func (l *lab) request(t *testing.T, i int) string {
	t.Helper()
	var server string
	err := l.dial(func(conn net.Conn) error {
		msg := fmt.Sprintf("request-%d\n", i)
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		reply, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read reply: %w", err)
		}
		name, echoed, ok := strings.Cut(reply, " ")
		if !ok || echoed != msg {
			return fmt.Errorf("reply %q does not echo %q", reply, msg)
		}
		server = name
		return nil
	})
	if err != nil {
		t.Fatalf("request %d through %s:%d: %v", i, vip, vipPort, err)
	}
	return server
}
