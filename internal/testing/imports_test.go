// The tests of this directory guard the boundary between the agent and the
// test infrastructure below it.
package testinfra_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/ebpf-proxy/ebpf-proxy/"

// testInfra are the packages that exist for tests: everything under
// internal/testing (the sandbox, the packet test kit, the harnesses and
// builders, the behaviour table) and under test/.
var testInfra = []string{
	module + "internal/testing/",
	module + "test/",
}

func isTestInfra(pkg string) bool {
	return slices.ContainsFunc(testInfra, func(prefix string) bool {
		return pkg == strings.TrimSuffix(prefix, "/") || strings.HasPrefix(pkg, strings.TrimSuffix(prefix, "/")+"/")
	})
}

// TestProductionImportsNoTestInfrastructure: no package under cmd/ or
// internal/ that is not test infrastructure itself depends, directly or
// not, on a test infrastructure package or on the standard "testing"
// package; so the agent's binary carries none of it.
func TestProductionImportsNoTestInfrastructure(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", "./cmd/...", "./internal/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var checked int
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 || isTestInfra(f[0]) {
			continue
		}
		checked++
		for _, dep := range f[1:] {
			if isTestInfra(dep) || dep == "testing" {
				t.Errorf("%s depends on %s, which exists for tests", strings.TrimPrefix(f[0], module), strings.TrimPrefix(dep, module))
			}
		}
	}
	// The agent itself must have been among them.
	if checked == 0 || !strings.Contains(string(out), module+"cmd/ebpf-proxy ") {
		t.Fatalf("go list listed no production package:\n%s", out)
	}
}

func TestTestInfraPrefixes(t *testing.T) {
	for pkg, want := range map[string]bool{
		module + "internal/testing/sandbox":       true,
		module + "internal/testingx":              false,
		module + "internal/testing/agent":         true,
		module + "internal/testing/pktest/sample": true,
		module + "internal/testing/behaviour":     true,
		module + "internal/fallback/iptables":     false,
		module + "internal/fallback/fallbacktest": false,
		module + "test/e2e/testbed":               true,
		module + "cmd/ebpf-proxy":                 false,
		"github.com/other/test/thing":             false,
	} {
		if got := isTestInfra(pkg); got != want {
			t.Errorf("isTestInfra(%s) = %v, want %v", pkg, got, want)
		}
	}
}
