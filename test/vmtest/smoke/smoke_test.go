package smoke

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

func inVM() bool { return os.Getenv("EBPF_PROXY_VMTEST") != "" }

func release(t *testing.T) string {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatalf("uname: %v", err)
	}
	return unix.ByteSliceToString(uts.Release[:])
}

func fsType(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatalf("statfs %s: %v", path, err)
	}
	return st.Type
}

func TestGuestEnvironment(t *testing.T) {
	if !inVM() {
		t.Skip("checks the vmtest guest's set-up; EBPF_PROXY_VMTEST is not set, so this is not the guest")
	}
	rel := release(t)
	tests := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"runs as root", func(t *testing.T) {
			if uid := os.Geteuid(); uid != 0 {
				t.Errorf("euid %d, want 0", uid)
			}
		}},
		{"bpffs is mounted at /sys/fs/bpf", func(t *testing.T) {
			if got := fsType(t, "/sys/fs/bpf"); got != unix.BPF_FS_MAGIC {
				t.Errorf("/sys/fs/bpf has file system type %#x, want bpffs %#x", got, unix.BPF_FS_MAGIC)
			}
		}},
		{"cgroup2 is mounted at /sys/fs/cgroup", func(t *testing.T) {
			if got := fsType(t, "/sys/fs/cgroup"); got != unix.CGROUP2_SUPER_MAGIC {
				t.Errorf("/sys/fs/cgroup has file system type %#x, want cgroup2 %#x", got, unix.CGROUP2_SUPER_MAGIC)
			}
		}},
		{"modules of the running kernel are in /lib/modules", func(t *testing.T) {
			if _, err := os.Stat(filepath.Join("/lib/modules", rel, "modules.dep")); err != nil {
				t.Error(err)
			}
		}},
		{"config of the running kernel is in /boot", func(t *testing.T) {
			if _, err := os.Stat("/boot/config-" + rel); err != nil {
				t.Error(err)
			}
		}},
		{"kernel BTF is available", func(t *testing.T) {
			if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
				t.Error(err)
			}
		}},
		{"dataplane modules are loaded", func(t *testing.T) {
			for _, m := range []string{"veth", "bridge", "sch_ingress", "cls_bpf", "ip_vs", "ip_vs_rr", "ip_vs_sh", "nf_conntrack", "nf_nat", "iptable_nat", "ip_set"} {
				if _, err := os.Stat(filepath.Join("/sys/module", m)); err != nil {
					t.Errorf("module %s is not loaded: %v", m, err)
				}
			}
		}},
		{"the root file system is writable", func(t *testing.T) {
			// /etc is on the overlay: the write lands in the
			// guest's tmpfs, QEMU shares the host's root read-only.
			path := "/etc/vmtest-smoke-write"
			if err := os.WriteFile(path, []byte("guest"), 0o644); err != nil {
				t.Fatalf("write %s: %v", path, err)
			}
			if err := os.Remove(path); err != nil {
				t.Fatalf("remove %s: %v", path, err)
			}
		}},
		{"host network namespaces do not leak into /run", func(t *testing.T) {
			if entries, err := os.ReadDir("/run/netns"); err == nil && len(entries) > 0 {
				t.Errorf("/run/netns holds %d entries in a fresh guest", len(entries))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.check)
	}
}

// TestLoopbackCarriesTraffic holds on the host and in the guest, whose
// kernel starts with loopback down until the runner sets it up.
func TestLoopbackCarriesTraffic(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = c.Write([]byte("x"))
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial %s: %v", ln.Addr(), err)
	}
	defer c.Close()
	buf := make([]byte, 1)
	if _, err := c.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("read from loopback server: %q, %v", buf, err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// TestRunsInPackageDirectory holds as under go test: the runner starts each
// test binary in its package's source directory, so testdata paths work.
func TestRunsInPackageDirectory(t *testing.T) {
	if _, err := os.Stat("smoke_test.go"); err != nil {
		wd, _ := os.Getwd()
		t.Fatalf("working directory %s is not the package directory: %v", wd, err)
	}
}

// TestBPFMapRoundTrip creates a BPF hash map and reads back what it wrote:
// the BPF syscall works for the library the project uses, on every kernel.
func TestBPFMapRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("creating BPF maps needs root; CI and the VM run as root")
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 4})
	if err != nil {
		t.Fatalf("create map: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Put(uint32(7), uint64(0xdeadbeef)); err != nil {
		t.Fatalf("put: %v", err)
	}
	var got uint64
	if err := m.Lookup(uint32(7), &got); err != nil {
		t.Fatalf("lookup: %v", err)
	}
	if got != 0xdeadbeef {
		t.Errorf("lookup returned %#x, want 0xdeadbeef", got)
	}
}
