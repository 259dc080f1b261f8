package differential

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// The BPF mode's per-packet translation of pods (--socket-lb-scope=node,
// and pods opted out of the socket hooks) tracks a pod's flow to a backend
// by the backend's reply tuple. A pod's kernel may give one source port to
// two connections at once when their destinations differ: two frontends
// that share a backend then make one reply tuple, and the newer flow's
// entry takes the older's replies, which reach the client as the newer's.
// kube-proxy's netfilter gives the newer flow another source port instead
// (NAT clash resolution). docs/architecture/differences.md says so; the
// scenarios' probes, many at once from one pod to Services that share the
// testbed's pods, meet it now and then.
//
// resolveClashes takes such losses out of the verdicts, and says so: a
// failed attempt is a clash's when it had connected, and another attempt
// connected from the same address and port to another destination while
// it ran.

// attempt is a TCP or SCTP attempt that connected, from local to dst,
// with when it ran; failure is its index in t.failed when it failed, else
// -1.
type attempt struct {
	local   netip.AddrPort
	dst     netip.AddrPort
	start   time.Time
	done    time.Time
	t       *tally
	failure int
}

// overlaps says whether a and b ran at the same time.
func (a attempt) overlaps(b attempt) bool {
	return a.start.Before(b.done) && b.start.Before(a.done)
}

// findClashes returns, for each failed attempt of attempts that another
// one clashed with, a description of the pair, and clears the failure in
// its tally.
func findClashes(attempts []attempt) []string {
	var found []string
	for i, a := range attempts {
		if a.failure < 0 {
			continue
		}
		for j, b := range attempts {
			if i == j || b.local != a.local || b.dst == a.dst || !a.overlaps(b) {
				continue
			}
			a.t.clear(a.failure)
			found = append(found, fmt.Sprintf("from %s to %s (%s to %s), while another connection from the same port to %s ran (%s to %s)",
				a.local, a.dst, a.start.Format("15:04:05.000"), a.done.Format("15:04:05.000"), b.dst,
				b.start.Format("15:04:05.000"), b.done.Format("15:04:05.000")))
			break
		}
	}
	return found
}

// resolveClashes clears the wave's failures that clashes explain, in the
// BPF modes (upstream's netfilter resolves clashes: nothing of it is
// cleared), and forgets the wave's attempts.
func (w *world) resolveClashes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	attempts := w.attempts
	w.attempts = nil
	if w.kind != testbed.EbpfProxy && w.kind != testbed.EbpfProxyPods {
		return nil
	}
	found := findClashes(attempts)
	w.clashes = append(w.clashes, found...)
	return found
}

func TestClashesAreSameSourceAtOnceToAnotherDestination(t *testing.T) {
	at := func(ms int) time.Time { return time.Date(2026, 12, 7, 20, 0, 0, ms*int(time.Millisecond), time.UTC) }
	p := netip.MustParseAddrPort
	client, other := p("10.244.1.13:57236"), p("10.244.1.13:40000")
	vip1, vip2 := p("10.96.1.1:80"), p("10.96.1.2:80")
	for _, c := range []struct {
		name    string
		partner attempt
		cleared bool
	}{
		{"another destination while it ran", attempt{local: client, dst: vip2, start: at(5), done: at(9), failure: -1}, true},
		{"the same destination", attempt{local: client, dst: vip1, start: at(5), done: at(9), failure: -1}, false},
		{"another source port", attempt{local: other, dst: vip2, start: at(5), done: at(9), failure: -1}, false},
		{"before it began", attempt{local: client, dst: vip2, start: at(0), done: at(2), failure: -1}, false},
		{"after it ended", attempt{local: client, dst: vip2, start: at(3600), done: at(3700), failure: -1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tl := newTally()
			tl.reached["a1:8080 sees client"]++
			tl.fail("ETIMEDOUT", "connected from "+client.String()+", then no answer")
			failed := attempt{local: client, dst: vip1, start: at(3), done: at(3503), t: tl, failure: 0}
			c.partner.t = newTally()
			found := findClashes([]attempt{failed, c.partner})
			if got := len(found) == 1 && tl.failed[0].cleared; got != c.cleared {
				t.Errorf("cleared %v (found %v), want %v", got, found, c.cleared)
			}
			want := "{a1:8080 sees client} + DROP"
			if c.cleared {
				want = "{a1:8080 sees client}"
			}
			if v := tl.verdict(false); v != want {
				t.Errorf("verdict %q, want %q", v, want)
			}
		})
	}
}
