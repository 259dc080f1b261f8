package testbed

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// MemoryCgroup is a memory cgroup the testbed made for one proxy, so that
// what the proxy costs a node is read whole. Its resident set leaves out
// the kernel memory it causes, which the kernel charges to a memory
// cgroup: a BPF map to the cgroup of the process that creates it,
// netfilter rules and sets to the cgroup of the process that installs them
// (kube-proxy's iptables-restore and nft children inherit its cgroup). A
// DaemonSet's memory limit counts the same.
type MemoryCgroup struct {
	// dir is the cgroup's directory, name its path in the hierarchy as
	// /proc/<pid>/cgroup shows it.
	dir, name string
	v2        bool

	mu      sync.Mutex
	removed bool
}

// MemoryPeak is the most memory charged to a cgroup since it was made.
type MemoryPeak struct {
	// Bytes is the peak of everything charged: the processes' pages, the
	// page cache they filled, and kernel memory (BPF maps, netfilter
	// objects, socket buffers).
	Bytes uint64
	// Kernel is the peak of the kernel memory alone, when HasKernel: only
	// cgroup v1 keeps it (memory.kmem.max_usage_in_bytes); cgroup v2 has
	// no peak of its own for it.
	Kernel    uint64
	HasKernel bool
}

// cgroupMount is where the host mounts its cgroup hierarchies.
const cgroupMount = "/sys/fs/cgroup"

// The files a memory cgroup's peaks are read from.
const (
	v1Peak       = "memory.max_usage_in_bytes"
	v1KernelPeak = "memory.kmem.max_usage_in_bytes"
	v2Peak       = "memory.peak"
)

// Bounds for Remove: the last process leaves a cgroup within milliseconds
// of its death; the bounds only keep a wedged kernel from hanging the test.
const (
	cgroupRemovePolls    = 200
	cgroupRemoveInterval = 25 * time.Millisecond
)

// NewMemoryCgroup makes the memory cgroup ebpf-proxy-bench-LABEL-<unique>
// at the root of the host's memory hierarchy: cgroup v1's
// /sys/fs/cgroup/memory when it is mounted (a hybrid host keeps the memory
// controller there), else cgroup v2's /sys/fs/cgroup when its memory
// controller is enabled for children. It fails when neither is, rather
// than measure less. The caller must Remove it.
func NewMemoryCgroup(label string) (*MemoryCgroup, error) {
	return newMemoryCgroup(cgroupMount, fmt.Sprintf("ebpf-proxy-bench-%s-%d-%08x", label, os.Getpid(), rand.Uint32()))
}

func newMemoryCgroup(mount, name string) (*MemoryCgroup, error) {
	root, v2, err := memoryHierarchy(mount)
	if err != nil {
		return nil, err
	}
	c := &MemoryCgroup{dir: filepath.Join(root, name), name: "/" + name, v2: v2}
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create memory cgroup: %w", err)
	}
	// A kernel before 5.19 has no memory.peak: no figure, and no test
	// that pretends to have one.
	if _, err := os.Stat(filepath.Join(c.dir, c.peakFile())); err != nil {
		return nil, errors.Join(fmt.Errorf("memory cgroup %s: no peak to read: %w", c.dir, err), c.Remove())
	}
	return c, nil
}

// memoryHierarchy returns the root of the memory cgroup hierarchy under
// mount and whether it is cgroup v2. Version 1 comes first: a hybrid host
// mounts both, and its v2 hierarchy then has no memory controller.
func memoryHierarchy(mount string) (root string, v2 bool, err error) {
	v1 := filepath.Join(mount, "memory")
	if _, err := os.Stat(filepath.Join(v1, v1Peak)); err == nil {
		return v1, false, nil
	}
	ctl, err := os.ReadFile(filepath.Join(mount, "cgroup.subtree_control"))
	if err == nil && slices.Contains(strings.Fields(string(ctl)), "memory") {
		return mount, true, nil
	}
	return "", false, fmt.Errorf("no memory cgroup to measure a proxy in: neither cgroup v1's memory hierarchy (%s) "+
		"nor cgroup v2 at %s with the memory controller enabled for children (cgroup.subtree_control)", filepath.Join(v1, v1Peak), mount)
}

func (c *MemoryCgroup) peakFile() string {
	if c.v2 {
		return v2Peak
	}
	return v1Peak
}

// Path is the cgroup's directory.
func (c *MemoryCgroup) Path() string { return c.dir }

// Wrap returns the command line that runs bin with args inside the
// cgroup: a shell writes its own PID into the cgroup, then executes bin in
// its place, so that the program is charged from its first page on and
// keeps the PID the caller sees. Should the write fail, the shell says why
// and exits with an error, and bin never runs.
func (c *MemoryCgroup) Wrap(bin string, args ...string) (string, []string) {
	return "/bin/sh", append([]string{"-c", `echo $$ >"$1" && shift && exec "$@"`, "sh",
		filepath.Join(c.dir, "cgroup.procs"), bin}, args...)
}

// EvictPageCache drops the clean, unmapped pages of file path from the
// page cache. A page is charged to the memory cgroup of the process that
// first brought it in, and stays charged there: without this, a proxy's
// text would count in the cgroup of whichever process read its binary
// first (the previous run's, the build's), and a proxy started second
// would be charged for less than one started first. After it, the pages
// the proxy runs are charged to its own cgroup, as they are to a
// DaemonSet's container on its first start. Pages mapped by a running
// process stay.
func EvictPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("evict %s from the page cache: %w", path, err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("evict %s from the page cache: %w", path, err)
	}
	return nil
}

// Peak reads the cgroup's peaks.
func (c *MemoryCgroup) Peak() (MemoryPeak, error) {
	var p MemoryPeak
	var err error
	if p.Bytes, err = readBytesFile(filepath.Join(c.dir, c.peakFile())); err != nil {
		return p, err
	}
	if c.v2 {
		return p, nil
	}
	p.Kernel, err = readBytesFile(filepath.Join(c.dir, v1KernelPeak))
	switch {
	case err == nil:
		p.HasKernel = true
	case errors.Is(err, os.ErrNotExist):
		err = nil // a kernel without kernel memory accounting for v1
	}
	return p, err
}

// readBytesFile reads a cgroup file holding one number of bytes.
func readBytesFile(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read memory cgroup peak: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}

// Remove removes the cgroup, once its processes are gone: the caller has
// stopped the one it started, and those it started in turn (an
// iptables-restore of a kube-proxy stopped mid-sync) get a moment to end
// before they are killed. Memory still charged (a BPF map pinned
// elsewhere) stays charged to the removed cgroup; Remove is meant to
// follow the proxy's cleanup. It is idempotent.
func (c *MemoryCgroup) Remove() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil
	}
	var err error
	for i := range cgroupRemovePolls {
		if err = unix.Rmdir(c.dir); err == nil || errors.Is(err, unix.ENOENT) {
			c.removed = true
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		if i >= cgroupRemovePolls/4 {
			if kerr := c.killProcs(); kerr != nil {
				return fmt.Errorf("remove memory cgroup %s: %w", c.dir, kerr)
			}
		}
		time.Sleep(cgroupRemoveInterval)
	}
	return fmt.Errorf("remove memory cgroup %s: %w", c.dir, err)
}

// killProcs sends SIGKILL to every process still in the cgroup. Only the
// testbed puts processes there. The pidfd pins a process, so that one
// whose PID was reused since cgroup.procs was read fails the membership
// check instead of being signalled.
func (c *MemoryCgroup) killProcs() error {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("parse cgroup.procs %q: %w", f, err)
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		if c.holds(pid) {
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				unix.Close(fd)
				return fmt.Errorf("kill %d: %w", pid, err)
			}
		}
		unix.Close(fd)
	}
	return nil
}

// holds reports whether process pid is in the cgroup, by its
// /proc/<pid>/cgroup line of the memory hierarchy.
func (c *MemoryCgroup) holds(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	return inCgroup(string(b), c.name, c.v2)
}

// inCgroup reports whether the /proc/<pid>/cgroup text procCgroup places
// the process in the memory cgroup name: its "N:memory:" line on cgroup v1
// (or a line naming memory among other controllers), its "0::" line on v2.
func inCgroup(procCgroup, name string, v2 bool) bool {
	for line := range strings.SplitSeq(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[2] != name {
			continue
		}
		if v2 && parts[0] == "0" && parts[1] == "" {
			return true
		}
		if !v2 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			return true
		}
	}
	return false
}
