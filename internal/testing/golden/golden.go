// Package golden compares what a test renders (iptables-restore input, an
// nftables transaction, an IPVS configuration) with a golden file under the
// test's testdata/ directory, and rewrites the golden files when the test
// binary runs with -update.
//
// It is test infrastructure: production packages never import it.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// Path is the golden file of name: testdata/<name>.golden, relative to the
// package directory in which go test runs the test binary.
func Path(name string) string {
	return filepath.Join("testdata", name+".golden")
}

// Check fails t unless got is, byte for byte, the content of the golden
// file of name (see Path); the failure lists the lines that differ. With
// -update it writes got to the file instead, for review in git diff.
func Check(t testing.TB, name, got string) {
	t.Helper()
	path := Path(name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test -update to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it after review):\n%s", name, path, LineDiff(string(want), got))
	}
}

// LineDiff lists the lines only in want (prefixed "- ", in want's order)
// and then those only in got ("+ ", in got's order), counting repeated
// lines: it is empty exactly when want and got hold the same lines, in
// any order.
func LineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(got, "\n") {
		count[l]++
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if count[l] > 0 {
			count[l]--
			continue
		}
		b.WriteString("- " + l + "\n")
	}
	for _, l := range strings.Split(got, "\n") {
		if count[l] > 0 {
			count[l]--
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
