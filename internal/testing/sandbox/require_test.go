package sandbox

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// recordingTB records how a Require function stopped the test. Like the real
// testing.TB, Fatalf and Skipf end the calling goroutine.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordingTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func record(t *testing.T, f func(testing.TB)) *recordingTB {
	r := &recordingTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func TestRequireFailsWherePrivilegedTestsAreRequired(t *testing.T) {
	missing := fmt.Errorf("probe tcx: %w", ebpf.ErrNotSupported)
	tests := []struct {
		name      string
		euid      int
		env       map[string]string
		check     func(testing.TB)
		wantFatal string // substring; "" means no failure
		wantSkip  string // substring; "" means no skip
	}{
		{"root passes RequireRoot", 0, nil, RequireRoot, "", ""},
		{"non-root on a laptop skips", 1000, nil, RequireRoot, "", "needs root"},
		{"non-root in CI fails", 1000, map[string]string{envCI: "true"}, RequireRoot, "CI=true", ""},
		{"non-root in the VM harness fails", 1000, map[string]string{envVMTest: "1"}, RequireRoot, "EBPF_PROXY_VMTEST=1", ""},
		{"non-root with privileged tests required fails", 1000, map[string]string{envRequirePrivileged: "1"}, RequireRoot, "EBPF_PROXY_REQUIRE_PRIVILEGED=1", ""},
		{"CI=false does not require privileged tests", 1000, map[string]string{envCI: "false"}, RequireRoot, "", "needs root"},
		{"present feature passes even in CI", 0, map[string]string{envCI: "true"},
			func(tb testing.TB) { RequireFeature(tb, "tcx", nil) }, "", ""},
		{"missing feature as root in CI fails", 0, map[string]string{envCI: "true"},
			func(tb testing.TB) { RequireFeature(tb, "tcx", missing) }, "tcx is missing but CI=true requires it", ""},
		{"missing feature as root on a laptop skips", 0, nil,
			func(tb testing.TB) { RequireFeature(tb, "tcx", missing) }, "", "tcx is missing"},
		{"missing feature as non-root on a laptop skips", 1000, nil,
			func(tb testing.TB) { RequireFeature(tb, "tcx", missing) }, "", "needs root"},
		{"missing feature as non-root in CI fails for lack of root", 1000, map[string]string{envCI: "true"},
			func(tb testing.TB) { RequireFeature(tb, "tcx", missing) }, "run as root", ""},
		{"broken probe fails even on a laptop", 0, nil,
			func(tb testing.TB) { RequireFeature(tb, "tcx", errors.New("bpf(): bad address")) }, "probe for tcx failed", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, v := range []string{envCI, envVMTest, envRequirePrivileged} {
				t.Setenv(v, tt.env[v])
			}
			orig := geteuid
			geteuid = func() int { return tt.euid }
			t.Cleanup(func() { geteuid = orig })

			r := record(t, tt.check)
			if !matches(r.fatal, tt.wantFatal) || !matches(r.skip, tt.wantSkip) {
				t.Errorf("got fatal %q, skip %q; want fatal containing %q, skip containing %q", r.fatal, r.skip, tt.wantFatal, tt.wantSkip)
			}
		})
	}
}

func matches(got, want string) bool {
	if want == "" {
		return got == ""
	}
	return strings.Contains(got, want)
}
