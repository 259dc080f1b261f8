package dump

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// ParseViewOptions checks the flags of a view (dump conntrack, affinity,
// maglev, source-ranges, counters): ParseOptions' rules, without -o
// entries; counters take no filter.
func ParseViewOptions(view string, f Flags) (Options, error) {
	switch f.Output {
	case OutputTable, OutputWide, OutputJSON:
	default:
		return Options{}, fmt.Errorf("-o %q: want table, wide or json for dump %s", f.Output, view)
	}
	o, err := ParseOptions(f)
	if err == nil && view == ViewCounters && (f.Service != "" || f.Address != "" || f.Protocol != "") {
		err = fmt.Errorf("--service, --address and --protocol do not apply to dump %s", view)
	}
	return o, err
}

// MonotonicNow is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func MonotonicNow() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_MONOTONIC): %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// RunView prints the view (ViewConntrack, ViewAffinity, ViewMaglev,
// ViewSourceRanges or ViewCounters) of the maps pinned under o.BPFFSPath, named as Run
// names the Services, and returns the exit code. A view whose maps were
// never pinned (the TC programs never attached, for conntrack and Maglev)
// fails with one line saying so.
func RunView(ctx context.Context, view string, o Options, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if view == ViewCounters {
		// The counters name no Service: no services map, no agent.
		m, err := loader.OpenPinnedMap(o.BPFFSPath, bpfobj.SockMapLbMetricsV1)
		if err != nil {
			return fail(err)
		}
		defer m.Close()
		counts, err := loader.ReadCounters(m)
		if err != nil {
			return fail(err)
		}
		r := BuildCounters(counts, loader.CounterNames, loader.CounterDescriptions)
		if o.Output == OutputJSON {
			err = writeJSON(stdout, r)
		} else {
			err = WriteCountersTable(stdout, r, o.Output == OutputWide)
		}
		if err != nil {
			return fail(err)
		}
		return 0
	}
	sm, err := loader.OpenPinnedSockMaps(o.BPFFSPath)
	if err != nil {
		return fail(err)
	}
	defer sm.Close()
	v4, err := maps.ReadFrontends(maps.KernelMaps(sm))
	if err != nil {
		return fail(err)
	}
	v6, err := maps.ReadFrontends6(maps.KernelMaps6(sm))
	if err != nil {
		return fail(err)
	}
	fams := []Family{{"IPv4", v4}, {"IPv6", v6}}
	var report any
	var table func(bool) error
	switch view {
	case ViewConntrack:
		var cts []CTFamily
		err = readPinned(o.BPFFSPath, [2]string{bpfobj.TcMapTc4CtV1, bpfobj.TcMapTc6CtV1}, func(fam string, m *ebpf.Map) error {
			es, err := maps.ReadConntrackMap(m)
			cts = append(cts, CTFamily{fam, es})
			return err
		})
		if err != nil {
			return fail(err)
		}
		now, err := MonotonicNow()
		if err != nil {
			return fail(err)
		}
		r := BuildConntrack(cts, fams, AskAgent(ctx, o.APISocket, stderr), now, o)
		report, table = r, func(wide bool) error { return WriteConntrackTable(stdout, r, wide) }
	case ViewAffinity:
		var afs []AffinityFamily
		err = readPinned(o.BPFFSPath, [2]string{bpfobj.SockMapLb4AffinityV1, bpfobj.SockMapLb6AffinityV1}, func(fam string, m *ebpf.Map) error {
			es, err := maps.ReadAffinityMap(m)
			afs = append(afs, AffinityFamily{fam, es})
			return err
		})
		if err != nil {
			return fail(err)
		}
		now, err := MonotonicNow()
		if err != nil {
			return fail(err)
		}
		r := BuildAffinity(afs, fams, AskAgent(ctx, o.APISocket, stderr), now, o)
		report, table = r, func(wide bool) error { return WriteAffinityTable(stdout, r, wide) }
	case ViewMaglev:
		var mfs []MaglevFamily
		err = readPinned(o.BPFFSPath, [2]string{bpfobj.TcMapLb4MaglevV1, bpfobj.TcMapLb6MaglevV1}, func(fam string, m *ebpf.Map) error {
			ts, err := maps.ReadMaglev(maps.KernelMaglevReader(m))
			mfs = append(mfs, MaglevFamily{fam, ts})
			return err
		})
		if err != nil {
			return fail(err)
		}
		r := BuildMaglev(mfs, fams, AskAgent(ctx, o.APISocket, stderr), o)
		report, table = r, func(wide bool) error { return WriteMaglevTable(stdout, r, wide) }
	case ViewSourceRanges:
		r4, err := maps.ReadSourceRanges(maps.KernelMaps(sm))
		if err != nil {
			return fail(err)
		}
		r6, err := maps.ReadSourceRanges6(maps.KernelMaps6(sm))
		if err != nil {
			return fail(err)
		}
		r := BuildSourceRanges([]RangeFamily{{"IPv4", r4}, {"IPv6", r6}}, fams, AskAgent(ctx, o.APISocket, stderr), o)
		report, table = r, func(wide bool) error { return WriteSourceRangesTable(stdout, r, wide) }
	default:
		return fail(fmt.Errorf("no view %q", view))
	}
	if o.Output == OutputJSON {
		err = writeJSON(stdout, report)
	} else {
		err = table(o.Output == OutputWide)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// readPinned opens the IPv4 and IPv6 maps names read-only and calls read
// with each that is pinned; neither pinned is an error that says so.
func readPinned(bpffs string, names [2]string, read func(family string, m *ebpf.Map) error) error {
	found := false
	for i, fam := range []string{"IPv4", "IPv6"} {
		m, err := loader.OpenPinnedMap(bpffs, names[i])
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		found = true
		err = read(fam, m)
		m.Close()
		if err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("no %s or %s pinned under %s/maps: the programs that fill them never ran here", names[0], names[1], bpffs)
	}
	return nil
}
