package golden

import (
	"os"
	"testing"
)

func TestLineDiffCountsRepeatedLinesInAnyOrder(t *testing.T) {
	for _, tc := range []struct {
		name, want, got, diff string
	}{
		{"same", "a\nb\n", "a\nb\n", ""},
		{"reordered", "a\nb\n", "b\na\n", ""},
		{"repeated", "a\na\nb", "a\nb", "- a\n"},
		{"changed", "a\nb\nc", "a\nx\nc", "- b\n+ x\n"},
	} {
		if got := LineDiff(tc.want, tc.got); got != tc.diff {
			t.Errorf("%s: LineDiff(%q, %q) = %q, want %q", tc.name, tc.want, tc.got, got, tc.diff)
		}
	}
}

func TestCheckReadsAndUpdateWritesTheGoldenFile(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.Mkdir("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(was bool) { *update = was }(*update)
	*update = true
	Check(t, "x", "rendered\n")
	*update = false
	if b, err := os.ReadFile(Path("x")); err != nil || string(b) != "rendered\n" {
		t.Fatalf("-update wrote %q (%v), want %q", b, err, "rendered\n")
	}
	Check(t, "x", "rendered\n")
}
