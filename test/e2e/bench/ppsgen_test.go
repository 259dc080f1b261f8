package bench

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// XDP verdicts (enum xdp_action).
const (
	xdpDrop = 1
	xdpPass = 2
	xdpTX   = 3
)

// xdpPassProgram loads an XDP program that returns XDP_PASS: on a veth it
// makes the device take frames its peer sends with XDP_TX, which it drops
// otherwise.
func xdpPassProgram() (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "pps_pass",
		Type:         ebpf.XDP,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("load the XDP_PASS program: %w", err)
	}
	return prog, nil
}

// frameSource sends copies of one frame at the rate the path takes them:
// an XDP program run by BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES
// (as xdp-trafficgen does) transmits each frame it returns XDP_TX for out
// of the device given as the frame's ingress device.
//
// The kernel initialises a frame's page once and recycles it: whatever the
// receiving stack wrote into it (a router's TTL, checksum and MAC rewrite)
// would be sent again. So the program writes the whole frame on every run,
// a store per 4 bytes, assembled from the frame itself.
//
// Some kernels refuse live frames to root (EPERM: seen on a 6.18 build of
// this workplace, where 6.1, 6.12 and other 6.18 builds take them). There
// the frames go out through an AF_PACKET socket bound to the device,
// bypassing its qdisc, a batch per sendmmsg: the kernel copies each into
// an skb of its own, a few times slower per frame than live frames, which
// the rows' bound (the bypass row) shows.
type frameSource struct {
	prog    *ebpf.Program
	frame   []byte
	ifindex int
	// probed is set once send has tried live frames; packet once the
	// kernel refused them, with why.
	probed, packet bool
	why            string
}

// via says how the frames are sent.
func (f *frameSource) via() string {
	if f.packet {
		return "an AF_PACKET socket (" + f.why + ")"
	}
	return "BPF_PROG_TEST_RUN live frames"
}

// newFrameSource loads the program that sends frame out of the device
// ifindex (of the namespace send runs in).
func newFrameSource(frame []byte, ifindex int) (*frameSource, error) {
	// r2 = data, r3 = data_end; a frame shorter than the template (never,
	// from BPF_PROG_TEST_RUN) is dropped.
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, int32(len(frame))),
		asm.JGT.Reg(asm.R4, asm.R3, "short"),
	}
	for off := 0; off < len(frame); {
		switch rest := len(frame) - off; {
		case rest >= 4:
			insns = append(insns, asm.StoreImm(asm.R2, int16(off), int64(int32(binary.LittleEndian.Uint32(frame[off:]))), asm.Word))
			off += 4
		case rest >= 2:
			insns = append(insns, asm.StoreImm(asm.R2, int16(off), int64(binary.LittleEndian.Uint16(frame[off:])), asm.Half))
			off += 2
		default:
			insns = append(insns, asm.StoreImm(asm.R2, int16(off), int64(frame[off]), asm.Byte))
			off++
		}
	}
	insns = append(insns,
		asm.Mov.Imm(asm.R0, xdpTX),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("short"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "pps_tx", Type: ebpf.XDP, License: "Dual BSD/GPL", Instructions: insns})
	if err != nil {
		return nil, fmt.Errorf("load the frame generator: %w", err)
	}
	return &frameSource{prog: prog, frame: frame, ifindex: ifindex}, nil
}

// Close unloads the program.
func (f *frameSource) Close() { f.prog.Close() }

// xdpMd mirrors the UAPI's struct xdp_md, BPF_PROG_TEST_RUN's context of an
// XDP program: data_end must be the frame's length, and ingress_ifindex is
// the device an XDP_TX frame leaves by.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// send transmits n frames in calls of at most ppsChunk, until n are sent
// or deadline has passed, and returns how many were sent. It runs on a
// thread in ns, where the device's ifindex is resolved.
func (f *frameSource) send(ns *sandbox.Netns, n uint64, deadline time.Time) (uint64, error) {
	if !f.probed {
		f.probed = true
		err := ns.Do(func() error {
			_, err := f.prog.Run(&ebpf.RunOptions{Data: f.frame, Repeat: 1, BatchSize: 1, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES,
				Context: xdpMd{DataEnd: uint32(len(f.frame)), IngressIfindex: uint32(f.ifindex)}})
			return err
		})
		switch {
		case errors.Is(err, unix.EPERM):
			f.packet, f.why = true, fmt.Sprintf("kernel %s refuses live frames: %v", kernelRelease(), err)
		case err != nil:
			return 0, fmt.Errorf("send a frame in netns %s: %w", ns.Name(), err)
		}
	}
	if f.packet {
		return f.sendPacket(ns, n, deadline)
	}
	var sent uint64
	err := ns.Do(func() error {
		for sent < n {
			chunk := min(n-sent, ppsChunk)
			if _, err := f.prog.Run(&ebpf.RunOptions{
				Data:      f.frame,
				Repeat:    uint32(chunk),
				BatchSize: ppsBatch,
				Flags:     unix.BPF_F_TEST_XDP_LIVE_FRAMES,
				Context:   xdpMd{DataEnd: uint32(len(f.frame)), IngressIfindex: uint32(f.ifindex)},
			}); err != nil {
				return fmt.Errorf("send %d frames in netns %s: %w", chunk, ns.Name(), err)
			}
			sent += chunk
			if time.Now().After(deadline) {
				break
			}
		}
		return nil
	})
	return sent, err
}

// mmsghdr is struct mmsghdr, sendmmsg's array element.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// sendPacket is send through an AF_PACKET socket bound to the device,
// past its qdisc: batches of ppsBatch frames per sendmmsg. A batch the
// device refuses (ENOBUFS: its peer's queue is full) is sent again once
// the other threads ran, so the frames sent are frames the device took.
func (f *frameSource) sendPacket(ns *sandbox.Netns, n uint64, deadline time.Time) (uint64, error) {
	var sent uint64
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
			return fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: f.ifindex}); err != nil {
			return fmt.Errorf("bind the AF_PACKET socket to ifindex %d: %w", f.ifindex, err)
		}
		iov := unix.Iovec{Base: &f.frame[0]}
		iov.SetLen(len(f.frame))
		msgs := make([]mmsghdr, ppsBatch)
		for i := range msgs {
			msgs[i].hdr.Iov = &iov
			msgs[i].hdr.SetIovlen(1)
		}
		for calls := 1; sent < n; calls++ {
			k := min(n-sent, uint64(len(msgs)))
			r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(k), 0, 0, 0)
			switch {
			case errno == unix.ENOBUFS || errno == unix.EAGAIN:
				runtime.Gosched()
			case errno != 0:
				return fmt.Errorf("sendmmsg of %d frames on ifindex %d: %w", k, f.ifindex, errno)
			default:
				sent += uint64(r)
			}
			if calls%256 == 0 && time.Now().After(deadline) {
				break
			}
		}
		runtime.KeepAlive(f.frame)
		runtime.KeepAlive(&iov)
		return nil
	})
	return sent, err
}

// passOnPeer attaches pass, the XDP_PASS program, in native mode to the router's
// end of h's veth (h's eth0), so that the router receives the frames sent
// to it with XDP_TX. Closing the link detaches it.
func passOnPeer(pass *ebpf.Program, router, h *sandbox.Host) (link.Link, error) {
	_, peer, err := routerPeer(router, h)
	if err != nil {
		return nil, err
	}
	var l link.Link
	err = router.NS.Do(func() error {
		var err error
		l, err = link.AttachXDP(link.XDPOptions{Program: pass, Interface: peer, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("attach XDP_PASS to the router's veth towards %s: %w", h.Name, err)
	}
	return l, nil
}

// routerPeer returns the ifindex of h's eth0 in h's namespace and that of
// its veth peer in the router's.
func routerPeer(router, h *sandbox.Host) (own, peer int, err error) {
	l, err := h.NS.Netlink().LinkByName(sandbox.IfaceName)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", h.Name, err)
	}
	p, err := router.NS.Netlink().LinkByIndex(l.Attrs().ParentIndex)
	if err != nil || p.Type() != "veth" {
		return 0, 0, fmt.Errorf("%s: the peer of %s (ifindex %d) in the router: %v %v", h.Name, sandbox.IfaceName,
			l.Attrs().ParentIndex, p, err)
	}
	return l.Attrs().Index, p.Attrs().Index, nil
}

// clientFrame builds the UDP frame the client h sends to dst through the
// router: from h's eth0 to the router's bridge, whose address it carries.
// It returns the frame and the ifindex of h's eth0.
func clientFrame(router, h *sandbox.Host, dst netip.AddrPort) ([]byte, int, error) {
	own, peer, err := routerPeer(router, h)
	if err != nil {
		return nil, 0, err
	}
	src, err := h.NS.Netlink().LinkByIndex(own)
	if err != nil {
		return nil, 0, err
	}
	nl := router.NS.Netlink()
	p, err := nl.LinkByIndex(peer)
	if err != nil {
		return nil, 0, err
	}
	br, err := nl.LinkByIndex(p.Attrs().MasterIndex)
	if err != nil {
		return nil, 0, fmt.Errorf("the router's bridge towards %s: %w", h.Name, err)
	}
	frame := pktest.UDP(netip.AddrPortFrom(h.IP, ppsSourcePort), dst).
		WithMACs(src.Attrs().HardwareAddr, br.Attrs().HardwareAddr).WithPayload(ppsPayload).Bytes()
	return frame, own, nil
}

// udpSink is a UDP socket in a pod that nobody reads while frames are
// counted: it keeps the pod from answering with ICMP errors, and what it
// queued is checked afterwards.
type udpSink struct{ fd int }

var errNothingReceived = errors.New("nothing received")

// openUDPSink binds a non-blocking UDP socket to port in h's namespace.
func openUDPSink(h *sandbox.Host, port uint16) (*udpSink, error) {
	s := &udpSink{fd: -1}
	err := h.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
			unix.Close(fd)
			return err
		}
		s.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("UDP socket on port %d in %s: %w", port, h.Name, err)
	}
	return s, nil
}

// receive reads one datagram, which must hold want, and returns its
// source; errNothingReceived if none is queued.
func (s *udpSink) receive(want []byte) (netip.AddrPort, error) {
	buf := make([]byte, 2048)
	for {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return netip.AddrPort{}, errNothingReceived
		case err != nil:
			return netip.AddrPort{}, fmt.Errorf("receive: %w", err)
		}
		sa, ok := from.(*unix.SockaddrInet4)
		if !ok {
			return netip.AddrPort{}, fmt.Errorf("received from %v", from)
		}
		src := netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
		if !bytes.Equal(buf[:n], want) {
			return src, fmt.Errorf("received %q from %s, want %q", buf[:n], src, want)
		}
		return src, nil
	}
}

// drain reads every queued datagram; each must hold want.
func (s *udpSink) drain(want []byte) error {
	for {
		_, err := s.receive(want)
		if errors.Is(err, errNothingReceived) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Close closes the socket.
func (s *udpSink) Close() {
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// snmpCounters are a namespace's IP and UDP counters (/proc/net/snmp).
type snmpCounters struct {
	ip, udp map[string]uint64
}

// delivered counts the packets the namespace's IP layer handed to a
// transport protocol: in a pod that only the generator's flow reaches, the
// frames that arrived, whether its socket had room for them or not.
func (c snmpCounters) delivered() uint64 { return c.ip["InDelivers"] }

// readSNMP reads h's counters: /proc/thread-self/net is the namespace of
// the reading thread (/proc/net would be the process's).
func readSNMP(h *sandbox.Host) (snmpCounters, error) {
	var data []byte
	err := h.NS.Do(func() error {
		var err error
		data, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return snmpCounters{}, fmt.Errorf("read the counters of %s: %w", h.Name, err)
	}
	c, err := parseSNMP(data)
	if err != nil {
		return c, fmt.Errorf("the counters of %s: %w", h.Name, err)
	}
	return c, nil
}

// parseSNMP parses /proc/net/snmp's pairs of lines, "Proto: names..." then
// "Proto: values...", keeping Ip and Udp.
func parseSNMP(data []byte) (snmpCounters, error) {
	c := snmpCounters{ip: map[string]uint64{}, udp: map[string]uint64{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	var header []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if header == nil || header[0] != f[0] {
			header = f
			continue
		}
		var into map[string]uint64
		switch f[0] {
		case "Ip:":
			into = c.ip
		case "Udp:":
			into = c.udp
		}
		if into != nil {
			if len(f) != len(header) {
				return c, fmt.Errorf("%s %d names, %d values", f[0], len(header), len(f))
			}
			for i := 1; i < len(f); i++ {
				// Some counters are signed (Ip: Forwarding, DefaultTTL).
				v, err := strconv.ParseInt(f[i], 10, 64)
				if err != nil {
					return c, fmt.Errorf("%s %s=%q: %w", f[0], header[i], f[i], err)
				}
				into[header[i]] = uint64(v)
			}
		}
		header = nil
	}
	if _, ok := c.ip["InDelivers"]; !ok {
		return c, errors.New("no Ip InDelivers")
	}
	return c, sc.Err()
}

// waitStable reads h's counters until frames stop arriving (two reads 50 ms
// apart agree) or bound has passed, and returns the last read.
func waitStable(h *sandbox.Host, bound time.Duration) (snmpCounters, error) {
	deadline := time.Now().Add(bound)
	last, err := readSNMP(h)
	if err != nil {
		return last, err
	}
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		c, err := readSNMP(h)
		if err != nil {
			return c, err
		}
		if c.delivered() == last.delivered() {
			return c, nil
		}
		last = c
	}
	return last, nil
}
