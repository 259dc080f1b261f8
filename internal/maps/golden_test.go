package maps_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestGoldenDump takes an example set of Services from YAML through the
// manifests source, the tracker and the writer, as the agent does on
// node-a, and compares the sorted dump of the maps with the golden file.
func TestGoldenDump(t *testing.T) {
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	src, err := k8swatch.NewManifests("testdata", "node-a", []k8swatch.Target{{Tracker: tr}}, k8swatch.ManifestOptions{
		Invalid: func(kind, ns, name, reason string) { t.Errorf("invalid %s %s/%s: %s", kind, ns, name, reason) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	m := maps.NewFakes(0, 0, 0).Maps()
	w, err := maps.NewWriter(m, maps.Limits{Backends: 100, RevNat: 100})
	if err != nil {
		t.Fatal(err)
	}
	up := tr.Apply()
	up.Full = true
	if err := w.Sync(up); err != nil {
		t.Fatal(err)
	}
	lines, err := maps.Dump(m)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(lines, "\n") + "\n"
	golden := filepath.Join("testdata", "services.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("dump differs from %s (rerun with -update after checking):\n%s", golden, got)
	}
}
