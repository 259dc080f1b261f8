package sandbox

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// Environment variables that declare privileged tests mandatory. CI runs as
// root on a BPF-capable kernel, and so does the VM test harness: there a test
// that cannot run is a failure, never a silent skip.
const (
	envCI                = "CI"
	envVMTest            = "EBPF_PROXY_VMTEST"
	envRequirePrivileged = "EBPF_PROXY_REQUIRE_PRIVILEGED"
)

// geteuid is replaced in tests to exercise the non-root paths.
var geteuid = os.Geteuid

// PrivilegedRequired reports whether the environment demands that privileged
// tests run (CI=true, EBPF_PROXY_VMTEST=1 or
// EBPF_PROXY_REQUIRE_PRIVILEGED=1), and names the variable that does.
func PrivilegedRequired() (reason string, required bool) {
	for _, v := range []string{envCI, envVMTest, envRequirePrivileged} {
		val := os.Getenv(v)
		if strings.EqualFold(val, "true") || val == "1" {
			return v + "=" + val, true
		}
	}
	return "", false
}

// RequireRoot stops the test unless it runs as root. Where privileged tests
// are required (see PrivilegedRequired) it fails the test; elsewhere, such as
// on a developer's laptop, it skips it and says why.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if uid := geteuid(); uid != 0 {
		if reason, required := PrivilegedRequired(); required {
			tb.Fatalf("privileged test runs as uid %d, but %s requires privileged tests to run as root", uid, reason)
		}
		tb.Skipf("privileged test needs root, running as uid %d (under CI=true, EBPF_PROXY_VMTEST=1 or EBPF_PROXY_REQUIRE_PRIVILEGED=1 this fails instead)", uid)
	}
}

// RequireFeature stops the test if a kernel feature is missing. probeErr is
// the result of a probe such as features.HaveProgramType: nil means present,
// an error wrapping ebpf.ErrNotSupported means absent. A missing feature
// fails the test where privileged tests are required and this process is
// root; elsewhere the test is skipped with the reason. Any other probe error
// means the probe itself broke and always fails the test, because a skip
// there could hide a regression.
func RequireFeature(tb testing.TB, feature string, probeErr error) {
	tb.Helper()
	if probeErr == nil {
		return
	}
	// Probes need root to be meaningful: without it they fail with EPERM,
	// which says nothing about the kernel.
	RequireRoot(tb)
	if !errors.Is(probeErr, ebpf.ErrNotSupported) {
		tb.Fatalf("probe for %s failed: %v", feature, probeErr)
	}
	if reason, required := PrivilegedRequired(); required {
		tb.Fatalf("kernel feature %s is missing but %s requires it: %v", feature, reason, probeErr)
	}
	tb.Skipf("kernel feature %s is missing: %v", feature, probeErr)
}

// InVMGuest reports whether this process runs in a guest of the VM runner
// (test/vmtest), which sets EBPF_PROXY_VMTEST=1 in every guest command.
func InVMGuest() bool { return os.Getenv(envVMTest) == "1" }
