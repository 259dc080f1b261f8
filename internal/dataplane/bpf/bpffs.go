package bpf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// ensureBPFFS makes sure that path (--bpffs-path) lies on a bpf
// filesystem, where maps and links can be pinned. A node with no bpffs
// mounted (none at /sys/fs/bpf: some distributions, and a fresh VM) gets
// one mounted on path's parent, as Cilium's agent mounts its own, rather
// than a dataplane that cannot pin and so falls back. The parent must not
// hold anything (the empty /sys/fs/bpf directory of sysfs, or nothing
// there yet): a bpffs mounted over files would hide them. The mount stays
// when the agent exits, as the pins in it must for the programs to keep
// serving; with the DaemonSet's Bidirectional mount of /sys/fs/bpf it is
// the node's.
func ensureBPFFS(path string, log *zap.Logger) error {
	path = filepath.Clean(path)
	on, err := onBPFFS(path)
	if err != nil || on {
		return err
	}
	dir := filepath.Dir(path)
	if dir == path {
		return fmt.Errorf("--bpffs-path %s is not on a bpf filesystem, and has no parent to mount one on", path)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--bpffs-path %s is not on a bpf filesystem: create %s to mount one: %w", path, dir, err)
	}
	if empty, err := emptyDir(dir); err != nil {
		return fmt.Errorf("--bpffs-path %s is not on a bpf filesystem: %w", path, err)
	} else if !empty {
		return fmt.Errorf("--bpffs-path %s is not on a bpf filesystem, and %s is not empty: mount bpffs there (mount -t bpf bpffs %s) or choose a path on one", path, dir, dir)
	}
	if err := unix.Mount("bpffs", dir, "bpf", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		return fmt.Errorf("--bpffs-path %s is not on a bpf filesystem: mount bpffs on %s: %w", path, dir, err)
	}
	log.Info("mounted a bpf filesystem: none was mounted where the maps are pinned", zap.String("mountPoint", dir), zap.String("bpffsPath", path))
	return nil
}

// onBPFFS reports whether path, or the nearest of its ancestors that
// exists, is on a bpf filesystem: the directories under a bpffs that the
// loader creates are on it too.
func onBPFFS(path string) (bool, error) {
	for p := path; ; p = filepath.Dir(p) {
		var fs unix.Statfs_t
		err := unix.Statfs(p, &fs)
		if err == nil {
			return fs.Type == unix.BPF_FS_MAGIC, nil
		}
		if !errors.Is(err, unix.ENOENT) || filepath.Dir(p) == p {
			return false, fmt.Errorf("--bpffs-path %s: %w", path, err)
		}
	}
}

// emptyDir reports whether dir holds no entry.
func emptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); errors.Is(err, io.EOF) {
		return true, nil
	} else if err != nil {
		return false, err
	}
	return false, nil
}
