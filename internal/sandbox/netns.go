package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2 looks for named namespaces, so that
// `ip netns exec` works on ours while debugging.
const netnsDir = "/run/netns"

// Netns is a named network namespace, bind-mounted under /run/netns.
type Netns struct {
	name   string
	path   string
	inode  uint64
	handle netns.NsHandle
	nl     *netlink.Handle

	closeOnce sync.Once
	closeErr  error
}

// NewNetns creates a network namespace named "ebpt-<6 hex>-<name>" with its
// loopback interface up. The caller must Close it.
func NewNetns(name string) (*Netns, error) {
	if err := checkHostName(name); err != nil {
		return nil, err
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	return newNetns(id + "-" + name)
}

// newNetns creates the namespace under its full name.
func newNetns(name string) (_ *Netns, err error) {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", netnsDir, err)
	}
	path := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	n := &Netns{name: name, path: path, handle: netns.None()}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Close())
		}
	}()
	if err := bindNewNetns(path); err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	if n.handle, err = netns.GetFromPath(path); err != nil {
		return nil, fmt.Errorf("open netns %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(n.handle), &st); err != nil {
		return nil, fmt.Errorf("stat netns %s: %w", name, err)
	}
	n.inode = st.Ino
	if n.nl, err = netlink.NewHandleAt(n.handle); err != nil {
		return nil, fmt.Errorf("netlink in netns %s: %w", name, err)
	}
	lo, err := n.nl.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo in netns %s: %w", name, err)
	}
	if err := n.nl.LinkSetUp(lo); err != nil {
		return nil, fmt.Errorf("set lo up in netns %s: %w", name, err)
	}
	return n, nil
}

// bindNewNetns creates a network namespace and bind-mounts it on path. It
// unshares on a dedicated OS thread that is never unlocked: the Go runtime
// ends a locked thread together with its goroutine, so no other goroutine
// can ever run inside the new namespace by accident.
func bindNewNetns(path string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount on %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// Name returns the namespace's name, as `ip netns list` shows it.
func (n *Netns) Name() string { return n.name }

// Path returns the namespace's bind mount, /run/netns/<name>.
func (n *Netns) Path() string { return n.path }

// Inode returns the inode number that identifies the namespace, as in
// `stat -L /proc/<pid>/ns/net`.
func (n *Netns) Inode() uint64 { return n.inode }

// Handle returns an open handle to the namespace, valid until Close.
func (n *Netns) Handle() netns.NsHandle { return n.handle }

// Netlink returns a netlink handle operating inside the namespace, valid
// until Close.
func (n *Netns) Netlink() *netlink.Handle { return n.nl }

// Do runs fn on an OS thread switched into the namespace and switches the
// thread back afterwards. Sockets created by fn belong to the namespace for
// their whole life; goroutines started by fn do not run in it. If the thread
// cannot be switched back it is discarded rather than reused. A panic in fn
// is re-raised in the caller.
func (n *Netns) Do(fn func() error) error {
	type outcome struct {
		err   error
		panic any
	}
	done := make(chan outcome, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- outcome{err: fmt.Errorf("get current netns: %w", err)}
			return
		}
		defer orig.Close()
		if err := netns.Set(n.handle); err != nil {
			done <- outcome{err: fmt.Errorf("enter netns %s: %w", n.name, err)}
			return
		}
		var out outcome
		func() {
			defer func() { out.panic = recover() }()
			out.err = fn()
		}()
		if err := netns.Set(orig); err != nil {
			// Returning with the thread locked makes the runtime end it.
			out.err = errors.Join(out.err, fmt.Errorf("leave netns %s: %w", n.name, err))
			done <- out
			return
		}
		runtime.UnlockOSThread()
		done <- out
	}()
	out := <-done
	if out.panic != nil {
		panic(out.panic)
	}
	return out.err
}

// Start starts cmd inside the namespace: the child inherits the namespace
// of the thread that forks it.
//
// The forking thread is locked, switched into the namespace and kept until
// the child has exited, then discarded. The kernel ties a parent-death
// signal (SysProcAttr.Pdeathsig) to the thread that forked, not to the
// process: forked from a pooled thread, a child would be killed as soon as
// the runtime ended that thread, which it does whenever some other
// goroutine locks it and exits (creating a namespace does).
func (n *Netns) Start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with this goroutine,
		// and it never runs other goroutines in the namespace.
		runtime.LockOSThread()
		if err := netns.Set(n.handle); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.name, err)
			return
		}
		if err := cmd.Start(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			return // gone already (ESRCH): nothing to keep alive
		}
		defer unix.Close(pidfd)
		// A pidfd becomes readable when the process exits.
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return <-errc
}

// Close deletes the namespace's name. The kernel frees the namespace, with
// the interfaces inside it, once no socket or process uses it any more.
// Close is idempotent and also cleans up a half-created namespace.
func (n *Netns) Close() error {
	n.closeOnce.Do(func() {
		var errs []error
		if n.nl != nil {
			n.nl.Close()
		}
		if n.handle.IsOpen() {
			if err := n.handle.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close netns %s handle: %w", n.name, err))
			}
		}
		if err := unix.Unmount(n.path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount netns %s: %w", n.name, err))
		}
		if err := os.Remove(n.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove netns %s: %w", n.name, err))
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}
