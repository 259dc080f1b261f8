package maps_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// envMemoryChild makes the test binary the child of
// TestAMapOutOfMemoryIsAFullMapNamingTheLimit: it runs in the memory
// cgroup named by the variable.
const envMemoryChild = "EBPF_PROXY_TEST_MEMORY_CHILD"

// A map that is not preallocated takes memory for each entry it is given,
// charged to the memory cgroup of the agent's container: at its limit, an
// insert fails. The agent says so, naming the map and the limit, and the
// failure is a full map's (the Writer keeps what was programmed and
// retries entry by entry).
func TestAMapOutOfMemoryIsAFullMapNamingTheLimit(t *testing.T) {
	if cg := os.Getenv(envMemoryChild); cg != "" {
		memoryChild(t, cg)
		return
	}
	sandbox.RequireRoot(t)
	cg, limitFile, usageFile, err := newMemoryCgroup()
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cg)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAMapOutOfMemoryIsAFullMapNamingTheLimit$", "-test.v")
	cmd.Env = append(os.Environ(), envMemoryChild+"="+strings.Join([]string{cg, limitFile, usageFile}, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
}

// memoryChild moves this process into the cgroup, limits it to what it
// uses and 4 MiB more, then fills a map that is not preallocated until the
// kernel refuses an entry.
func memoryChild(t *testing.T, arg string) {
	parts := strings.Split(arg, ",")
	cg, limitFile, usageFile := parts[0], parts[1], parts[2]
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := bpfobj.LoadSock()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[bpfobj.SockMapLb4BackendsV1].Copy()
	ms.Pinning, ms.MaxEntries = ebpf.PinNone, 1<<20
	m, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b, err := os.ReadFile(filepath.Join(cg, usageFile))
	if err != nil {
		t.Fatal(err)
	}
	usage, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cg, limitFile), []byte(strconv.FormatUint(usage+4<<20, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	backends := maps.FromKernel[uint32, bpfobj.SockLb4Backend](m)
	const batch = 1024
	for n := uint32(0); n < ms.MaxEntries; n += batch {
		ks, vs := make([]uint32, batch), make([]bpfobj.SockLb4Backend, batch)
		for i := range ks {
			ks[i] = n + uint32(i) + 1
		}
		if _, err := backends.PutBatch(ks, vs); err != nil {
			if !errors.Is(err, maps.ErrMapFull) || !strings.Contains(err.Error(), "lb4_backends_v1") || !strings.Contains(err.Error(), "memory limit") {
				t.Fatalf("after %d entries: %v, want a full map naming the map and the memory limit", n, err)
			}
			fmt.Printf("refused after %d entries: %v\n", n, err)
			return
		}
	}
	t.Fatalf("%d entries in 4 MiB: the kernel charged nothing for them", ms.MaxEntries)
}

// newMemoryCgroup makes a memory cgroup under the host's v1 hierarchy, or
// its v2 one where that has the memory controller, and returns it with the
// names of its limit and usage files.
func newMemoryCgroup() (dir, limit, usage string, err error) {
	name := fmt.Sprintf("ebpf-proxy-maps-test-%d", os.Getpid())
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		dir = filepath.Join("/sys/fs/cgroup/memory", name)
		limit, usage = "memory.limit_in_bytes", "memory.usage_in_bytes"
	} else if ctl, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && strings.Contains(string(ctl), "memory") {
		dir = filepath.Join("/sys/fs/cgroup", name)
		limit, usage = "memory.max", "memory.current"
	} else {
		return "", "", "", errors.New("no memory cgroup to limit the test's process with: neither cgroup v1's memory hierarchy nor cgroup v2's memory controller")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", "", "", err
	}
	return dir, limit, usage, nil
}
