package kubeproxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ProcessName is the name kube-proxy runs under, in /proc/<pid>/comm and as
// the base name of /proc/<pid>/exe.
const ProcessName = "kube-proxy"

// ErrCannotTell is returned by Running when the agent cannot see the
// node's processes: /proc is unreadable, or the agent runs in a PID
// namespace of its own (a DaemonSet without hostPID: true), where a
// running kube-proxy would be invisible.
var ErrCannotTell = errors.New("cannot tell whether kube-proxy runs on this node")

// Running lists the processes named ProcessName under procPath ("/proc"),
// except the caller itself (an ebpf-proxy image may install the agent as
// kube-proxy, for DaemonSets that run it under that name). A process
// counts if its comm or the base name of its executable is ProcessName;
// processes that end while being read do not count. It returns
// ErrCannotTell when the answer would not be trustworthy.
func Running(procPath string) ([]int, error) {
	if err := seesNode(procPath); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(procPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCannotTell, err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		dir := filepath.Join(procPath, e.Name())
		comm, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil {
			continue // ended since the listing
		}
		if strings.TrimSuffix(string(comm), "\n") == ProcessName {
			pids = append(pids, pid)
			continue
		}
		// comm is what the process set (prctl) or its file name cut to
		// 15 characters; the executable's name is the other witness.
		// Unreadable for processes of other users without CAP_SYS_PTRACE.
		if exe, err := os.Readlink(filepath.Join(dir, "exe")); err == nil &&
			filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == ProcessName {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// initialPIDNamespace is how /proc/<pid>/ns/pid reads in the kernel's
// initial PID namespace, the one a node's init runs in (PROC_PID_INIT_INO,
// fixed since Linux 3.8).
const initialPIDNamespace = "pid:[4026531836]"

// seesNode returns ErrCannotTell unless the agent shares the node's PID
// namespace. In the kernel's initial one it does. Elsewhere (a node that
// is itself a container, as in kind) it must not be PID 1 (the entry point
// of a container of its own), and PID 1 must not be in the agent's own
// cgroup (a container's init, such as tini) nor in a pod's (the pause
// process of a pod sharing its process namespace).
func seesNode(procPath string) error {
	if ns, err := os.Readlink(filepath.Join(procPath, "self", "ns", "pid")); err == nil && ns == initialPIDNamespace {
		return nil
	}
	if os.Getpid() == 1 {
		return fmt.Errorf("%w: the agent is PID 1, in a PID namespace of its own (run the DaemonSet with hostPID: true)", ErrCannotTell)
	}
	initCgroup, err := os.ReadFile(filepath.Join(procPath, "1", "cgroup"))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCannotTell, err)
	}
	selfCgroup, err := os.ReadFile(filepath.Join(procPath, "self", "cgroup"))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCannotTell, err)
	}
	if string(initCgroup) == string(selfCgroup) || strings.Contains(string(initCgroup), "kubepods") {
		return fmt.Errorf("%w: PID 1 is in a container, not the node's init (run the DaemonSet with hostPID: true)", ErrCannotTell)
	}
	return nil
}
