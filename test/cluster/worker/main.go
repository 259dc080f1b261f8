// Command worker runs in a VM guest of the runner in test/vmtest and makes
// it a worker node of the cluster whose control plane runs on the host
// (test/cluster/controlplane): containerd with the images, the kubelet,
// the bridge CNI (test/cluster/node). It writes "ready" to the state file
// once the Node is Ready (or "failed: why"), and keeps the node up until
// the stop file appears or it is told to stop.
//
//	vmtest --tap node2-tap ... -- worker --index 2 --image A.tar ... --logs DIR --state F --stop S
//
// --index numbers the node (node.Nth: its name, address and pod range).
// The conformance run starts its nodes with it, and the cluster test its
// second node, beside the first one that the test itself brings up.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/test/cluster/node"
)

// Node states written to the state file.
const (
	stateReady  = "ready"
	stateFailed = "failed"
)

// envKubeconfig names the admin's kubeconfig in the environment; the
// control plane (test/cluster/controlplane) sets it for its command, and
// the VM runner passes it on to the guest.
const envKubeconfig = "EBPF_PROXY_CLUSTER_KUBECONFIG"

// list is a flag that may be given more than once.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	os.Exit(run(os.Args[1:]))
}

// run brings up the worker node (containerd with the images, the kubelet
// with the cluster's DNS, if any), says so in the state file, and keeps the
// node up until the stop file appears or it is told to stop.
func run(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var images, aliases list
	fs.Var(&images, "image", "an image archive to import (repeatable)")
	fs.Var(&aliases, "alias", "NEW=EXISTING: a second reference for an imported image (repeatable)")
	logs := fs.String("logs", "", "directory for the node's logs (required)")
	state := fs.String("state", "", "file to write the node's state to, read by the host (required)")
	stop := fs.String("stop", "", "file whose appearance stops the node (required)")
	dns := fs.String("cluster-dns", "", "the kube-dns Service's address, the pods' nameserver (none when empty)")
	domain := fs.String("cluster-domain", "", "the cluster's DNS domain")
	index := fs.Int("index", 1, "the node's number in the cluster, from 1: its name, address and pod range")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *logs == "" || *state == "" || *stop == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "worker: --logs, --state and --stop are required, and nothing else")
		return 2
	}
	if err := os.MkdirAll(*logs, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	cfg, err := node.Nth(*index)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: --index:", err)
		return 2
	}
	if *dns != "" {
		dnsIP, err := netip.ParseAddr(*dns)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker: --cluster-dns:", err)
			return 2
		}
		cfg.ClusterDNS = []netip.Addr{dnsIP}
	}
	al := map[string]string{}
	for _, a := range aliases {
		n, e, ok := strings.Cut(a, "=")
		if !ok || n == "" || e == "" {
			fmt.Fprintf(os.Stderr, "worker: --alias %q: want NEW=EXISTING\n", a)
			return 2
		}
		al[n] = e
	}
	kubeconfig := os.Getenv(envKubeconfig)
	if kubeconfig == "" {
		fmt.Fprintf(os.Stderr, "worker: %s is not set (the control plane sets it)\n", envKubeconfig)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	cfg.Kubeconfig, cfg.Images, cfg.Aliases, cfg.LogDir, cfg.Logf, cfg.ClusterDomain = kubeconfig, images, al, *logs, logf, *domain
	n, err := node.Start(ctx, cfg)
	if err != nil {
		_ = os.WriteFile(*state, []byte(stateFailed+": "+err.Error()+"\n"), 0o644)
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer n.Stop()
	if err := os.WriteFile(*state, []byte(stateReady+"\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	logf("worker: ready; %s", node.Usage())
	// Where the guest's one vCPU goes, now and then, for a reader of a
	// slow or failed run.
	usage := time.NewTicker(5 * time.Minute)
	defer usage.Stop()
	poll := time.NewTicker(2 * time.Second)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			logf("worker: stopping: %v", ctx.Err())
			return 0
		case <-usage.C:
			logf("worker: %s", node.Usage())
		case <-poll.C:
			if _, err := os.Stat(*stop); err == nil {
				logf("worker: asked to stop; %s", node.Usage())
				return 0
			} else if !errors.Is(err, os.ErrNotExist) {
				fmt.Fprintln(os.Stderr, "worker:", err)
				return 1
			}
		}
	}
}
