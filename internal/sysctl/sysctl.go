// Package sysctl reads and writes kernel parameters under /proc/sys (and
// module parameters under /sys/module) for the agent's start-up tuning:
// kube-proxy's conntrack settings and IPVS's strict ARP. The paths are the
// network namespace's of the calling process.
package sysctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Sysctl reads and writes the parameters under Root.
type Sysctl struct {
	// Root is /proc/sys; tests point it at a directory of their own.
	Root string
}

// Default is the process's /proc/sys.
var Default = Sysctl{Root: "/proc/sys"}

// path turns "net/netfilter/nf_conntrack_max" or the dotted
// "net.netfilter.nf_conntrack_max" into a file under Root.
func (s Sysctl) path(name string) string {
	if !strings.Contains(name, "/") {
		name = strings.ReplaceAll(name, ".", "/")
	}
	return filepath.Join(s.Root, name)
}

// GetInt returns the integer value of name.
func (s Sysctl) GetInt(name string) (int, error) {
	return ReadIntFile(s.path(name))
}

// SetInt writes v to name unless it holds v already, and says whether it
// wrote. Writing only what differs keeps a read-only parameter that
// already has the wanted value from being an error.
func (s Sysctl) SetInt(name string, v int) (bool, error) {
	cur, err := s.GetInt(name)
	if err == nil && cur == v {
		return false, nil
	}
	if err := os.WriteFile(s.path(name), []byte(strconv.Itoa(v)), 0o644); err != nil {
		return false, fmt.Errorf("set %s to %d: %w", name, v, err)
	}
	return true, nil
}

// ReadIntFile reads a file holding one integer, as /proc/sys and
// /sys/module parameters do.
func ReadIntFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// IsReadOnly says whether err is the refusal of a parameter that this
// network namespace may read but not write (nf_conntrack_max outside the
// initial namespace) or of a read-only mount (/sys in a container).
func IsReadOnly(err error) bool {
	return errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS)
}
