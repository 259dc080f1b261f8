// Package network is Kubernetes' end-to-end suite cut down to the
// [sig-network] specs, built against the k8s.io/kubernetes release this
// module pins: `make conformance` builds it with `go test -c` and runs it
// against the conformance cluster (test/conformance). The full e2e.test
// imports every SIG's specs, among them test/e2e/apimachinery and with it
// k8s.io/sample-apiserver, whose release the module proxy does not always
// serve, and takes minutes longer to build; the specs of the other SIGs are
// not what the proxy under test is judged by anyway.
//
// What it does at start is what upstream's test/e2e/e2e_test.go does (that
// file, a test file of its package, is not compiled into an importer):
// register the framework's flags, parse them, add the embedded manifests
// and run the suite.
package network

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// The specs: sig-network's, and the frozen feature names they use.
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/network"

	// Upstream's framework extensions: namespace dumps on failure and the
	// check after each spec that every node is still Ready. The metrics
	// grabber is left out: it scrapes components this cluster does not
	// run as pods.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
)

func TestMain(m *testing.M) {
	showVersion := flag.Bool("version", false, "print the Kubernetes version the suite was built from")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	// Specs read manifests and fixtures by repository path; the copies
	// embedded in the binary serve them when there is no checkout.
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestE2E runs the selected specs (--ginkgo.focus, --ginkgo.skip).
func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
