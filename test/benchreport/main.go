// Command benchreport reads what the benchmark targets wrote and says what
// it shows.
//
//	benchreport summary DIR
//
// prints the bench: line of every figure measured in DIR's go test -bench
// outputs (*.txt), in the order of figures.All, then the figures DIR has no
// measurement of and the make target that measures them. `make bench` ends
// with it.
//
//	benchreport report --in DIR --out docs
//
// writes docs/benchmarks.md and its plots (docs/benchmarks/*.png) from
// DIR: the per-packet costs (paths.txt), the socket hooks (sockets.txt),
// pods translated per packet (the pod paths of paths.txt, pods.txt),
// the scale runs (scale-*.json, one per Service count, from make
// e2e-bench with EBPF_PROXY_BENCH_JSON), the packet rates (pps.txt, from
// make bench-pps). Every file NAME.txt or NAME.json comes with NAME.meta,
// written when the run ended: its date, kernel and load average, which the
// report prints beside the figures of that run. `make bench-report` runs
// the benchmarks, then this.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/test/benchreport/figures"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  benchreport summary DIR
  benchreport report --in DIR --out DOCS`

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "summary":
		if len(args) != 2 {
			return errors.New(usage)
		}
		return summary(args[1], stdout)
	case "report":
		fs := flag.NewFlagSet("report", flag.ContinueOnError)
		in := fs.String("in", "bin/bench", "the benchmarks' outputs")
		out := fs.String("out", "docs", "where benchmarks.md and benchmarks/ go")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 0 {
			return fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), usage)
		}
		d, err := load(*in)
		if err != nil {
			return err
		}
		return writeReport(d, *out)
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// summary prints the figures measured in dir's outputs, then those it
// has none of.
func summary(dir string, w io.Writer) error {
	d, err := load(dir)
	if err != nil {
		return err
	}
	var missing []string
	for _, f := range figures.All {
		v, ok := d.figures[f.Name]
		if !ok {
			if f.Target != 0 {
				missing = append(missing, fmt.Sprintf("%s (%s)", f.Name, f.Source))
			}
			continue
		}
		fmt.Fprintln(w, f.Line(v))
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "bench: not measured by this run: %s\n", strings.Join(missing, ", "))
	}
	return nil
}

// run is one benchmark run's output and when and where it ran.
type runOutput struct {
	name    string
	results []figures.Result
	printed map[string]float64
	meta    meta
	// sentBy is how make bench-pps sent its frames, from its table's
	// header; "" for the other runs.
	sentBy string
}

// meta is what a NAME.meta file says: lines "date ...", "kernel ...",
// "loadavg ...", "machine ...".
type meta map[string]string

func (m meta) String() string {
	if len(m) == 0 {
		return "(no record of the run)"
	}
	return fmt.Sprintf("%s, kernel %s, %s, load average %s", m["date"], m["kernel"], m["machine"], m["loadavg"])
}

// data is everything read from a directory of outputs.
type data struct {
	runs    []runOutput
	scales  []scaleRun
	figures map[string]float64
	// source names the run each figure comes from.
	source map[string]string
}

func (d *data) run(name string) (runOutput, bool) {
	for _, r := range d.runs {
		if r.name == name {
			return r, true
		}
	}
	return runOutput{}, false
}

// load reads dir's *.txt (go test -bench outputs), scale-*.json and
// *.meta.
func load(dir string) (*data, error) {
	d := &data{figures: map[string]float64{}, source: map[string]string{}}
	txts, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, err
	}
	jsons, err := filepath.Glob(filepath.Join(dir, "scale-*.json"))
	if err != nil {
		return nil, err
	}
	if len(txts)+len(jsons) == 0 {
		return nil, fmt.Errorf("%s holds no benchmark output (*.txt, scale-*.json)", dir)
	}
	sort.Strings(txts)
	for _, path := range txts {
		name := strings.TrimSuffix(filepath.Base(path), ".txt")
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		res, printed, err := figures.Parse(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		res = figures.Medians(res)
		r := runOutput{name: name, results: res, printed: printed, meta: readMeta(dir, name), sentBy: ppsSentBy(string(b))}
		d.runs = append(d.runs, r)
		for k, v := range figures.Collect(res, printed) {
			d.figures[k] = v
			d.source[k] = name
		}
	}
	for _, path := range jsons {
		s, err := readScale(path)
		if err != nil {
			return nil, err
		}
		s.file = filepath.Base(path)
		s.meta = readMeta(dir, strings.TrimSuffix(s.file, ".json"))
		d.scales = append(d.scales, s)
		for k, v := range s.figures() {
			d.figures[k] = v
			d.source[k] = filepath.Base(path)
		}
	}
	slices.SortFunc(d.scales, func(a, b scaleRun) int { return a.Services - b.Services })
	if v, i, ok := worstMemVsIPTables(d.scales); ok {
		d.figures["mem_vs_iptables"] = v
		d.source["mem_vs_iptables"] = d.scales[i].file
	}
	return d, nil
}

// ppsSentBy is what the header of make bench-pps's table says sent the
// frames ("nodeport-pps: ... (sent by X, batch ..."); "" where the text has
// no such header.
func ppsSentBy(text string) string {
	_, rest, ok := strings.Cut(text, "nodeport-pps:")
	if !ok {
		return ""
	}
	line, _, _ := strings.Cut(rest, "\n")
	_, by, ok := strings.Cut(line, "(sent by ")
	if !ok {
		return ""
	}
	by, _, ok = strings.Cut(by, ", batch ")
	if !ok {
		return ""
	}
	return by
}

func readMeta(dir, name string) meta {
	m := meta{}
	b, err := os.ReadFile(filepath.Join(dir, name+".meta"))
	if err != nil {
		return m
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}
