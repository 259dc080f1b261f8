package pktest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// Errors of Exec, in one block for errors.Is.
var (
	// ErrChecksumComplete: the kernel found skb->csum inconsistent with the
	// packet after a TC program ran on a CHECKSUM_COMPLETE skb (EBADMSG).
	// Behind a NIC that delivers CHECKSUM_COMPLETE such a program makes the
	// stack log "hw csum failure" and check those packets in software.
	ErrChecksumComplete = errors.New("program left skb->csum inconsistent with the packet (CHECKSUM_COMPLETE)")
	// ErrCase: the case cannot be run as written.
	ErrCase = errors.New("invalid case")
	// ErrShortL3Refused: the kernel refuses TC input whose EtherType says
	// IPv4 (IPv6) but that holds less than a whole IPv4 (IPv6) header.
	// Kernels with upstream commit 12bec2bd4b76 ("bpf: reject short
	// IPv4/IPv6 inputs in bpf_prog_test_run_skb", 2026, in the stable
	// series too: Debian's 6.1.192 and 6.12.117 have it) do; older ones run
	// such frames. A device can still hand them to a TC program: RunCase
	// skips these cases with the reason, and the XDP tables cover them.
	ErrShortL3Refused = errors.New("kernel refuses TC input with an IPv4 or IPv6 EtherType but less than a whole IP header")
)

// bpfFTestSKBChecksumComplete is BPF_F_TEST_SKB_CHECKSUM_COMPLETE.
const bpfFTestSKBChecksumComplete = 1 << 2

// outputRoom is how much a program may grow the packet: XDP has 256 bytes
// of headroom and a page of tailroom at most, TC can grow more but not
// past a page in a test run.
const outputRoom = 4096

// SKBChecksum chooses the checksum state the kernel gives the skb of a TC
// case.
type SKBChecksum uint8

// Checksum states of the skb of a TC case.
const (
	// SKBChecksumComplete (the default): skb->csum holds the sum of the
	// packet from the network header on, as a NIC with CHECKSUM_COMPLETE
	// delivers it, and the kernel checks after the run that the program
	// kept it right (see ErrChecksumComplete). Kernels without
	// BPF_F_TEST_SKB_CHECKSUM_COMPLETE run the case with CHECKSUM_NONE and
	// Run says so in the test log.
	SKBChecksumComplete SKBChecksum = iota
	// SKBChecksumNone: CHECKSUM_NONE, as from a device without receive
	// checksum offload. For programs that edit packets with direct writes
	// and fix the checksums by hand, which is right only where no
	// CHECKSUM_COMPLETE skb can reach them.
	SKBChecksumNone
)

// Case is one row of a fixture table: a frame, what the program must
// return, and what the frame must look like afterwards.
type Case struct {
	// Name says what the row checks, as a reader would ("UDP to the
	// frontend: destination rewritten").
	Name string
	// In is the input frame; at least MinFrameLen bytes.
	In []byte
	// Verdict is the expected return value: one of the XDP* constants for
	// XDP programs, TCAct* for TC programs.
	Verdict Verdict
	// Out is the expected frame after the run; nil means unchanged (In).
	// It is compared byte for byte, after the verdict.
	Out []byte
	// BadChecksums declares that the expected frame carries wrong
	// checksums on purpose, such as an input with a bad checksum that the
	// program passes untouched. Without it, a wrong checksum in the
	// expected frame is a mistake in the table and fails the case.
	BadChecksums bool
	// Setup runs before the program, for example to write map entries.
	Setup func(tb testing.TB)
	// Check runs after the other checks passed, for example to read maps
	// the program wrote or the context it returned.
	Check func(tb testing.TB, r Result)
	// SKB is the __sk_buff input of a TC case; nil means all zero.
	SKB *SKBContext
	// SKBChecksum is the checksum state of a TC case's skb.
	SKBChecksum SKBChecksum
	// XDP is the xdp_md input of an XDP case; nil means the whole frame
	// is linear.
	XDP *XDPContext
	// Do, when set, wraps the run: the program runs inside the function Do
	// calls, such as sandbox.Netns.Do, so that helpers that look at the
	// network namespace (FIB lookups, SKB.Ifindex) see a test namespace's
	// devices and routes rather than the caller's.
	Do func(run func() error) error
}

// Result is what one run of a program gave.
type Result struct {
	// Verdict is the return value as a Verdict of the program's family;
	// Ret is the raw value.
	Verdict Verdict
	Ret     uint32
	// Out is the frame after the run.
	Out []byte
	// SKB is the __sk_buff after a TC run (mark, priority, cb, ...).
	SKB *SKBContext
	// ChecksumComplete says whether the TC run had a CHECKSUM_COMPLETE skb.
	ChecksumComplete bool
	// XDP is the xdp_md after an XDP run.
	XDP *XDPResult
}

// Exec runs one case through BPF_PROG_TEST_RUN and returns what happened,
// without judging it; Run judges. It returns an error wrapping ErrCase for
// a case that cannot run (too short, a context of the other family), and
// ErrChecksumComplete when the kernel rejected the skb's checksum state
// after the run.
func Exec(prog *ebpf.Program, c Case) (Result, error) {
	if len(c.In) < MinFrameLen {
		return Result{}, fmt.Errorf("%w: %d-byte frame: BPF_PROG_TEST_RUN needs at least an Ethernet header (%d bytes) for TC and XDP programs",
			ErrCase, len(c.In), MinFrameLen)
	}
	opts := ebpf.RunOptions{
		Data:    c.In,
		DataOut: make([]byte, len(c.In)+outputRoom),
		Repeat:  1,
	}
	var res Result
	var ctxOut []byte
	switch prog.Type() {
	case ebpf.XDP:
		if c.SKB != nil {
			return Result{}, fmt.Errorf("%w: SKB context for an XDP program", ErrCase)
		}
		if c.XDP != nil && int(c.XDP.LinearLen) > len(c.In) {
			return Result{}, fmt.Errorf("%w: XDP linear length %d beyond the %d-byte frame", ErrCase, c.XDP.LinearLen, len(c.In))
		}
		opts.Context = c.XDP.marshal(len(c.In))
		ctxOut = make([]byte, xdpSize)
	case ebpf.SchedCLS, ebpf.SchedACT:
		if c.XDP != nil {
			return Result{}, fmt.Errorf("%w: XDP context for a TC program", ErrCase)
		}
		opts.Context = c.SKB.marshal()
		ctxOut = make([]byte, skbSize)
		if c.SKBChecksum == SKBChecksumComplete {
			switch err := probeChecksumComplete(); {
			case err == nil:
				opts.Flags |= bpfFTestSKBChecksumComplete
				res.ChecksumComplete = true
			case !errors.Is(err, ebpf.ErrNotSupported):
				return Result{}, err
			}
		}
	default:
		return Result{}, fmt.Errorf("%w: program type %s is neither XDP nor TC", ErrCase, prog.Type())
	}
	opts.ContextOut = ctxOut
	var ret uint32
	var err error
	if c.Do != nil {
		err = c.Do(func() error {
			var rerr error
			ret, rerr = prog.Run(&opts)
			return rerr
		})
	} else {
		ret, err = prog.Run(&opts)
	}
	if err != nil {
		if errors.Is(err, unix.EBADMSG) && res.ChecksumComplete {
			return Result{}, fmt.Errorf("%w: %v", ErrChecksumComplete, err)
		}
		if errors.Is(err, unix.EINVAL) && prog.Type() != ebpf.XDP && shortL3(c.In) {
			if refused, perr := probeShortL3Refused(); perr == nil && refused {
				return Result{}, fmt.Errorf("%w (%d-byte frame): %v", ErrShortL3Refused, len(c.In), err)
			}
		}
		return Result{}, fmt.Errorf("BPF_PROG_TEST_RUN of %s with a %d-byte frame: %w", prog.Type(), len(c.In), err)
	}
	res.Ret = ret
	res.Out = bytes.Clone(opts.DataOut)
	if prog.Type() == ebpf.XDP {
		res.Verdict = xdpVerdict(ret)
		res.XDP = unmarshalXDP(ctxOut)
	} else {
		res.Verdict = tcVerdict(ret)
		if res.SKB, err = unmarshalSKB(ctxOut); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

// shortL3 reports whether a frame's EtherType announces IPv4 or IPv6 but
// the frame ends inside the fixed header.
func shortL3(frame []byte) bool {
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case EtherTypeIPv4:
		return len(frame) < MinFrameLen+20
	case EtherTypeIPv6:
		return len(frame) < MinFrameLen+40
	}
	return false
}

// runProbe runs a TC program that returns TC_ACT_OK on frame with flags.
func runProbe(frame []byte, flags uint32) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		return fmt.Errorf("load probe program: %w", err)
	}
	defer prog.Close()
	_, err = prog.Run(&ebpf.RunOptions{Data: frame, Flags: flags})
	return err
}

// probeShortL3Refused reports whether the kernel refuses TC input with an
// IPv4 EtherType and no IPv4 header (see ErrShortL3Refused).
var probeShortL3Refused = sync.OnceValues(func() (bool, error) {
	frame := make([]byte, MinFrameLen)
	binary.BigEndian.PutUint16(frame[12:], EtherTypeIPv4)
	err := runProbe(frame, 0)
	switch {
	case errors.Is(err, unix.EINVAL):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("probe for short IPv4 TC input: %w", err)
	}
	return false, nil
})

// probeChecksumComplete reports whether the kernel takes
// BPF_F_TEST_SKB_CHECKSUM_COMPLETE, by running a program that returns
// TC_ACT_OK with it; ebpf.ErrNotSupported means it does not.
var probeChecksumComplete = sync.OnceValue(func() error {
	err := runProbe(make([]byte, MinFrameLen), bpfFTestSKBChecksumComplete)
	switch {
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("BPF_F_TEST_SKB_CHECKSUM_COMPLETE: %w", ebpf.ErrNotSupported)
	case err != nil:
		return fmt.Errorf("probe for BPF_F_TEST_SKB_CHECKSUM_COMPLETE: %w", err)
	}
	return nil
})

// Run runs every case as a subtest through BPF_PROG_TEST_RUN and checks
// that the program returns the expected verdict and that the output frame
// is Out (or In) byte for byte, with a field-level Diff if not.
//
// Checksums: when the verdict sends the packet on (XDP_PASS, XDP_TX,
// XDP_REDIRECT, TC_ACT_OK, TC_ACT_REDIRECT, ...), every IPv4, TCP, UDP and
// ICMP checksum of the expected frame must be right unless the case sets
// BadChecksums, so an output that equals it byte for byte has right
// checksums too; an output that differs gets its wrong checksums listed
// with the diff. TC cases run on a CHECKSUM_COMPLETE skb by default (see
// SKBChecksum), which makes the kernel check skb->csum as well.
//
// Cases run in order, each once, with Setup first and Check last: state a
// program keeps in maps carries over from one case to the next unless
// Setup resets it.
func Run(t *testing.T, prog *ebpf.Program, cases []Case) {
	t.Helper()
	names := map[string]bool{}
	for _, c := range cases {
		if names[c.Name] {
			t.Fatalf("two cases named %q: names must say what each case checks", c.Name)
		}
		names[c.Name] = true
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Helper()
			RunCase(t, prog, c)
		})
	}
}

// RunCase runs and checks one case in the current test, as Run does for
// each of its cases.
func RunCase(t testing.TB, prog *ebpf.Program, c Case) {
	t.Helper()
	isXDP := prog.Type() == ebpf.XDP
	switch {
	case c.Verdict == 0:
		t.Fatalf("case %q has no expected verdict", c.Name)
	case isXDP && !c.Verdict.isXDP():
		t.Fatalf("case %q expects %v from an XDP program", c.Name, c.Verdict)
	case !isXDP && !c.Verdict.isTC():
		t.Fatalf("case %q expects %v from a %s program", c.Name, c.Verdict, prog.Type())
	}
	want := c.Out
	if want == nil {
		want = c.In
	}
	if c.Verdict.forwards() {
		if err := VerifyChecksums(want); err != nil && !c.BadChecksums {
			t.Fatalf("the expected frame of case %q has wrong checksums (set BadChecksums if that is meant): %v", c.Name, err)
		}
	}
	if c.Setup != nil {
		c.Setup(t)
	}
	res, err := Exec(prog, c)
	if errors.Is(err, ErrShortL3Refused) {
		t.Skipf("cannot run on this kernel: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !res.ChecksumComplete && !isXDP && c.SKBChecksum == SKBChecksumComplete {
		t.Log("kernel lacks BPF_F_TEST_SKB_CHECKSUM_COMPLETE: ran with CHECKSUM_NONE")
	}
	if res.Ret != uint32(c.Verdict.Code()) {
		t.Errorf("verdict: got %v want %v\noutput frame:\n%s", res.Verdict, c.Verdict, Decode(res.Out))
		return
	}
	if d := Diff(res.Out, want); d != "" {
		msg := "output frame differs from the expected one:\n" + d
		if c.Verdict.forwards() {
			if err := checkOutputChecksums(res.Out, want, c.BadChecksums); err != nil {
				msg += "\nwrong checksums in the output: " + err.Error()
			}
		}
		t.Error(msg)
		return
	}
	if c.Check != nil {
		c.Check(t, res)
	}
}

// checkOutputChecksums lists every wrong checksum in out, except those
// that the expected frame carries wrong too when the case declared it.
func checkOutputChecksums(out, want []byte, badOK bool) error {
	wantBad := map[string]bool{}
	for _, c := range Decode(want).Checksums {
		if c.Status == ChecksumBad {
			wantBad[c.Field] = true
		}
	}
	var errs []error
	for _, c := range Decode(out).Checksums {
		if c.Status == ChecksumBad && !(badOK && wantBad[c.Field]) {
			errs = append(errs, fmt.Errorf("%s: %s", c.Field, c))
		}
	}
	return errors.Join(errs...)
}
