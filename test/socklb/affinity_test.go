package socklb_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func clientIP(timeout int32) func(*v1.Service) {
	return func(svc *v1.Service) {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
	}
}

func (e *env) setWebAffinity(timeout int32, eps ...ep) {
	opts := []func(*v1.Service){}
	if timeout > 0 {
		opts = append(opts, clientIP(timeout))
	}
	e.setService(makeService("web", webVIP.Addr().String(), int32(webVIP.Port()), v1.ProtocolTCP, intstr.FromString("http"), opts...))
	e.setSlice(makeSlice("web", "web-1", tcpPort, v1.ProtocolTCP, eps...))
	e.sync()
}

// servers returns which pods answered n connections from c.
func (e *env) servers(c *sandbox.Client, n int) map[string]int {
	e.t.Helper()
	rep, err := c.TCP(e.ctx(), webVIP, n)
	if err != nil {
		e.t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range rep.Results {
		if r.Err != "" {
			e.t.Fatalf("connection failed: %+v", r)
		}
		got[r.Server]++
	}
	return got
}

func only(m map[string]int) (string, bool) {
	if len(m) != 1 {
		return "", false
	}
	for k := range m {
		return k, true
	}
	return "", false
}

func TestSessionAffinityKeepsAClientOnOneBackend(t *testing.T) {
	e := newEnv(t, 3)
	e.setWebAffinity(3600, e.podEPs(0, 1, 2)...)

	got := e.servers(e.client, 100)
	first, ok := only(got)
	if !ok {
		t.Fatalf("100 connections from one client with ClientIP affinity reached %v, want one backend", got)
	}

	t.Run("each pod is its own client", func(t *testing.T) {
		// Ten more client pods on the same node: each sticks to one backend
		// of its own; were they glued together (one key for the node), all
		// would share the first client's. All ten choosing the same backend
		// by chance has probability 3^-9.
		chosen := map[string]bool{first: true}
		for i := range 10 {
			c, err := e.sb.AddClient(e.node, fmt.Sprintf("client-%d", i), netip.Addr{})
			if err != nil {
				t.Fatal(err)
			}
			got := e.servers(c, 10)
			b, ok := only(got)
			if !ok {
				t.Fatalf("client-%d reached %v, want one backend", i, got)
			}
			chosen[b] = true
		}
		if len(chosen) < 2 {
			t.Errorf("eleven clients all on %v: affinity is not per client", chosen)
		}
	})

	t.Run("the chosen backend going away ends the affinity", func(t *testing.T) {
		var rest []ep
		for i, p := range e.pods {
			if p.Name != first {
				rest = append(rest, e.podEPs(i)...)
			}
		}
		e.setWebAffinity(3600, rest...)
		got := e.servers(e.client, 30)
		b, ok := only(got)
		if !ok || b == first {
			t.Errorf("after %s was removed: %v, want one other backend", first, got)
		}
	})

	t.Run("affinity switched off spreads again", func(t *testing.T) {
		e.setWebAffinity(0, e.podEPs(0, 1, 2)...)
		if got := e.servers(e.client, 60); len(got) != 3 {
			t.Errorf("without affinity 60 connections reached %v, want all three backends", got)
		}
		e.setWebAffinity(3600, e.podEPs(0, 1, 2)...)
		if got := e.servers(e.client, 30); len(got) != 1 {
			t.Errorf("affinity switched back on: %v, want one backend", got)
		}
	})
}

func TestSessionAffinityTimesOutFromLastUse(t *testing.T) {
	e := newEnv(t, 3)
	const timeout = 4
	e.setWebAffinity(timeout, e.podEPs(0, 1, 2)...)

	last := time.Now()
	first, ok := only(e.servers(e.client, 5))
	if !ok {
		t.Fatal("no single backend")
	}
	// Used every second, the entry never ages past its timeout. A use
	// proves it only if it came within the timeout of the one before:
	// the time from the start of the previous probe to the end of this
	// one bounds that gap. An emulated, busy machine may take longer;
	// such a use proves nothing, and the client may have moved on.
	conclusive := 0
	for i := 0; conclusive < 4; i++ {
		if i == 12 {
			t.Fatalf("only %d of 12 uses came within %d s of the one before: the machine is too slow to tell", conclusive, timeout)
		}
		time.Sleep(time.Second)
		start := time.Now()
		b, ok := only(e.servers(e.client, 1))
		if !ok {
			t.Fatal("one connection reached no single backend")
		}
		if gap := time.Since(last); gap >= timeout*time.Second {
			t.Logf("use %d came up to %s after the one before: inconclusive", i, gap.Round(time.Millisecond))
			first, last = b, start
			continue
		}
		last = start
		if b != first {
			t.Fatalf("within the timeout of the last use, went to %s instead of %s", b, first)
		}
		conclusive++
	}
	stale := e.counters()["affinity_stale"]
	time.Sleep(timeout*time.Second + 500*time.Millisecond)
	if _, ok := only(e.servers(e.client, 5)); !ok {
		t.Fatal("after the timeout the new choice does not stick")
	}
	if got := e.counters()["affinity_stale"]; got != stale+1 {
		t.Errorf("affinity_stale went from %d to %d after the timeout, want one expired entry", stale, got)
	}
}
