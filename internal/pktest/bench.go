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
	do := opts.Do
	if do == nil {
		do = func(run func() error) error { return run() }
	}
	if opts.BeforeRun != nil {
		if err := opts.BeforeRun(); err != nil {
			b.Fatal(err)
		}
	}
	first, err := Exec(prog, Case{In: frame, Do: opts.Do})
	if err != nil {
		b.Fatal(err)
	}
	rewrites := !bytes.Equal(first.Out, frame) || opts.BeforeRun != nil
	var overhead float64
	if rewrites {
		if overhead, err = singleRunOverhead(prog.Type(), frame); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var total time.Duration
	err = do(func() error {
		var err error
		total, err = kernelTime(prog, frame, b.N, rewrites, opts.BeforeRun)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	perPacket := float64(total.Nanoseconds()) / float64(b.N)
	if rewrites {
		perPacket = max(perPacket-overhead, 0)
		b.ReportMetric(overhead, "overhead-ns")
	}
	b.ReportMetric(perPacket, "ns/pkt")
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
