package sandbox

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// privateMount mounts a filesystem of type fstype on a fresh temporary
// directory whose name starts with prefix.
type privateMount struct {
	dir     string
	fstype  string
	mounted bool
}

func newPrivateMount(prefix, fstype string) (*privateMount, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", fstype, err)
	}
	m := &privateMount{dir: dir, fstype: fstype}
	if err := unix.Mount(fstype, dir, fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, errors.Join(fmt.Errorf("mount %s on %s: %w", fstype, dir, err), m.close())
	}
	m.mounted = true
	return m, nil
}

// close unmounts and removes the directory. A lazy unmount is the fallback
// for a mount still busy, so that the directory never stays mounted.
func (m *privateMount) close() error {
	var errs []error
	if m.mounted {
		if err := unix.Unmount(m.dir, 0); err != nil {
			if err2 := unix.Unmount(m.dir, unix.MNT_DETACH); err2 != nil {
				errs = append(errs, fmt.Errorf("unmount %s on %s: %w", m.fstype, m.dir, errors.Join(err, err2)))
			}
		}
		m.mounted = false
	}
	if len(errs) == 0 {
		if err := os.Remove(m.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", m.dir, err))
		}
	}
	return errors.Join(errs...)
}
