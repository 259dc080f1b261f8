package modes_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// xdpAttachedDrv is IFLA_XDP_ATTACHED's value for a program in the driver
// (XDP_ATTACHED_DRV in linux/if_link.h).
const xdpAttachedDrv = 1

// xdpAttachMode is how the XDP program of dev in the node's namespace is
// attached: 0 none, else the kernel's XDP_ATTACHED_* value.
func (e *env) xdpAttachMode(dev string) uint32 {
	t := e.t
	t.Helper()
	l, err := e.node.NS.Netlink().LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		return x.AttachMode
	}
	return 0
}

// TestXDPRefusedByADeviceFallsBackToTC: asked for native XDP on the node's
// uplink (a veth, whose driver runs it) and on its pod bridge (which has no
// native XDP), the agent attaches it to the uplink, says in its log and its
// metrics that the bridge refused it, and serves the NodePort from outside
// through TC on the bridge as before. --cleanup detaches the XDP program
// with everything else.
func TestXDPRefusedByADeviceFallsBackToTC(t *testing.T) {
	e := newEnv(t)
	devices := sandbox.IfaceName + "," + sandbox.BridgeName
	args := append(e.agentArgs("ebpf"), "--devices", devices, "--xdp", "native")
	a := e.startAgentArgs("ebpf", args)

	if got := e.xdpAttachMode(sandbox.IfaceName); got != xdpAttachedDrv {
		t.Errorf("%s: XDP attach mode %d, want native (%d)", sandbox.IfaceName, got, xdpAttachedDrv)
	}
	if got := e.xdpAttachMode(sandbox.BridgeName); got != 0 {
		t.Errorf("%s: XDP attached in mode %d, want none", sandbox.BridgeName, got)
	}
	logs := a.Logs()
	if !strings.Contains(logs, "device refused the XDP program") || !strings.Contains(logs, sandbox.BridgeName) {
		t.Errorf("no log line for the refusal:\n%s", grep(logs, "XDP"))
	}
	metrics := get(t, a, "/metrics")
	for _, series := range []string{
		fmt.Sprintf(`ebpfproxy_xdp_attached{device=%q,mode="native"} 1`, sandbox.IfaceName),
		fmt.Sprintf(`ebpfproxy_xdp_attached{device=%q,mode="native"} 0`, sandbox.BridgeName),
		fmt.Sprintf(`ebpfproxy_xdp_attach_failures_total{device=%q,mode="native"} 1`, sandbox.BridgeName),
	} {
		if !strings.Contains(metrics, series) {
			t.Errorf("/metrics lacks %s:\n%s", series, grep(metrics, "ebpfproxy_xdp"))
		}
	}
	e.reaches(e.external, netip.AddrPortFrom(e.node.IP, nodePort), 20)

	a.Terminate(t, time.Minute)
	e.cleanup()
	if got := e.xdpAttachMode(sandbox.IfaceName); got != 0 {
		t.Errorf("%s: XDP still attached (mode %d) after --cleanup", sandbox.IfaceName, got)
	}
}
