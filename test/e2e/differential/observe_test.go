package differential

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// Attempts per probe: a few first, so that a failing destination (each
// DROP costs the attempt timeout) is told quickly; then enough more that
// every endpoint of up to four shows up (4·(3/4)^48 < 1e-5).
const (
	firstAttempts = 3
	moreAttempts  = 45
	// A TCP attempt outlasts two SYN retransmissions (at 1 s and 3 s).
	// An ICMPv6 error that answers the first SYN on these veth links comes
	// back while connect() still holds the socket's lock, and the kernel
	// keeps it only as a soft error (TcpExtLockDroppedIcmps): the attempt
	// fails when the retransmitted SYN is answered, about 1 s later. With a
	// bound of 2 s, a machine busy with the whole of make test now and then
	// delayed that second answer past the bound and an UNREACHABLE probe
	// read "DROP + UNREACHABLE" (IPv6 only: the IPv4 error fails the
	// attempt at once). A DROP is not told sooner than the bound.
	tcpAttemptTimeout = 3500 * time.Millisecond
	// A UDP attempt fails at once on a refusal; no answer within the bound
	// means a DROP.
	udpAttemptTimeout = 2 * time.Second
)

// Bounds of the barrier's wait; a proxy programs a Service within seconds
// even on a busy machine.
const (
	barrierPolls    = 600
	barrierInterval = 100 * time.Millisecond
)

// client returns the testbed client called name.
func (w *world) client(name string) (*sandbox.Client, error) {
	for _, n := range w.tb.Nodes {
		switch name {
		case n.Spec.Name:
			return n.Self, nil
		case n.Client.Name:
			return n.Client, nil
		}
	}
	for _, e := range w.tb.External {
		if e.Name == name {
			return e, nil
		}
	}
	if podName, ok := strings.CutPrefix(name, "pod:"); ok {
		if p, _ := w.tb.Pod(podName); p != nil {
			return w.tb.PodClient(p)
		}
	}
	return nil, fmt.Errorf("no client %q", name)
}

// dest resolves a probe's destination to an address.
func (w *world) dest(ctx context.Context, sc int, d Dest) (netip.AddrPort, error) {
	ipv6 := scenarios[sc].IPv6 || d.IPv6
	switch d.Kind {
	case ClusterIP:
		ip, err := w.clusterIPOf(sc, d.Service, ipv6)
		return netip.AddrPortFrom(ip, uint16(d.Port)), err
	case NodePort:
		n := w.tb.Node(d.Node)
		if n == nil {
			return netip.AddrPort{}, fmt.Errorf("no node %s", d.Node)
		}
		p, err := w.nodePort(sc, d.Service, d.Port)
		return netip.AddrPortFrom(addrOf(n.Host, ipv6), uint16(p)), err
	case LocalhostNodePort:
		p, err := w.nodePort(sc, d.Service, d.Port)
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(p)), err
	case VIP:
		ip, err := w.vip(sc, d.Name)
		return netip.AddrPortFrom(ip, uint16(d.Port)), err
	case PodIP:
		p, _ := w.tb.Pod(d.Name)
		if p == nil {
			return netip.AddrPort{}, fmt.Errorf("no pod %s", d.Name)
		}
		return netip.AddrPortFrom(addrOf(p.Host, ipv6), uint16(d.Port)), nil
	case HealthCheck:
		n := w.tb.Node(d.Node)
		if n == nil {
			return netip.AddrPort{}, fmt.Errorf("no node %s", d.Node)
		}
		svc, err := w.cs.CoreV1().Services(w.ns).Get(ctx, prefix(sc)+d.Service, metav1.GetOptions{})
		if err != nil {
			return netip.AddrPort{}, err
		}
		if svc.Spec.HealthCheckNodePort == 0 {
			return netip.AddrPort{}, fmt.Errorf("service %s has no healthCheckNodePort", svc.Name)
		}
		return netip.AddrPortFrom(addrOf(n.Host, ipv6), uint16(svc.Spec.HealthCheckNodePort)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("unknown destination kind %d", d.Kind)
}

// failure names what a failed attempt's errno means to the client.
func failure(errName string) string {
	switch errName {
	case "ECONNREFUSED":
		return "REJECT"
	case "ETIMEDOUT":
		// kube-proxy's DROP makes the client wait; ebpf-proxy's socket
		// programs fail connect() at once with the same errno.
		return "DROP"
	case "ENETUNREACH", "EHOSTUNREACH", "EACCES":
		// Nothing translated the destination: it left the node, and the
		// network refused it (the testbed's router refuses the Service
		// range).
		return "UNREACHABLE"
	case "ECONNRESET", "EOF":
		return "RESET"
	}
	return "ERROR " + errName
}

// tally sums up the attempts of one probe.
type tally struct {
	reached  map[string]int // "<server> sees <client address>"
	servers  map[string]int
	failures map[string]int
	notes    map[string]int
	http     map[string]int
	// failed describes each failed attempt (errno, how far it got, how
	// long it took), for the log of a probe whose attempts did not all
	// agree.
	failed []string
}

// fail records a failed attempt: its errno's verdict, and detail for the
// log.
func (t *tally) fail(errName, detail string) {
	t.failures[failure(errName)]++
	t.failed = append(t.failed, errName+": "+detail)
}

func newTally() *tally {
	return &tally{reached: map[string]int{}, servers: map[string]int{}, failures: map[string]int{},
		notes: map[string]int{}, http: map[string]int{}}
}

func (t *tally) answered(w *world, c *sandbox.Client, server string, seen netip.Addr) {
	who := w.tb.AddressName(seen)
	if seen == c.IP || seen == c.IP6 {
		who = "client"
	}
	t.reached[server+" sees "+who]++
	t.servers[server]++
}

// addTCP records a TCP attempt to dst. Besides the answer, the socket must
// show dst as its peer, as a client that called getpeername() expects.
func (t *tally) addTCP(w *world, c *sandbox.Client, dst netip.AddrPort, r sandbox.TCPResult) {
	if r.Err != "" {
		how := "connect() failed"
		if r.Connected {
			how = "connected from " + r.Local.String() + ", then no answer"
		}
		t.fail(r.Err, fmt.Sprintf("%s, connect() took %v", how, r.Elapsed.Round(time.Millisecond)))
		return
	}
	t.answered(w, c, r.Server, r.ClientSeen.Addr())
	if r.Peer != dst {
		t.notes["getpeername "+r.Peer.String()]++
	}
}

// addUDP records a connected UDP attempt: the reply must come from dst.
func (t *tally) addUDP(w *world, c *sandbox.Client, dst netip.AddrPort, r sandbox.UDPResult) {
	if r.Err != "" {
		t.fail(r.Err, fmt.Sprintf("sent from %s, no reply in %v", r.Local, r.Elapsed.Round(time.Millisecond)))
		return
	}
	t.answered(w, c, r.Server, r.ClientSeen.Addr())
	if r.Peer != dst {
		t.notes["getpeername "+r.Peer.String()]++
	}
	if r.From != dst {
		t.notes["reply from "+r.From.String()]++
	}
}

func (t *tally) addHTTP(r sandbox.HTTPResult) {
	if r.Status != 0 {
		v := fmt.Sprintf("HTTP %d", r.Status)
		if r.Weight != "" {
			// The health check's local endpoint count, which load
			// balancers use as the node's weight.
			v += " weight " + r.Weight
		}
		t.http[v]++
		return
	}
	t.failures[failure(r.Err)]++
}

func (t *tally) anyAnswer() bool { return len(t.reached) > 0 || len(t.http) > 0 }

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// verdict renders the tally without counts, so that two proxies that
// behave alike render alike whatever their random choices.
func (t *tally) verdict(sticky bool) string {
	var parts []string
	switch {
	case sticky && len(t.servers) == 1:
		parts = append(parts, "STICKY to one endpoint")
	case len(t.reached) > 0:
		parts = append(parts, "{"+strings.Join(sortedKeys(t.reached), ", ")+"}")
	}
	parts = append(parts, sortedKeys(t.http)...)
	parts = append(parts, sortedKeys(t.failures)...)
	for _, n := range sortedKeys(t.notes) {
		parts = append(parts, "["+n+"]")
	}
	if len(parts) == 0 {
		return "NO RESULT"
	}
	return strings.Join(parts, " + ")
}

// observe runs probe p of scenario sc and returns what it met.
func (w *world) observe(ctx context.Context, sc int, p Probe) (outcome, error) {
	c, err := w.client(p.From)
	if err != nil {
		return outcome{}, err
	}
	if p.Proto == udp {
		c = c.WithTimeout(udpAttemptTimeout)
	} else {
		c = c.WithTimeout(tcpAttemptTimeout)
	}
	if p.Hold != "" {
		return final(w.observeHeld(ctx, c, sc, p))
	}
	dst, err := w.dest(ctx, sc, p.To)
	if err != nil {
		return outcome{}, err
	}
	if p.Then != nil {
		return final(w.observeReconnected(ctx, c, sc, dst, *p.Then))
	}
	t := newTally()
	var meshBefore, meshFailed int
	if p.Mesh {
		w.meshMu.Lock()
		defer w.meshMu.Unlock()
		meshBefore, meshFailed = len(w.mesh.Originals()), len(w.mesh.Failures())
	}
	run := func(n int) error {
		switch {
		case p.To.Kind == HealthCheck:
			rep, err := c.HTTP(ctx, dst, "/", n)
			if err != nil {
				return err
			}
			for _, r := range rep.Results {
				t.addHTTP(r)
			}
		case p.Proto == udp:
			rep, err := c.UDPConnected(ctx, dst, n)
			if err != nil {
				return err
			}
			for _, r := range rep.Results {
				t.addUDP(w, c, dst, r)
			}
		default:
			// TCP, or SCTP: associations are tallied as connections.
			probe := c.TCP
			if p.Proto == sctp {
				probe = c.SCTP
			}
			rep, err := probe(ctx, dst, n)
			if err != nil {
				return err
			}
			for _, r := range rep.Results {
				t.addTCP(w, c, dst, r)
			}
		}
		return nil
	}
	if err := run(firstAttempts); err != nil {
		return outcome{}, err
	}
	if t.anyAnswer() && p.To.Kind != HealthCheck {
		if err := run(moreAttempts); err != nil {
			return outcome{}, err
		}
	}
	if p.Mesh {
		w.meshNotes(t, meshBefore, meshFailed, dst)
	}
	return outcome{t: t, sticky: p.Sticky, dst: dst}, nil
}

// outcome is what a probe met: a tally, rendered once the wave's probes
// are over, or a verdict that is final (a held connection's, a
// reconnected socket's).
type outcome struct {
	t      *tally
	sticky bool
	dst    netip.AddrPort
	// final and finalMixed are the verdict and log line of a probe
	// without a tally.
	final, finalMixed string
}

func final(verdict, mixed string, err error) (outcome, error) {
	return outcome{final: verdict, finalMixed: mixed}, err
}

// verdict renders the outcome and, when some attempts were answered and
// others failed, what the failed ones met (the log's clue to an
// intermittent loss; the verdict has no room for it, as it must render
// alike for both proxies).
func (o outcome) verdict() (string, string) {
	if o.t == nil {
		return o.final, o.finalMixed
	}
	mixed := ""
	if failed := o.t.failed; o.t.anyAnswer() && len(failed) > 0 {
		mixed = fmt.Sprintf("%d attempt(s) to %s failed: %s", len(failed), o.dst, strings.Join(failed, "; "))
	}
	return o.t.verdict(o.sticky), mixed
}

// meshNotes adds to t what the meshed pod's sidecar was told of the
// connections of a probe to dst (after the first before ones): "the
// destination", an address of the testbed by name, or nothing; and whether
// it failed to serve some (after the first failed failures).
func (w *world) meshNotes(t *tally, before, failed int, dst netip.AddrPort) {
	all := w.mesh.Originals()
	told := map[string]bool{}
	for _, o := range all[before:] {
		switch {
		case o == dst:
			told["the destination"] = true
		default:
			told[fmt.Sprintf("%s:%d", w.tb.AddressName(o.Addr()), o.Port())] = true
		}
	}
	if len(told) == 0 {
		told["nothing"] = true
	}
	for k := range told {
		t.notes["proxy told "+k]++
	}
	if errs := w.mesh.Failures(); len(errs) > failed {
		t.notes["proxy failed"]++
		t.failed = append(t.failed, "proxy: "+errs[failed].Error())
	}
}

// observeReconnected runs a UDP probe whose socket exchanges a datagram
// with dst, is connected to then, and exchanges another (Probe.Then).
func (w *world) observeReconnected(ctx context.Context, c *sandbox.Client, sc int, dst netip.AddrPort, then Dest) (string, string, error) {
	next, err := w.dest(ctx, sc, then)
	if err != nil {
		return "", "", err
	}
	rep, err := c.UDPReconnects(ctx, []netip.AddrPort{dst, next})
	if err != nil {
		return "", "", err
	}
	if len(rep.Results) != 2 {
		return "", "", fmt.Errorf("udp reconnects to %s, %s: %d results", dst, next, len(rep.Results))
	}
	first, second := newTally(), newTally()
	first.addUDP(w, c, dst, rep.Results[0])
	second.addUDP(w, c, next, rep.Results[1])
	return first.verdict(false) + " THEN " + second.verdict(false), "", nil
}

// waitReachable polls dst from c until a server answers.
func waitReachable(ctx context.Context, c *sandbox.Client, dst netip.AddrPort) error {
	c = c.WithTimeout(500 * time.Millisecond)
	var last string
	for range barrierPolls {
		rep, err := c.TCP(ctx, dst, 1)
		if err != nil {
			return err
		}
		if r := rep.Results[0]; r.Err == "" {
			return nil
		} else {
			last = r.Err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(barrierInterval):
		}
	}
	return fmt.Errorf("%s not reachable after %d attempts (last error %s)", dst, barrierPolls, last)
}

// observeHeld runs a probe of a held connection: the first of its name
// opens it, with the verdict of a single TCP attempt prefixed "HELD"; a
// later one sends a line on it and reads its peer: "ALIVE", noting a peer
// that is not the address the connection was made to, or "BROKEN".
func (w *world) observeHeld(ctx context.Context, c *sandbox.Client, sc int, p Probe) (string, string, error) {
	key := fmt.Sprintf("%d/%s", sc, p.Hold)
	w.mu.Lock()
	hc := w.held[key]
	w.mu.Unlock()
	if p.Proto == udp {
		return w.observeHeldFlow(ctx, c, sc, key, hc, p)
	}
	if hc == nil {
		dst, err := w.dest(ctx, sc, p.To)
		if err != nil {
			return "", "", err
		}
		h, err := c.Hold(ctx, dst)
		if err != nil {
			return "", "", err
		}
		w.mu.Lock()
		w.held[key] = &heldConn{h: h, dst: dst}
		w.mu.Unlock()
		t := newTally()
		t.addTCP(w, c, dst, h.First)
		return "HELD " + t.verdict(false), "", nil
	}
	peer, err := hc.h.Peer()
	if err != nil {
		return "BROKEN", fmt.Sprintf("held connection to %s: %v", hc.dst, err), nil
	}
	if peer != hc.dst {
		return fmt.Sprintf("ALIVE + [getpeername %s:%d]", w.tb.AddressName(peer.Addr().Unmap()), peer.Port()), "", nil
	}
	return "ALIVE", "", nil
}

// observeHeldFlow runs a probe of a held UDP flow: the first of its name
// sends a datagram from a port of the kernel's choice, with the verdict
// of that attempt prefixed "HELD"; a later one sends another from that
// port to the same address, with the verdict of that attempt: the backend
// that answered, or the error, such as the rejection of a Service that
// lost its endpoints, which only a conntrack entry removed in time lets
// the flow meet.
func (w *world) observeHeldFlow(ctx context.Context, c *sandbox.Client, sc int, key string, hc *heldConn, p Probe) (string, string, error) {
	first := hc == nil
	var dst netip.AddrPort
	var port uint16
	if first {
		d, err := w.dest(ctx, sc, p.To)
		if err != nil {
			return "", "", err
		}
		dst = d
	} else {
		if !hc.local.IsValid() {
			return "BROKEN", fmt.Sprintf("held flow to %s never had a source port", hc.dst), nil
		}
		dst, port = hc.dst, hc.local.Port()
	}
	r, err := c.UDPFrom(ctx, dst, port)
	if err != nil {
		return "", "", err
	}
	t := newTally()
	t.addUDP(w, c, dst, r)
	if !first {
		return t.verdict(false), "", nil
	}
	held := &heldConn{dst: dst}
	if r.Local.Port() != 0 {
		held.local = r.Local
	}
	w.mu.Lock()
	w.held[key] = held
	w.mu.Unlock()
	return "HELD " + t.verdict(false), "", nil
}
