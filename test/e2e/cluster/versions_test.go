package cluster

import (
	"os"
	"testing"

	"golang.org/x/mod/modfile"
)

// The harness looks for binaries under the versions in its constants, and
// build-binaries.sh builds the versions in tools/go.mod: if they drift apart,
// every end-to-end test reports missing binaries after a correct build.
func TestVersionsMatchToolsModule(t *testing.T) {
	const path = "../tools/go.mod"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(path, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"k8s.io/kubernetes":         KubernetesVersion,
		"go.etcd.io/etcd/server/v3": EtcdVersion,
	}
	got := map[string]string{}
	for _, r := range f.Require {
		if _, ok := want[r.Mod.Path]; ok {
			got[r.Mod.Path] = r.Mod.Version
		}
	}
	for mod, v := range want {
		if got[mod] != v {
			t.Errorf("%s requires %s %q, the harness expects %q", path, mod, got[mod], v)
		}
	}
}
