package tclb_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// clashPort is the source port the clients of TestSourcePortClash bind
// for both of their connections.
const clashPort = 41000

// TestSourcePortClash: a client that keeps its address (a pod translated
// per packet reaching ClusterIPs, an outside client under policy Local)
// connects from one source port to two frontends whose only endpoint is
// the same pod. Both connections carry data, as under kube-proxy, whose
// conntrack gives the second another source port: the two flows would
// otherwise share the backend's reply tuple, and the newer would take the
// older's replies. The backend sees the client's address on both, the
// first on the client's port, the second on another; the client sees each
// connection's frontend as its peer. With the backend on the other node,
// on this node behind a device without a program (its replies meet one
// only at the client's device), and for the outside client; both families.
func TestSourcePortClash(t *testing.T) {
	e := newTopology(t)
	a, b := e.nodes[0], e.nodes[1]
	podA := e.pods["pod-a"]
	podC, err := e.sb.AddServingPod(a.Node, "pod-c", netip.Addr{}, tcpPort, udpPort)
	if err != nil {
		t.Fatal(err)
	}
	e.pods[podC.Name] = podC
	e.attachDevices(a, loader.TCAttachAuto, []loader.TCDevice{
		{Name: sandbox.IfaceName, SNAT: a.IP, SNAT6: a.IP6},
		{Name: podA.HostVeth, SNAT: a.Gateway, SNAT6: a.Gateway6, Pod: true},
	})
	e.attach(b, loader.TCAttachAuto, false)
	svcs := append(scenario(),
		service{name: "to-pod-c", clusterIP: "10.96.0.30", proto: model.TCP, port: 80, nodePort: 30030, etpLocal: true, endpoints: []string{"pod-c"}},
		service{name: "to-pod-c-again", clusterIP: "10.96.0.31", proto: model.TCP, port: 80, nodePort: 30031, etpLocal: true, endpoints: []string{"pod-c"}},
	)
	e.sync(svcs...)
	e.sync6(svcs...)
	for _, fam := range []string{"IPv4", "IPv6"} {
		ip, at := family(fam == "IPv6")
		for _, tc := range []struct {
			name   string
			client *sandbox.Client
			to     [2]netip.AddrPort
			server string
		}{
			{"a pod to two ClusterIPs of a pod on the other node", e.sb.ClientAt(podA.Host),
				[2]netip.AddrPort{at("10.96.0.11", 80), at("10.96.0.14", 80)}, "pod-b"},
			{"a pod to two ClusterIPs of a pod beside it", e.sb.ClientAt(podA.Host),
				[2]netip.AddrPort{at("10.96.0.30", 80), at("10.96.0.31", 80)}, "pod-c"},
			{"an outside client to two NodePorts under policy Local", e.client,
				[2]netip.AddrPort{netip.AddrPortFrom(ip(a.IP), 30030), netip.AddrPortFrom(ip(a.IP), 30031)}, "pod-c"},
		} {
			t.Run(fam+"/"+tc.name, func(t *testing.T) {
				clashes := e.counter(a, bpfobj.TcLbMetricLB_M_TC_PORT_CLASH)
				var held [2]*sandbox.Held
				for i, to := range tc.to {
					h, err := tc.client.HoldFrom(e.ctx(), to, clashPort)
					if err != nil {
						t.Fatal(err)
					}
					defer h.Close()
					held[i] = h
					clientAddr := h.First.Local.Addr()
					switch r := h.First; {
					case r.Err != "" || r.Server != tc.server || r.Local.Port() != clashPort:
						t.Fatalf("connection %d to %s: got %+v; want %s answering port %d", i+1, to, r, tc.server, clashPort)
					case r.ClientSeen.Addr() != clientAddr:
						t.Errorf("connection %d to %s: %s saw %s; want the client's own address %s", i+1, to, tc.server, r.ClientSeen, clientAddr)
					case i == 0 && r.ClientSeen.Port() != clashPort:
						t.Errorf("the first connection: %s saw port %d; want the client's %d", tc.server, r.ClientSeen.Port(), clashPort)
					case i == 1 && r.ClientSeen == held[0].First.ClientSeen:
						t.Errorf("the second connection: %s saw %s, as for the first: both flows have one reply tuple", tc.server, r.ClientSeen)
					}
				}
				// The older connection first: it is the one whose replies
				// the newer flow would have taken.
				for i, h := range held {
					for range 3 {
						if err := h.Ping(); err != nil {
							t.Fatalf("connection %d to %s, after both opened: %v", i+1, tc.to[i], err)
						}
					}
					if peer, err := h.Peer(); err != nil || peer != tc.to[i] {
						t.Errorf("connection %d: peer %s, %v; want %s", i+1, peer, err, tc.to[i])
					}
				}
				if n := e.counter(a, bpfobj.TcLbMetricLB_M_TC_PORT_CLASH) - clashes; n != 1 {
					t.Errorf("node-a counted %d source port clashes, want 1", n)
				}
			})
		}
	}
}
