package loader

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// NetnsCookie returns the cookie the kernel gives the network namespace the
// calling thread is in: the value bpf_get_netns_cookie returns for sockets
// there. The agent runs in the node's namespace (hostNetwork), so that is
// the node's cookie.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: socket: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: getsockopt SO_NETNS_COOKIE: %w", err)
	}
	return c, nil
}
