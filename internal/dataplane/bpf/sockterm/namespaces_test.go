package sockterm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func inodeOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestNodeNamespacesFindsEveryNamespaceOnce(t *testing.T) {
	sandbox.RequireRoot(t)
	tests := []struct {
		name string
		// setUp makes a namespace and returns the path it is expected under.
		setUp func(t *testing.T) string
	}{
		{"the agent's own namespace", func(*testing.T) string {
			return filepath.Join(ProcDir, strconv.Itoa(os.Getpid()), "ns", "net")
		}},
		{"a namespace held only by a process", func(t *testing.T) string {
			// Bounded by its own lifetime should the test binary die.
			cmd := exec.Command("sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			return filepath.Join(ProcDir, strconv.Itoa(cmd.Process.Pid), "ns", "net")
		}},
		{"a namespace held only by a bind mount", func(t *testing.T) string {
			ns, err := sandbox.NewNetns("lister")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ns.Close() })
			return ns.Path()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.setUp(t)
			want := inodeOf(t, path)
			got, err := NodeNamespaces(t.Context())
			// Some machines shield a process from root; see
			// TestTerminateSearchesEveryNamespaceOfTheNode.
			if err != nil && !errors.Is(err, ErrNamespaceAccess) {
				t.Fatalf("NodeNamespaces: %v", err)
			}
			seen := map[uint64]string{}
			found := false
			for _, ns := range got {
				if other, dup := seen[ns.Inode]; dup {
					t.Errorf("namespace %d listed twice, as %s and %s", ns.Inode, other, ns.Path)
				}
				seen[ns.Inode] = ns.Path
				if ns.Inode == want {
					found = true
					if inodeOf(t, ns.Path) != want {
						t.Errorf("namespace %d listed with path %s, which leads elsewhere", want, ns.Path)
					}
				}
			}
			if !found {
				t.Errorf("NodeNamespaces (%d namespaces) does not list %s (inode %d)", len(got), path, want)
			}
		})
	}
}

func TestAMountPointWithoutItsNamespaceIsSkipped(t *testing.T) {
	procDir, netnsDir := t.TempDir(), t.TempDir()
	// What `ip netns delete` leaves when the file cannot be removed, and
	// what `ip netns add` has before it mounts.
	if err := os.WriteFile(filepath.Join(netnsDir, "stale"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	got, err := listNamespaces(t.Context(), procDir, netnsDir)
	if err != nil || len(got) != 0 {
		t.Errorf("listNamespaces = %+v, %v; want nothing and no error", got, err)
	}
	// Before any named namespace exists there is no directory at all.
	got, err = listNamespaces(t.Context(), procDir, filepath.Join(netnsDir, "missing"))
	if err != nil || len(got) != 0 {
		t.Errorf("listNamespaces without the directory = %+v, %v; want nothing and no error", got, err)
	}
}
