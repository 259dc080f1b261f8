package bpf

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFindCgroup2Mount(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo, want string
	}{
		{"unified hierarchy",
			"24 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n", "/sys/fs/cgroup"},
		{"hybrid: the unified mount among v1 ones",
			"30 24 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n31 24 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup/unified"},
		{"escaped path", "40 1 0:30 / /run/my\\040cgroup rw - cgroup2 none rw\n", "/run/my cgroup"},
		{"none mounted", "22 1 0:21 / /proc rw - proc proc rw\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "mountinfo")
			if err := os.WriteFile(p, []byte(tc.mountinfo), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := findCgroup2Mount(p)
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
