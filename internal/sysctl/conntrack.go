package sysctl

import (
	"os"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// TCPBeLiberal reads nf_conntrack_tcp_be_liberal in the network namespace
// at nsPath ("" for the caller's). With it set, conntrack marks no
// out-of-window packet INVALID, and the netfilter dataplanes' INVALID drop
// rule would only break asymmetric traffic (kubernetes#94861). A parameter
// that cannot be read counts as unset.
func TCPBeLiberal(nsPath string) bool {
	var liberal bool
	_ = netns.Do(nsPath, func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")
		liberal = err == nil && strings.TrimSpace(string(b)) != "0"
		return nil
	})
	return liberal
}
