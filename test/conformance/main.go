// Command conformance runs Kubernetes' own end-to-end specs of
// [sig-network] (Services, EndpointSlices, Networking, Conntrack) against a
// real node, first with upstream kube-proxy and then with ebpf-proxy, and
// says how each did (make conformance, test/conformance/conformance.mk).
//
// The node is the cluster test's (test/cluster/node): containerd and the
// kubelet in a Debian 6.12 guest of the VM runner, whose kubelet writes
// global sysctls that must not touch this machine. The control plane runs
// on this machine in a network namespace of its own
// (test/cluster/controlplane), which runs this command's host side:
//
//	controlplane --controllers '*,-nodeipam' ... -- conformance run [flags]
//
// run starts a VM per node with the worker's program in it
// (test/cluster/worker),
//
//	vmtest ... --tap node1-tap -- worker --index 1 --image A.tar ... --state F --stop S
//
// which brings the node up, writes "ready" to the state file and waits for
// the stop file. From the control plane's namespace run then installs
// CoreDNS and each proxy in turn and runs the suite (e2e.test, built from
// test/e2e/tools/network) against the cluster, once per proxy, writes the
// stop file, waits for the VM, and reports (report.go):
//
//	conformance: proxy=kube-proxy ran=N passed=P failed=F skipped=S
//	conformance: proxy=ebpf-proxy ran=N passed=P failed=F skipped=S
//
// conformance report PROXY=REPORT.json... prints the same from reports
// already written.
package main

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// envKubeconfig names the admin's kubeconfig in the environment; the
// control plane (test/cluster/controlplane) sets it for its command.
const envKubeconfig = "EBPF_PROXY_CLUSTER_KUBECONFIG"

// The cluster's DNS: the kube-dns Service's address (in the API server's
// Service range, 10.96.0.0/16) and domain, as kubeadm sets them.
var defaultDNS = netip.MustParseAddr("10.96.0.10")

const defaultDomain = "cluster.local"

// list is a flag that may be given more than once.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "run":
		code = runMain(os.Args[2:])
	case "report":
		code = reportMain(os.Args[2:])
	default:
		usage()
		code = 2
	}
	os.Exit(code)
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage: conformance run [flags]        (in the control plane's namespace: the VMs, the proxies, the suites)
       conformance report PROXY=FILE...   (the summary of JSON reports already written)`)
}

// reportMain prints the summary of reports given as PROXY=FILE.
func reportMain(args []string) int {
	if len(args) == 0 {
		usage()
		return 2
	}
	var results []Result
	for _, a := range args {
		proxy, file, ok := strings.Cut(a, "=")
		if !ok {
			usage()
			return 2
		}
		r, err := ReadReport(proxy, file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			return 1
		}
		results = append(results, r)
	}
	if !Summary(os.Stdout, results) {
		return 1
	}
	return 0
}
