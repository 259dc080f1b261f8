package iptables

import (
	"bytes"
	"os/exec"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

// An agent cleans up after the other modes at every start and on
// --cleanup, also on a node that never ran a fallback: there it must change
// nothing, not even create an empty table (iptables -L and iptables-save -t
// instantiate the legacy tables they name).
func TestCleanupWhereNothingOfOursExistsCreatesNoTable(t *testing.T) {
	ns := sandbox.TestNetns(t, "ipt-clean-ro").Path()
	for _, backend := range backends {
		requireTools(t, "iptables", backend)
		requireTools(t, "ip6tables", backend)
	}
	if err := Cleanup(t.Context(), ns); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	for _, tool := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"} {
		cmd := exec.Command(tool)
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := netns.Start(ns, cmd); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if bytes.Contains(out.Bytes(), []byte("\n*")) || bytes.HasPrefix(out.Bytes(), []byte("*")) {
			t.Errorf("%s: cleanup created tables in a namespace that had none:\n%s", tool, out.String())
		}
	}
}
