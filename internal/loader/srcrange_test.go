package loader_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// egressAttached returns the ids of the programs attached to the cgroup's
// egress hook.
func (f fixture) egressAttached(t *testing.T) []ebpf.ProgramID {
	t.Helper()
	fd, err := unix.Open(f.cgroup, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupInetEgress})
	if err != nil {
		t.Fatal(err)
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

func TestSourceRangeCheckLifecycle(t *testing.T) {
	f := newFixture(t)
	l, err := f.load(t, loader.MapSizes{})
	if err != nil {
		t.Fatal(err)
	}
	if ids := f.egressAttached(t); len(ids) != 0 || l.SourceRangeCheck() {
		t.Fatalf("egress programs %v right after load, want none until a Service has source ranges", ids)
	}
	for _, step := range []struct {
		name string
		on   bool
		want int
	}{
		{"attached", true, 1},
		{"attaching twice adds nothing", true, 1},
		{"detached", false, 0},
		{"detaching twice is no error", false, 0},
		{"attached again", true, 1},
	} {
		if err := l.SetSourceRangeCheck(step.on); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if ids := f.egressAttached(t); len(ids) != step.want || l.SourceRangeCheck() != step.on {
			t.Fatalf("%s: egress programs %v, SourceRangeCheck %v", step.name, ids, l.SourceRangeCheck())
		}
	}
	before := f.egressAttached(t)
	l.Close()
	if ids := f.egressAttached(t); len(ids) != 1 || ids[0] != before[0] {
		t.Fatalf("egress programs %v once the agent closed, want %v still attached (pinned)", ids, before)
	}

	// A restarted agent replaces the program in the pinned link.
	l, err = f.load(t, loader.MapSizes{})
	if err != nil {
		t.Fatal(err)
	}
	after := f.egressAttached(t)
	if len(after) != 1 || after[0] == before[0] || !l.SourceRangeCheck() {
		t.Fatalf("egress programs %v after reload (before %v), SourceRangeCheck %v: want the new program in place",
			after, before, l.SourceRangeCheck())
	}
	l.Close()

	if err := loader.Cleanup(f.bpffs); err != nil {
		t.Fatal(err)
	}
	if ids := f.egressAttached(t); len(ids) != 0 {
		t.Errorf("egress programs %v after cleanup", ids)
	}
}
