package pktest_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/pktest"
)

// recorder is a testing.TB that records failures instead of failing, so
// that the runner's own failures can be checked.
type recorder struct {
	testing.TB
	msgs []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Error(args ...any)         { r.msgs = append(r.msgs, fmt.Sprint(args...)) }
func (r *recorder) Errorf(f string, a ...any) { r.msgs = append(r.msgs, fmt.Sprintf(f, a...)) }
func (r *recorder) Fatal(args ...any)         { r.Error(args...); runtime.Goexit() }
func (r *recorder) Fatalf(f string, a ...any) {
	r.Errorf(f, a...)
	runtime.Goexit()
}

// runRecorded runs one case with failures recorded, as testing does: on a
// goroutine that Fatal ends.
func runRecorded(t *testing.T, c pktest.Case, run func(testing.TB, pktest.Case)) []string {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(r, c)
	}()
	<-done
	return r.msgs
}

// TestRunReportsFailures proves that the runner fails where it must, with
// messages that say what went wrong: wrong verdicts, wrong output, wrong
// checksums from a buggy program, and broken tables.
func TestRunReportsFailures(t *testing.T) {
	objs := loadSample(t, sampleOptions{})
	buggy := loadSample(t, sampleOptions{bugSkipL4Csum: true})
	udp := pktest.UDP(client, frontend).WithPayload([]byte("query"))
	reset := func(tb testing.TB) { resetSample(tb, objs) }
	resetBuggy := func(tb testing.TB) { resetSample(tb, buggy) }
	xdp := func(tb testing.TB, c pktest.Case) { pktest.RunCase(tb, objs.PktestSampleXdp, c) }
	tc := func(tb testing.TB, c pktest.Case) { pktest.RunCase(tb, objs.PktestSampleTc, c) }
	buggyXDP := func(tb testing.TB, c pktest.Case) { pktest.RunCase(tb, buggy.PktestSampleXdp, c) }
	buggyTC := func(tb testing.TB, c pktest.Case) { pktest.RunCase(tb, buggy.PktestSampleTc, c) }
	wrongBackend := backend.Addr().Next()

	tests := []struct {
		name string
		run  func(testing.TB, pktest.Case)
		c    pktest.Case
		// want are fragments that the failure messages must contain;
		// nil means the case must pass.
		want []string
	}{
		{
			name: "correct case passes",
			run:  xdp,
			c:    pktest.Case{Name: "ok", In: udp.Bytes(), Verdict: pktest.XDPTX, Out: udp.WithDst(backend).Bytes(), Setup: reset},
		},
		{
			name: "wrong verdict",
			run:  xdp,
			c:    pktest.Case{Name: "v", In: udp.Bytes(), Verdict: pktest.XDPPass, Setup: reset},
			want: []string{"verdict: got XDP_TX want XDP_PASS", "ipv4.dst: 10.0.1.5"},
		},
		{
			name: "wrong output address",
			run:  xdp,
			c:    pktest.Case{Name: "o", In: udp.Bytes(), Verdict: pktest.XDPTX, Out: udp.WithDstAddr(wrongBackend).WithDstPort(backend.Port()).Bytes(), Setup: reset},
			want: []string{"ipv4.dst: got 10.0.1.5 want 10.0.1.6", "first difference at byte"},
		},
		{
			name: "unchanged output expected from a rewrite",
			run:  tc,
			c:    pktest.Case{Name: "u", In: udp.Bytes(), Verdict: pktest.TCActOK, Setup: reset},
			want: []string{"ipv4.dst: got 10.0.1.5 want 10.96.0.10", "udp.dport: got 5353 want 53"},
		},
		{
			name: "XDP program that forgets the L4 checksum",
			run:  buggyXDP,
			c:    pktest.Case{Name: "b", In: udp.Bytes(), Verdict: pktest.XDPTX, Out: udp.WithDst(backend).Bytes(), Setup: resetBuggy},
			want: []string{"udp.checksum: got", "(bad, want", "wrong checksums in the output: udp.checksum"},
		},
		{
			name: "TC program that forgets the L4 checksum, CHECKSUM_NONE",
			run:  buggyTC,
			c: pktest.Case{Name: "b", In: udp.Bytes(), Verdict: pktest.TCActOK, Out: udp.WithDst(backend).Bytes(), Setup: resetBuggy,
				SKBChecksum: pktest.SKBChecksumNone},
			want: []string{"wrong checksums in the output: udp.checksum"},
		},
		{
			name: "TC program that forgets the L4 checksum, CHECKSUM_COMPLETE",
			run:  buggyTC,
			c:    pktest.Case{Name: "b", In: udp.Bytes(), Verdict: pktest.TCActOK, Out: udp.WithDst(backend).Bytes(), Setup: resetBuggy},
			want: []string{pktest.ErrChecksumComplete.Error()},
		},
		{
			name: "expected frame with a wrong checksum by mistake",
			run:  xdp,
			c:    pktest.Case{Name: "f", In: udp.Bytes(), Verdict: pktest.XDPTX, Out: udp.WithDst(backend).WithBadL4Checksum().Bytes(), Setup: reset},
			want: []string{"expected frame of case \"f\" has wrong checksums", "udp.checksum"},
		},
		{
			name: "TC verdict in an XDP table",
			run:  xdp,
			c:    pktest.Case{Name: "k", In: udp.Bytes(), Verdict: pktest.TCActOK},
			want: []string{"expects TC_ACT_OK from an XDP program"},
		},
		{
			name: "case without verdict",
			run:  tc,
			c:    pktest.Case{Name: "z", In: udp.Bytes()},
			want: []string{"has no expected verdict"},
		},
		{
			name: "frame shorter than an Ethernet header",
			run:  tc,
			c:    pktest.Case{Name: "s", In: udp.Bytes()[:13], Verdict: pktest.TCActOK},
			want: []string{"13-byte frame: BPF_PROG_TEST_RUN needs at least an Ethernet header"},
		},
		{
			name: "XDP context for a TC program",
			run:  tc,
			c:    pktest.Case{Name: "x", In: udp.Bytes(), Verdict: pktest.TCActOK, XDP: &pktest.XDPContext{LinearLen: 20}},
			want: []string{"XDP context for a TC program"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs := runRecorded(t, tt.c, tt.run)
			all := strings.Join(msgs, "\n")
			if tt.want == nil {
				if len(msgs) > 0 {
					t.Fatalf("a correct case failed:\n%s", all)
				}
				return
			}
			if len(msgs) == 0 {
				t.Fatal("the runner did not fail")
			}
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("failure lacks %q:\n%s", w, all)
				}
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	objs := loadSample(t, sampleOptions{})
	buggy := loadSample(t, sampleOptions{bugSkipL4Csum: true})
	resetSample(t, buggy)
	udp := pktest.UDP(client, frontend).Bytes()
	if _, err := pktest.Exec(objs.PktestSampleXdp, pktest.Case{In: udp[:10]}); !errors.Is(err, pktest.ErrCase) {
		t.Errorf("short frame: %v, want ErrCase", err)
	}
	if _, err := pktest.Exec(objs.PktestSampleXdp, pktest.Case{In: udp, SKB: &pktest.SKBContext{}}); !errors.Is(err, pktest.ErrCase) {
		t.Errorf("SKB context for XDP: %v, want ErrCase", err)
	}
	if _, err := pktest.Exec(objs.PktestSampleXdp, pktest.Case{In: udp, XDP: &pktest.XDPContext{LinearLen: uint32(len(udp) + 1)}}); !errors.Is(err, pktest.ErrCase) {
		t.Errorf("linear part beyond the frame: %v, want ErrCase", err)
	}
	if _, err := pktest.Exec(buggy.PktestSampleTc, pktest.Case{In: udp}); !errors.Is(err, pktest.ErrChecksumComplete) {
		t.Errorf("buggy TC program on a CHECKSUM_COMPLETE skb: %v, want ErrChecksumComplete", err)
	}
}
