package sockterm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Where NodeNamespaces looks for network namespaces.
const (
	// ProcDir is the node's /proc. The agent sees every process of the node
	// there only with hostPID: true in its DaemonSet.
	ProcDir = "/proc"
	// NetnsDir is where iproute2 and CNI plugins bind-mount named network
	// namespaces, which may have no process in them.
	NetnsDir = "/run/netns"
)

// Namespace is a network namespace to search.
type Namespace struct {
	// Path opens the namespace: /proc/<pid>/ns/net or a bind mount such as
	// /run/netns/<name>. It names the namespace in errors and logs.
	Path string
	// Inode identifies the namespace (as `stat -L` shows it). A path that
	// leads to another namespace by the time it is searched (its process
	// exited and the PID was reused) is skipped as vanished.
	Inode uint64
}

// NamespaceLister lists the network namespaces to search. It may return
// namespaces along with an error about others it could not read; Terminate
// searches those it got and reports the error.
type NamespaceLister func(ctx context.Context) ([]Namespace, error)

// NodeNamespaces lists every network namespace of the node, once each: those
// of all processes (/proc/<pid>/ns/net; a pod's namespace always holds at
// least its sandbox's pause process) and those bind-mounted under /run/netns.
// It is the default NamespaceLister.
//
// Running in a DaemonSet, the agent needs hostPID: true to see the node's
// processes, and a hostPath mount of /run/netns at the same path for
// namespaces without a process. hostNetwork puts the agent itself in the
// node's namespace, which is found through its own process. A namespace that
// neither a process nor a mount holds (only a socket passed out of it) is not
// found.
//
// Namespaces it may not read (a process in another user namespace, or
// shielded by a security module) are left out and reported, all in one
// error wrapping ErrNamespaceAccess, with the namespaces it did find.
func NodeNamespaces(ctx context.Context) ([]Namespace, error) {
	return listNamespaces(ctx, ProcDir, NetnsDir)
}

// listNamespaces lists the namespaces of procDir's processes and the bind
// mounts in netnsDir, deduplicated by inode.
func listNamespaces(ctx context.Context, procDir, netnsDir string) ([]Namespace, error) {
	type candidate struct {
		path string
		// mount is set for entries of netnsDir, which may be mount points
		// left without their mount.
		mount bool
	}
	var cands []candidate
	procs, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range procs {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err == nil {
			cands = append(cands, candidate{path: filepath.Join(procDir, e.Name(), "ns", "net")})
		}
	}
	mounts, err := os.ReadDir(netnsDir)
	// The directory exists only once some tool has created a named
	// namespace.
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list named network namespaces: %w", err)
	}
	for _, e := range mounts {
		cands = append(cands, candidate{path: filepath.Join(netnsDir, e.Name()), mount: true})
	}

	var (
		out    []Namespace
		errs   []error
		denied []string
		seen   = map[uint64]bool{}
	)
	for _, c := range cands {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if c.mount {
			// A mount point whose namespace was unmounted (or is not yet
			// mounted) is an empty file, not a namespace.
			var sfs unix.Statfs_t
			if err := unix.Statfs(c.path, &sfs); err != nil || sfs.Type != unix.NSFS_MAGIC {
				continue
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(c.path, &st); err != nil {
			// The process exited, or the mount was removed, since the
			// directory was read.
			switch {
			case gone(err):
			case errors.Is(err, fs.ErrPermission):
				denied = append(denied, c.path)
			default:
				errs = append(errs, fmt.Errorf("stat %s: %w", c.path, err))
			}
			continue
		}
		if seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		out = append(out, Namespace{Path: c.path, Inode: st.Ino})
	}
	if len(denied) > 0 {
		errs = append(errs, fmt.Errorf("%w: %d of them, the first %s", ErrNamespaceAccess, len(denied), denied[0]))
	}
	return out, errors.Join(errs...)
}

// gone reports whether err says that a namespace's path no longer exists.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOTDIR)
}

// OpenNamespace opens ns and checks that it is still the namespace that was
// listed. It returns ok false, and no error, if the namespace has vanished.
func OpenNamespace(ns Namespace) (h netns.NsHandle, ok bool, err error) {
	fd, err := unix.Open(ns.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if gone(err) {
			return netns.None(), false, nil
		}
		return netns.None(), false, fmt.Errorf("open network namespace %s: %w", ns.Path, err)
	}
	h = netns.NsHandle(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		h.Close()
		return netns.None(), false, fmt.Errorf("stat network namespace %s: %w", ns.Path, err)
	}
	if st.Ino != ns.Inode {
		h.Close()
		return netns.None(), false, nil
	}
	return h, true, nil
}
