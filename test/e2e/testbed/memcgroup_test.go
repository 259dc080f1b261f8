package testbed

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// writeFiles makes the files of files (path relative to dir: content)
// with their directories.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMemoryHierarchyIsChosenAtRunTime(t *testing.T) {
	for _, c := range []struct {
		name    string
		files   map[string]string
		want    string // the root under the mount; "" when none
		wantV2  bool
		wantErr string
	}{
		{name: "cgroup v1: its memory hierarchy",
			files: map[string]string{"memory/memory.max_usage_in_bytes": "0\n"}, want: "memory"},
		{name: "hybrid, memory in v1: v1, although v2 is mounted",
			files: map[string]string{"memory/memory.max_usage_in_bytes": "0\n", "unified/cgroup.subtree_control": "\n"}, want: "memory"},
		{name: "cgroup v2 with memory for children: the mount's root",
			files: map[string]string{"cgroup.subtree_control": "cpuset cpu io memory pids\n"}, want: ".", wantV2: true},
		{name: "cgroup v2 without memory for children: an error, not a skip",
			files: map[string]string{"cgroup.subtree_control": "cpu io pids\n"}, wantErr: "no memory cgroup"},
		{name: "no cgroup at all: an error",
			files: map[string]string{"other": ""}, wantErr: "no memory cgroup"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mount := t.TempDir()
			writeFiles(t, mount, c.files)
			root, v2, err := memoryHierarchy(mount)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got %s (v2 %t), error %v; want an error saying %q", root, v2, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(mount, c.want); root != want || v2 != c.wantV2 {
				t.Errorf("got %s (v2 %t), want %s (v2 %t)", root, v2, want, c.wantV2)
			}
		})
	}
}

func TestMemoryCgroupPeak(t *testing.T) {
	for _, c := range []struct {
		name    string
		v2      bool
		files   map[string]string
		want    MemoryPeak
		wantErr bool
	}{
		{name: "v1: the whole peak and its kernel part",
			files: map[string]string{v1Peak: "104857600\n", v1KernelPeak: "41943040\n"},
			want:  MemoryPeak{Bytes: 100 << 20, Kernel: 40 << 20, HasKernel: true}},
		{name: "v1 without kernel memory accounting: the whole peak alone",
			files: map[string]string{v1Peak: "104857600\n"}, want: MemoryPeak{Bytes: 100 << 20}},
		{name: "v2: memory.peak, no kernel part",
			v2: true, files: map[string]string{v2Peak: "2097152\n", v1KernelPeak: "1"}, want: MemoryPeak{Bytes: 2 << 20}},
		{name: "v2 without memory.peak: an error",
			v2: true, files: map[string]string{v1Peak: "1\n"}, wantErr: true},
		{name: "a peak that is not a number: an error",
			files: map[string]string{v1Peak: "max\n"}, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, c.files)
			got, err := (&MemoryCgroup{dir: dir, v2: c.v2}).Peak()
			if c.wantErr {
				if err == nil {
					t.Fatalf("got %+v, want an error", got)
				}
				return
			}
			if err != nil || got != c.want {
				t.Errorf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestInCgroup(t *testing.T) {
	const v1 = "9:name=systemd:/\n4:memory:/ebpf-proxy-bench-x\n1:cpu:/\n0::/\n"
	for _, c := range []struct {
		name, proc, cgroup string
		v2, want           bool
	}{
		{"v1: the memory line names it", v1, "/ebpf-proxy-bench-x", false, true},
		{"v1: another cgroup", v1, "/ebpf-proxy-bench-y", false, false},
		{"v1: memory among other controllers", "3:cpu,memory:/ebpf-proxy-bench-x\n", "/ebpf-proxy-bench-x", false, true},
		{"v1: the path under another controller only", "3:cpu:/ebpf-proxy-bench-x\n4:memory:/\n", "/ebpf-proxy-bench-x", false, false},
		{"v2: the 0:: line names it", "0::/ebpf-proxy-bench-x\n", "/ebpf-proxy-bench-x", true, true},
		{"v2: a v1 line does not count", "4:memory:/ebpf-proxy-bench-x\n0::/\n", "/ebpf-proxy-bench-x", true, false},
	} {
		if got := inCgroup(c.proc, c.cgroup, c.v2); got != c.want {
			t.Errorf("%s: inCgroup = %t, want %t", c.name, got, c.want)
		}
	}
}

// TestMemoryCgroupHoldsWhatItRuns runs a program through Wrap on the host:
// it is in the cgroup as it starts, the page cache it fills is charged
// there until EvictPageCache drops it, and Remove removes the cgroup.
func TestMemoryCgroupHoldsWhatItRuns(t *testing.T) {
	sandbox.RequireRoot(t)
	c, err := NewMemoryCgroup("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Remove(); err != nil {
			t.Error(err)
		}
	})
	file := filepath.Join(t.TempDir(), "fill")
	bin, args := c.Wrap("/bin/sh", "-c", `cat /proc/self/cgroup && dd if=/dev/zero of="$1" bs=1M count=16 conv=fsync status=none`, "sh", file)
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !inCgroup(string(out), c.name, c.v2) {
		t.Errorf("the program ran in\n%s\nnot in %s", out, c.name)
	}
	peak, err := c.Peak()
	if err != nil {
		t.Fatal(err)
	}
	if peak.Bytes < 16<<20 {
		t.Errorf("peak %d bytes after writing 16 MiB to a file, want at least that", peak.Bytes)
	}
	if peak.HasKernel && (peak.Kernel == 0 || peak.Kernel > peak.Bytes) {
		t.Errorf("kernel part %d of a peak of %d: want some (the processes' page tables), and no more than the whole", peak.Kernel, peak.Bytes)
	}
	// Written back (fsync), the file's pages are clean: evicted, they are
	// no longer charged. Pages of tmpfs are not page cache to evict.
	var fs unix.Statfs_t
	if err := unix.Statfs(file, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		usage := filepath.Join(c.Path(), map[bool]string{false: "memory.usage_in_bytes", true: "memory.current"}[c.v2])
		before, err := readBytesFile(usage)
		if err != nil {
			t.Fatal(err)
		}
		if err := EvictPageCache(file); err != nil {
			t.Fatal(err)
		}
		after, err := readBytesFile(usage)
		if err != nil {
			t.Fatal(err)
		}
		if before < after+12<<20 {
			t.Errorf("charged %d bytes before evicting a file of 16 MiB, %d after: want at least 12 MiB less", before, after)
		}
	}
	if err := c.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Path()); !os.IsNotExist(err) {
		t.Errorf("%s after Remove: %v, want it gone", c.Path(), err)
	}
}
