package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// netnsDir is where iproute2 looks for named namespaces, so that
// `ip netns exec` works on ours while debugging.
const netnsDir = "/run/netns"

// Netns is a named network namespace, bind-mounted under /run/netns.
type Netns struct {
	name   string
	path   string
	inode  uint64
	handle vnetns.NsHandle
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
	if err := netns.PrepareDir(netnsDir); err != nil {
		return nil, err
	}
	path := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	n := &Netns{name: name, path: path, handle: vnetns.None()}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Close())
		}
	}()
	if n.handle, err = netns.New(path); err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
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

// Name returns the namespace's name, as `ip netns list` shows it.
func (n *Netns) Name() string { return n.name }

// Path returns the namespace's bind mount, /run/netns/<name>.
func (n *Netns) Path() string { return n.path }

// Inode returns the inode number that identifies the namespace, as in
// `stat -L /proc/<pid>/ns/net`.
func (n *Netns) Inode() uint64 { return n.inode }

// Handle returns an open handle to the namespace, valid until Close.
func (n *Netns) Handle() vnetns.NsHandle { return n.handle }

// Netlink returns a netlink handle operating inside the namespace, valid
// until Close.
func (n *Netns) Netlink() *netlink.Handle { return n.nl }

// Do runs fn on an OS thread switched into the namespace (netns.Do):
// sockets created by fn belong to the namespace for their whole life;
// goroutines started by fn do not run in it. A panic in fn is re-raised in
// the caller.
func (n *Netns) Do(fn func() error) error {
	return netns.DoHandle(n.handle, fn)
}

// Start starts cmd inside the namespace (netns.Start), from a thread kept
// until cmd has exited, so that its SysProcAttr.Pdeathsig fires only when
// the test binary dies.
func (n *Netns) Start(cmd *exec.Cmd) error {
	return netns.StartHandle(n.handle, cmd)
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

// TestNetns is NewNetns for a test: it requires root (RequireRoot), fails tb
// if the namespace cannot be made and removes it when tb ends.
func TestNetns(tb testing.TB, name string) *Netns {
	tb.Helper()
	RequireRoot(tb)
	ns, err := NewNetns(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := ns.Close(); err != nil {
			tb.Errorf("remove netns %s: %v", ns.Name(), err)
		}
	})
	return ns
}
