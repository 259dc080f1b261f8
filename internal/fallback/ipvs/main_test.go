package ipvs

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/example"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main()
	os.Exit(m.Run())
}

// requireIPVS stops a test that needs IPVS. The CI host's kernel is built
// without it, so there, and only because IPVS genuinely cannot exist, the
// test is skipped; the VM runner (test/vmtest, EBPF_PROXY_VMTEST=1) boots
// kernels that have it, and there a missing IPVS fails the test. A probe
// that breaks for another reason always fails.
func requireIPVS(t *testing.T) {
	t.Helper()
	sandbox.RequireRoot(t)
	err := Available("")
	if err == nil {
		return
	}
	if !errors.Is(err, ErrNoIPVS) {
		t.Fatalf("probe for IPVS failed: %v", err)
	}
	if os.Getenv("EBPF_PROXY_VMTEST") != "" {
		t.Fatalf("IPVS must work inside the vmtest VM: %v", err)
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	t.Skipf("IPVS is not available on this host's kernel %s (%v); test/vmtest runs this test on kernels that have it",
		unix.ByteSliceToString(uts.Release[:]), err)
}

// nodeA returns node-a of a sandbox of its own for t, the one node of the
// tests that drive the dataplane in a node's namespace.
func nodeA(t *testing.T) *sandbox.Node {
	t.Helper()
	node, err := sandbox.ForTest(t).AddNode(example.NodeA)
	if err != nil {
		t.Fatal(err)
	}
	return node
}
