package tcpkt_test

import (
	"net/netip"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// fromPod is a frame a pod on the node sends to its gateway, as its device
// p0 receives it; toPod one the node sends to a pod.
func fromPod[B frame[B]](b B) B { return b.WithMACs(podMAC, podDevMAC) }
func toPod[B frame[B]](b B) B   { return b.WithMACs(podDevMAC, podMAC) }

// TestPodFlows: tc_pod_ingress at a pod's device translates what the pod
// sends to a Service's ClusterIP, as the socket programs would translate
// its sockets, and tc_egress there the replies; the pod's other traffic
// passes untouched; a Service without endpoints answers with an ICMP port
// unreachable; a pod reaching itself through its Service is source-NATed
// to its device's address and sent back to it, and so is its reply.
func TestPodFlows(t *testing.T) {
	f := newFixture(t, loadOptions{podDevice: true})
	f.sync(t, fixtureState())
	pod := netip.MustParseAddrPort("10.244.1.20:40000")
	webRemote := netip.MustParseAddrPort("10.96.0.11:80")
	webLocal := netip.MustParseAddrPort("10.96.0.10:80")
	noEPs := netip.MustParseAddrPort("10.96.0.17:80")
	self := netip.AddrPortFrom(localWeb.Addr(), 40000)
	hairpinSrc := netip.AddrPortFrom(podGateway.Addr(), snatPort)
	syn := fromPod(pktest.TCP(pod, webRemote, pktest.SYN))
	newFlow, newFlowOK := f.counted(bpfobj.TcLbMetricLB_M_TC_POD_NEW, 1)
	hairpin, hairpinOK := f.counted(bpfobj.TcLbMetricLB_M_TC_POD_SNAT, 1)
	noSvc := fromPod(pktest.TCP(pod, remoteWeb, pktest.SYN))
	refused := fromPod(pktest.TCP(pod, noEPs, pktest.SYN))
	f.run(t, []row{
		{pod: true, Case: pktest.Case{
			Name: "a pod's SYN to a ClusterIP: destination rewritten to the backend, the pod's address kept", In: syn.Bytes(),
			Verdict: pktest.TCActOK, Out: syn.WithDst(remoteWeb).Bytes(), Setup: newFlow, Check: newFlowOK,
		}},
		{egress: true, onPodDevice: true, Case: pktest.Case{
			Name:    "the backend's reply at the pod's device: source becomes the ClusterIP",
			In:      toPod(pktest.TCP(remoteWeb, pod, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActOK, Out: toPod(pktest.TCP(webRemote, pod, pktest.SYN|pktest.ACK)).Bytes(),
		}},
		{pod: true, Case: pktest.Case{
			Name:    "the flow's next segment goes to the same backend",
			In:      fromPod(pktest.TCP(pod, webRemote, pktest.ACK).WithPayload([]byte("GET /"))).Bytes(),
			Verdict: pktest.TCActOK, Out: fromPod(pktest.TCP(pod, remoteWeb, pktest.ACK).WithPayload([]byte("GET /"))).Bytes(),
		}},
		{pod: true, Case: pktest.Case{
			Name: "a pod's packet to a pod, no Service: untouched", In: noSvc.Bytes(), Verdict: pktest.TCActUnspec,
		}},
		{pod: true, Case: pktest.Case{
			Name: "a ClusterIP without endpoints: ICMP port unreachable back to the pod", In: refused.Bytes(),
			Verdict: pktest.TCActRedirect, Out: unreachablePod(refused, noEPs.Addr(), pod.Addr()),
		}},
		{pod: true, Case: pktest.Case{
			Name:    "a pod to its own Service (hairpin): source NAT to its device's address, sent back to it",
			In:      fromPod(pktest.TCP(self, webLocal, pktest.SYN)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toPod(pktest.TCP(hairpinSrc, localWeb, pktest.SYN).WithTTL(63)).Bytes(),
			Setup: hairpin, Check: hairpinOK,
		}},
		{pod: true, Case: pktest.Case{
			Name:    "the hairpin's reply: from the ClusterIP, back to the pod",
			In:      fromPod(pktest.TCP(localWeb, hairpinSrc, pktest.SYN|pktest.ACK)).Bytes(),
			Verdict: pktest.TCActRedirect, Out: toPod(pktest.TCP(webLocal, self, pktest.SYN|pktest.ACK).WithTTL(63)).Bytes(),
		}},
	})
}

// unreachablePod is unreachable for a pod's packet in, back to the pod.
func unreachablePod(in pktest.Builder, from, to netip.Addr) []byte {
	return pktest.ICMPUnreachable(from, to, pktest.ICMPPortUnreachable, in.IPBytes()).
		WithMACs(podDevMAC, podMAC).WithID(0).WithTTL(64).Bytes()
}
