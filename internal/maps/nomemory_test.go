package maps_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// A map that is not preallocated takes memory for each entry it is given,
// charged to the memory cgroup its creator was in (the agent's container):
// at that cgroup's limit, an insert fails. The agent says so, naming the map
// and the limit, and the failure is a full map's (the Writer keeps what was
// programmed and retries entry by entry).
//
// The test makes the map from inside a memory cgroup of its own, goes back
// to the cgroup it came from, and only then limits the new one to its usage
// and 4 MiB more: the map's entries are charged to the limited cgroup, the
// test's own pages are not, so the kernel refuses the map an entry instead
// of killing the test for a page of its heap.
func TestAMapOutOfMemoryIsAFullMapNamingTheLimit(t *testing.T) {
	sandbox.RequireRoot(t)
	mc, err := newMemoryCgroup()
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(mc.dir)
	home, err := mc.current()
	if err != nil {
		t.Fatal(err)
	}
	if err := mc.enter(mc.dir); err != nil {
		t.Fatal(err)
	}
	spec, err := bpfobj.LoadSock()
	if err != nil {
		mc.enter(home)
		t.Fatal(err)
	}
	ms := spec.Maps[bpfobj.SockMapLb4BackendsV1].Copy()
	ms.Pinning, ms.MaxEntries = ebpf.PinNone, 1<<20
	m, err := ebpf.NewMap(ms)
	if err := errors.Join(err, mc.enter(home)); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	usage, err := mc.read(mc.usage)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mc.dir, mc.limit), []byte(strconv.FormatUint(usage+4<<20, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	backends := maps.FromKernel[uint32, bpfobj.SockLb4Backend](m)
	const batch = 1024
	ks, vs := make([]uint32, batch), make([]bpfobj.SockLb4Backend, batch)
	for n := uint32(0); n < ms.MaxEntries; n += batch {
		for i := range ks {
			ks[i] = n + uint32(i) + 1
		}
		if _, err := backends.PutBatch(ks, vs); err != nil {
			if !errors.Is(err, maps.ErrMapFull) || !strings.Contains(err.Error(), "lb4_backends_v1") || !strings.Contains(err.Error(), "memory limit") {
				t.Fatalf("after %d entries: %v, want a full map naming the map and the memory limit", n, err)
			}
			if n == 0 {
				t.Fatalf("refused the first entries: %v; the map should take 4 MiB of them", err)
			}
			t.Logf("refused after %d entries: %v", n, err)
			return
		}
	}
	t.Fatalf("%d entries in 4 MiB: the kernel charged nothing for them", ms.MaxEntries)
}

// memoryCgroup is a memory cgroup of the test's, under the host's v1
// hierarchy or its v2 one.
type memoryCgroup struct {
	root, dir    string // the hierarchy's mount, the cgroup
	limit, usage string // the names of its limit and usage files
	v1           bool
}

// newMemoryCgroup makes a memory cgroup under the host's v1 hierarchy, or
// its v2 one where that has the memory controller.
func newMemoryCgroup() (*memoryCgroup, error) {
	name := fmt.Sprintf("ebpf-proxy-maps-test-%d", os.Getpid())
	var mc memoryCgroup
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		mc = memoryCgroup{root: "/sys/fs/cgroup/memory", limit: "memory.limit_in_bytes", usage: "memory.usage_in_bytes", v1: true}
	} else if ctl, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && strings.Contains(string(ctl), "memory") {
		mc = memoryCgroup{root: "/sys/fs/cgroup", limit: "memory.max", usage: "memory.current"}
	} else {
		return nil, errors.New("no memory cgroup to limit the map with: neither cgroup v1's memory hierarchy nor cgroup v2's memory controller")
	}
	mc.dir = filepath.Join(mc.root, name)
	if err := os.Mkdir(mc.dir, 0o755); err != nil {
		return nil, err
	}
	return &mc, nil
}

// current is the memory cgroup this process is in.
func (mc *memoryCgroup) current() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// hierarchy-ID:controllers:path
		fields := strings.SplitN(s.Text(), ":", 3)
		if len(fields) != 3 {
			continue
		}
		if (mc.v1 && fields[1] == "memory") || (!mc.v1 && fields[0] == "0") {
			return filepath.Join(mc.root, fields[2]), nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", errors.New("/proc/self/cgroup names no memory cgroup of this process")
}

// enter moves this process into the cgroup dir.
func (mc *memoryCgroup) enter(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// read is the number in the cgroup's file.
func (mc *memoryCgroup) read(file string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(mc.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}
