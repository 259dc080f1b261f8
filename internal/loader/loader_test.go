package loader_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

type fixture struct {
	cgroup string
	bpffs  string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	sandbox.RequireRoot(t)
	cg, err := sandbox.NewCgroup()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close() })
	fs, err := sandbox.NewBPFFS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	f := fixture{cgroup: cg.Path(), bpffs: filepath.Join(fs.Path(), "ebpf-proxy")}
	t.Cleanup(func() { loader.Cleanup(f.bpffs) })
	return f
}

func (f fixture) load(t *testing.T, sizes loader.MapSizes) (*loader.Loaded, error) {
	t.Helper()
	return loader.Load(loader.Config{BPFFSPath: f.bpffs, CgroupPath: f.cgroup, Sizes: sizes})
}

// attached returns the ids of the programs attached to the cgroup for each
// hook the loader uses.
func (f fixture) attached(t *testing.T) map[ebpf.AttachType][]ebpf.ProgramID {
	t.Helper()
	fd, err := unix.Open(f.cgroup, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	out := map[ebpf.AttachType][]ebpf.ProgramID{}
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCgroupInet4GetPeername,
		ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet6GetPeername} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: at})
		if err != nil {
			t.Fatal(err)
		}
		// Every hook has an entry, also one without programs.
		out[at] = []ebpf.ProgramID{}
		for _, p := range res.Programs {
			out[at] = append(out[at], p.ID)
		}
	}
	return out
}

func mapID(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func TestReloadAdoptsMapsAndReplacesProgramsInPlace(t *testing.T) {
	f := newFixture(t)
	first, err := f.load(t, loader.MapSizes{})
	if err != nil {
		t.Fatal(err)
	}
	servicesID := mapID(t, first.Objects.Lb4ServicesV1)
	services6ID := mapID(t, first.Objects.Lb6ServicesV1)
	before := f.attached(t)
	first.Close()
	for at, ids := range before {
		if len(ids) != 1 {
			t.Fatalf("%v: %d programs attached, want 1", at, len(ids))
		}
	}

	second, err := f.load(t, loader.MapSizes{})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if id := mapID(t, second.Objects.Lb4ServicesV1); id != servicesID {
		t.Errorf("services map id %d after reload, want the pinned map %d", id, servicesID)
	}
	if id := mapID(t, second.Objects.Lb6ServicesV1); id != services6ID {
		t.Errorf("IPv6 services map id %d after reload, want the pinned map %d", id, services6ID)
	}
	after := f.attached(t)
	for at, ids := range after {
		if len(ids) != 1 {
			t.Errorf("%v: %d programs attached after reload, want 1 (replaced, not added)", at, len(ids))
		} else if ids[0] == before[at][0] {
			t.Errorf("%v: still runs program %d, want the newly loaded one", at, ids[0])
		}
	}
}

func TestCleanupDetachesAndUnpins(t *testing.T) {
	f := newFixture(t)
	l, err := f.load(t, loader.MapSizes{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if err := loader.Cleanup(f.bpffs); err != nil {
		t.Fatal(err)
	}
	for at, ids := range f.attached(t) {
		if len(ids) != 0 {
			t.Errorf("%v: %d programs attached after cleanup", at, len(ids))
		}
	}
	if _, err := os.Stat(f.bpffs); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory still there: %v", err)
	}
	// Cleaning up twice, or with nothing pinned, is not an error.
	if err := loader.Cleanup(f.bpffs); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestLoadRefusesAPathThatIsNotACgroup(t *testing.T) {
	f := newFixture(t)
	_, err := loader.Load(loader.Config{BPFFSPath: f.bpffs, CgroupPath: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "not on a cgroup v2 filesystem") {
		t.Errorf("got %v, want a clear error about the cgroup path", err)
	}
}

func TestCounterNamesCoverEveryCounter(t *testing.T) {
	if len(loader.CounterNames) != int(bpfobj.SockLbMetricLB_M_MAX) {
		t.Errorf("%d counter names for %d counters", len(loader.CounterNames), bpfobj.SockLbMetricLB_M_MAX)
	}
	for i, n := range loader.CounterNames {
		if n == "" {
			t.Errorf("counter %d has no name", i)
		}
	}
	if len(loader.CounterDescriptions) != len(loader.CounterNames) {
		t.Errorf("%d counter descriptions for %d counters", len(loader.CounterDescriptions), len(loader.CounterNames))
	}
	for i, d := range loader.CounterDescriptions {
		if d == "" {
			t.Errorf("counter %d (%s) has no description", i, loader.CounterNames[i])
		}
	}
}
