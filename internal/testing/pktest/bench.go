package pktest

import (
	"bytes"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Bench measures the program on frame and reports the kernel's own time per
// run as "ns/pkt" (the benchmark's ns/op is wall time and includes the
// syscalls).
//
// With a repeat count the kernel runs the program on the same buffer again
// and again, so a program that rewrites the frame would see its own output
// from the second run on and be measured on another path (a translated
// packet usually matches nothing). Bench therefore runs the program once
// first: if the frame comes out unchanged, it runs b.N repeats in the
// kernel. If not, it runs b.N single runs, each on a fresh copy, and adds up
// the kernel's time of each; a single run also times the kernel's clock
// reads and setup around the program, which a repeated run spreads over
// all repeats. Bench measures that overhead with a program that does
// nothing, subtracts it, and reports it as "overhead-ns", so that figures
// of both kinds compare.
//
// TC programs run on a CHECKSUM_NONE skb here: the kernel's benchmark mode
// takes no flags.
func Bench(b *testing.B, prog *ebpf.Program, frame []byte) {
	b.Helper()
	BenchWith(b, prog, frame, BenchOptions{})
}

// BenchOptions vary what BenchWith measures.
type BenchOptions struct {
	// Do wraps the runs, as Case.Do does: to run in a test namespace whose
	// devices and routes the program's FIB lookups need.
	Do func(run func() error) error
	// BeforeRun runs before every run, outside the kernel's timer: to
	// reset state the program keeps in maps so that every run takes the
	// same path (a new flow rather than a tracked one). It makes every run
	// a single run.
	BeforeRun func() error
}

// BenchWith is Bench with options.
func BenchWith(b *testing.B, prog *ebpf.Program, frame []byte, opts BenchOptions) {
	b.Helper()
	m := newMeasured(b, Subject{Prog: prog, Frame: frame, Opts: opts})
	b.ResetTimer()
	if err := m.run(b.N); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if m.rewrites {
		b.ReportMetric(m.overhead, "overhead-ns")
	}
	b.ReportMetric(m.perPacket(), "ns/pkt")
}

// Subject is a program and the frame to time it on, for BenchPair.
type Subject struct {
	Prog  *ebpf.Program
	Frame []byte
	Opts  BenchOptions
}

// pairRounds is how many turns each subject of BenchPair gets.
const pairRounds = 16

// pairMinRepeats is the fewest repeats a turn of BenchPair runs of a
// subject timed in repeats: the first run of a turn, after the other
// subject's, finds less of its state in the caches, and a turn of a few
// repeats would add that to both subjects' figures, which brings their
// ratio closer to 1 than it is.
const pairMinRepeats = 2000

// BenchPair measures two subjects as Bench does, taking turns: b.N runs of
// each in pairRounds turns (at least pairMinRepeats a turn where the
// kernel repeats the run), the order of the two swapped every turn. Their
// ns per packet are reported as "NAME-ns/pkt" for the two names, and the
// second's over the first's as "RATIO", for instance names {"ipv4",
// "ipv6"} and ratio "ipv6/ipv4". Where Bench of one and then the other
// compares measurements made at different times, BenchPair compares two
// made side by side: on this shared machine the same path's cost moved by
// up to 2x between runs a few seconds apart (a drop: 85 or 150 ns), and the
// ratio of two such runs' medians for one path and one build went from
// 1.18 to 1.44.
func BenchPair(b *testing.B, names [2]string, ratio string, subjects [2]Subject) {
	b.Helper()
	var ms [2]*measured
	for i, s := range subjects {
		ms[i] = newMeasured(b, s)
	}
	rounds := min(b.N, pairRounds)
	b.ResetTimer()
	for r := range rounds {
		n := b.N / rounds
		if r < b.N%rounds {
			n++
		}
		for k := range 2 {
			m := ms[(r+k)%2]
			runs := n
			if !m.rewrites {
				runs = max(n, pairMinRepeats)
			}
			if err := m.run(runs); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	var per [2]float64
	for i, m := range ms {
		per[i] = m.perPacket()
		b.ReportMetric(per[i], names[i]+"-ns/pkt")
	}
	if per[0] > 0 {
		b.ReportMetric(per[1]/per[0], ratio)
	}
}

// measured is one subject being timed: whether its runs are single runs
// (it rewrites the frame, or resets state before each run), the overhead
// of a single run, and the runs so far and the kernel's time for them.
type measured struct {
	s        Subject
	rewrites bool
	overhead float64
	runs     int
	total    time.Duration
}

func newMeasured(b *testing.B, s Subject) *measured {
	b.Helper()
	if s.Opts.BeforeRun != nil {
		if err := s.Opts.BeforeRun(); err != nil {
			b.Fatal(err)
		}
	}
	first, err := Exec(s.Prog, Case{In: s.Frame, Do: s.Opts.Do})
	if err != nil {
		b.Fatal(err)
	}
	m := &measured{s: s, rewrites: !bytes.Equal(first.Out, s.Frame) || s.Opts.BeforeRun != nil}
	if m.rewrites {
		if m.overhead, err = singleRunOverhead(s.Prog.Type(), s.Frame); err != nil {
			b.Fatal(err)
		}
	}
	return m
}

// run times n more runs.
func (m *measured) run(n int) error {
	do := m.s.Opts.Do
	if do == nil {
		do = func(run func() error) error { return run() }
	}
	return do(func() error {
		d, err := kernelTime(m.s.Prog, m.s.Frame, n, m.rewrites, m.s.Opts.BeforeRun)
		m.runs += n
		m.total += d
		return err
	})
}

// perPacket is the kernel's time per run, less the overhead of single
// runs.
func (m *measured) perPacket() float64 {
	if m.runs == 0 {
		return 0
	}
	per := float64(m.total.Nanoseconds()) / float64(m.runs)
	if m.rewrites {
		per = max(per-m.overhead, 0)
	}
	return per
}

// kernelTime runs prog n times on frame, as n single runs or as repeats,
// and returns the kernel's time for all of them.
func kernelTime(prog *ebpf.Program, frame []byte, n int, single bool, before func() error) (time.Duration, error) {
	var total time.Duration
	if single {
		for range n {
			if before != nil {
				if err := before(); err != nil {
					return 0, err
				}
			}
			_, d, err := prog.Benchmark(frame, 1, nil)
			if err != nil {
				return 0, err
			}
			total += d
		}
		return total, nil
	}
	for left := n; left > 0; {
		chunk := min(left, math.MaxUint32)
		_, d, err := prog.Benchmark(frame, chunk, nil)
		if err != nil {
			return 0, err
		}
		total += d * time.Duration(chunk)
		left -= chunk
	}
	return total, nil
}

var overheads sync.Map // ebpf.ProgramType -> func() (float64, error)

// singleRunOverhead is what a single run of a program that only returns
// costs more than one of many repeats of it, in ns, measured once per
// program type.
func singleRunOverhead(typ ebpf.ProgramType, frame []byte) (float64, error) {
	f, _ := overheads.LoadOrStore(typ, sync.OnceValues(func() (float64, error) {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         typ,
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
			License:      "GPL",
		})
		if err != nil {
			return 0, fmt.Errorf("load a %s program to measure the overhead of single runs: %w", typ, err)
		}
		defer prog.Close()
		const n = 20000
		single, err := kernelTime(prog, frame, n, true, nil)
		if err != nil {
			return 0, err
		}
		repeated, err := kernelTime(prog, frame, 100*n, false, nil)
		if err != nil {
			return 0, err
		}
		return float64(single.Nanoseconds())/n - float64(repeated.Nanoseconds())/(100*n), nil
	}))
	return f.(func() (float64, error))()
}
