package iptables

import (
	"bytes"
	"os/exec"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

// An agent cleans up after the other modes at every start and on
// --cleanup, also on a node that never ran a fallback: there it must change
// nothing, not even create an empty table (iptables -L and iptables-save -t
// instantiate the legacy tables they name).
func TestCleanupWhereNothingOfOursExistsCreatesNoTable(t *testing.T) {
	ns := sandbox.TestNetns(t, "ipt-clean-ro").Path()
	for _, backend := range backends {
		requireBackend(t, backend)
	}
	if err := Cleanup(t.Context(), ns); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	for _, backend := range backends {
		cmd := exec.Command("iptables-" + backend + "-save")
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := netns.Start(ns, cmd); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("iptables-%s-save: %v", backend, err)
		}
		if bytes.Contains(out.Bytes(), []byte("\n*")) || bytes.HasPrefix(out.Bytes(), []byte("*")) {
			t.Errorf("%s: cleanup created tables in a namespace that had none:\n%s", backend, out.String())
		}
	}
}
