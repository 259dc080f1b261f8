package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup is a child cgroup created in a private cgroup v2 mount. It is the
// only cgroup a test may attach BPF programs to; nothing else in the
// hierarchy is written to.
type Cgroup struct {
	m       *privateMount
	name    string
	created bool
	dir     *os.File
	// child is set for a cgroup made by Sandbox.AddCgroup: it shares its
	// parent's mount, which its Close must leave alone.
	child bool

	closeOnce sync.Once
	closeErr  error
}

// Bounds for Close: processes die and leave the cgroup within milliseconds,
// the bounds only keep a wedged kernel from hanging the test binary.
const (
	cgroupDrainPolls    = 200
	cgroupDrainInterval = 25 * time.Millisecond
)

// NewCgroup mounts cgroup2 on a temporary directory and creates a uniquely
// named child cgroup in it. The caller must Close it.
func NewCgroup() (*Cgroup, error) {
	id, err := newID()
	if err != nil {
		return nil, err
	}
	return newCgroup(id)
}

func newCgroup(name string) (_ *Cgroup, err error) {
	// The mount shows the same single cgroup v2 hierarchy as
	// /sys/fs/cgroup(/unified); a private mount point only avoids depending on
	// where, or whether, the host mounted it.
	m, err := newPrivateMount(name+"-cgroup2-", "cgroup2")
	if err != nil {
		return nil, err
	}
	c := &Cgroup{m: m, name: name}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if err := os.Mkdir(c.Path(), 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	c.created = true
	if c.dir, err = os.OpenFile(c.Path(), os.O_RDONLY|syscall.O_DIRECTORY, 0); err != nil {
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	return c, nil
}

// newChild creates the cgroup name inside c, in c's mount.
func (c *Cgroup) newChild(name string) (_ *Cgroup, err error) {
	child := &Cgroup{m: c.m, name: c.name + "/" + name, child: true}
	defer func() {
		if err != nil {
			err = errors.Join(err, child.Close())
		}
	}()
	if err := os.Mkdir(child.Path(), 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", child.Name(), err)
	}
	child.created = true
	if child.dir, err = os.OpenFile(child.Path(), os.O_RDONLY|syscall.O_DIRECTORY, 0); err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", child.Name(), err)
	}
	return child, nil
}

// Path returns the child cgroup's directory, the path to attach cgroup BPF
// programs to.
func (c *Cgroup) Path() string { return filepath.Join(c.m.dir, c.name) }

// Name returns the child cgroup's path in the cgroup v2 hierarchy, as it
// appears in the "0::" line of /proc/<pid>/cgroup.
func (c *Cgroup) Name() string { return "/" + c.name }

// FD returns an open file descriptor of the child cgroup's directory, valid
// until Close, for SysProcAttr.CgroupFD or BPF attachment.
func (c *Cgroup) FD() int { return int(c.dir.Fd()) }

// Procs returns the PIDs of the processes in the child cgroup.
func (c *Cgroup) Procs() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(c.Path(), "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup.procs: %w", err)
	}
	var pids []int
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		pid, err := strconv.Atoi(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("parse cgroup.procs line %q: %w", sc.Text(), err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// Close kills the processes still in the child cgroup (only the sandbox puts
// processes there), removes the child, unmounts cgroup2 and removes the mount
// point. Close is idempotent and also cleans up a half-created cgroup.
func (c *Cgroup) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		if c.dir != nil {
			c.dir.Close()
		}
		if c.created {
			if err := c.drain(); err != nil {
				errs = append(errs, err)
			} else if err := c.remove(); err != nil {
				errs = append(errs, err)
			}
		}
		// Unmounting leaves the child cgroup in the hierarchy if it could not
		// be removed; the error above says so.
		if !c.child {
			if err := c.m.close(); err != nil {
				errs = append(errs, err)
			}
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// drain kills every process in the child cgroup and waits until it is empty.
func (c *Cgroup) drain() error {
	for range cgroupDrainPolls {
		pids, err := c.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := c.kill(pid); err != nil {
				return err
			}
		}
		time.Sleep(cgroupDrainInterval)
	}
	return fmt.Errorf("cgroup %s: processes still running after SIGKILL", c.Path())
}

// kill sends SIGKILL to pid if it is still in the child cgroup. The pidfd
// pins the process, so a PID recycled since cgroup.procs was read is never
// signalled: it is either gone (ESRCH) or fails the membership check.
func (c *Cgroup) kill(pid int) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	cg, err := processCgroup(pid)
	if err != nil || cg != c.Name() {
		return nil // gone, or not ours
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	return nil
}

// remove deletes the child cgroup. rmdir can report EBUSY for a moment after
// the last process died, until the kernel has released it.
func (c *Cgroup) remove() error {
	var err error
	for range cgroupDrainPolls {
		if err = unix.Rmdir(c.Path()); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(cgroupDrainInterval)
	}
	return fmt.Errorf("remove cgroup %s: %w", c.Path(), err)
}

// processCgroup returns the cgroup v2 path of a process, "self" included.
func processCgroup(pid any) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%v/cgroup", pid))
	if err != nil {
		return "", err
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("0::")); ok {
			return string(rest), nil
		}
	}
	return "", fmt.Errorf("process %v has no cgroup v2 entry", pid)
}
