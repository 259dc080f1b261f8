package bench

import (
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// TestFrameSourceThroughARouter: frames from the generator reach a host
// behind the sandbox's router, which forwards them (rewriting TTL, checksum
// and MACs in the frame's page), nearly all of them and intact. Before the
// program wrote every frame afresh, the kernel re-sent its recycled pages
// with the router's rewrite in them, and the router's bridge dropped all
// but about one frame in a thousand. On a kernel that refuses live frames,
// the AF_PACKET socket that replaces them is what is checked.
func TestFrameSourceThroughARouter(t *testing.T) {
	sb := sandbox.ForTest(t)
	node, err := sb.AddNode("node")
	if err != nil {
		t.Fatal(err)
	}
	ext, err := sb.AddExternalClient("ext", netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	pass, err := xdpPassProgram()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pass.Close() })
	l, err := passOnPeer(pass, sb.Router, ext.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	const port = 9999
	sink, err := openUDPSink(node.Host, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Close)
	frame, ifindex, err := clientFrame(sb.Router, ext.Host, netip.AddrPortFrom(node.IP, port))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := newFrameSource(frame, ifindex)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gen.Close)

	// The router resolves the node's address on the first frames.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := gen.send(ext.NS, 4, deadline); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		from, err := sink.receive(ppsPayload)
		if err == nil {
			if from != netip.AddrPortFrom(ext.IP, ppsSourcePort) {
				t.Fatalf("the node received the frame from %s, want %s", from, netip.AddrPortFrom(ext.IP, ppsSourcePort))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no frame reached the node: %v", err)
		}
	}
	t.Logf("frames sent by %s", gen.via())
	before, err := readSNMP(node.Host)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20_000
	sent, err := gen.send(ext.NS, n, time.Now().Add(time.Minute))
	if err != nil || sent != n {
		t.Fatalf("sent %d of %d frames: %v", sent, n, err)
	}
	after, err := waitStable(node.Host, ppsDrainBound)
	if err != nil {
		t.Fatal(err)
	}
	// A busy machine may lose a few from the veths' queues.
	if got := after.delivered() - before.delivered(); got < n*9/10 {
		t.Errorf("the node received %d of %d frames", got, n)
	}
	if err := sink.drain(ppsPayload); err != nil {
		t.Error(err)
	}
}

func TestParseSNMP(t *testing.T) {
	const sample = `Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates OutTransmits
Ip: 2 64 272 0 0 0 0 0 272 0 0 0 0 0 0 0 0 0 0 0
Icmp: InMsgs InErrors InCsumErrors
Icmp: 0 0 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 50 0 172 0 172 0 0 0 0
`
	c, err := parseSNMP([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if c.delivered() != 272 || c.ip["Forwarding"] != 2 || c.udp["RcvbufErrors"] != 172 || c.udp["InDatagrams"] != 50 {
		t.Errorf("parsed %+v", c)
	}
	if _, err := parseSNMP([]byte("Ip: InReceives InDelivers\nIp: 1\n")); err == nil {
		t.Error("a line of values shorter than its names was accepted")
	}
	if _, err := parseSNMP([]byte("Udp: InDatagrams\nUdp: 1\n")); err == nil {
		t.Error("counters without Ip InDelivers were accepted")
	}
}
