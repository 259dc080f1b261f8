package iptables

import (
	"os/exec"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/behaviour"
)

// TestStaleUDPFlowsAreCleared runs behaviour.StaleUDPFlows against the
// iptables dataplane of each family: a resolver through a ClusterIP must
// move to the live endpoint when its own is removed, and reach a Service
// that gained its first endpoint, which only the deletion of stale UDP
// conntrack entries makes happen.
func TestStaleUDPFlowsAreCleared(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		name, tools, newEnv := "IPv4", "iptables", behaviour.NewEnv
		if ipv6 {
			name, tools, newEnv = "IPv6", "ip6tables", behaviour.NewEnv6
		}
		t.Run(name, func(t *testing.T) {
			backend := availableBackend(t, tools)
			behaviour.StaleUDPFlows(t, newEnv(t, factory(backend, ipv6)))
		})
	}
}

// availableBackend returns the first back end whose tools are installed
// (what the test checks is the same in both).
func availableBackend(t *testing.T, tools string) string {
	t.Helper()
	for _, b := range backends {
		if _, err := exec.LookPath(tools + "-" + b + "-restore"); err == nil {
			return b
		}
	}
	requireTools(t, tools, backends[0])
	return backends[0]
}
