package bpf

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// cgroupMountFallback is where the agent mounts cgroup2 on a node that has
// none mounted.
const cgroupMountFallback = "/run/ebpf-proxy/cgroupv2"

// defaultCgroupPath returns the node's cgroup2 root: the first cgroup2 mount
// of the host, or a cgroup2 mount the agent makes under /run/ebpf-proxy.
// Attaching at the root covers every pod and the node's own processes.
func defaultCgroupPath() (string, error) {
	if p, err := findCgroup2Mount("/proc/self/mountinfo"); err != nil {
		return "", err
	} else if p != "" {
		return p, nil
	}
	if err := os.MkdirAll(cgroupMountFallback, 0o700); err != nil {
		return "", fmt.Errorf("create %s: %w", cgroupMountFallback, err)
	}
	if err := unix.Mount("none", cgroupMountFallback, "cgroup2", 0, ""); err != nil {
		return "", fmt.Errorf("mount cgroup2 on %s: %w", cgroupMountFallback, err)
	}
	return cgroupMountFallback, nil
}

// findCgroup2Mount returns the mount point of the first cgroup2 filesystem
// listed in a mountinfo file, or "" when there is none.
func findCgroup2Mount(mountinfo string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "36 35 98:0 / /mnt rw,noatime master:1 - cgroup2 none rw"
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 5 && len(postFields) >= 1 && postFields[0] == "cgroup2" {
			return unescapeMountPath(fields[4]), nil
		}
	}
	return "", sc.Err()
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
