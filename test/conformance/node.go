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

// Node states written to the state file for the host side (run).
const (
	stateReady  = "ready"
	stateFailed = "failed"
)

// nodeMain runs in the VM guest: it brings up the worker node (containerd
// with the images, the kubelet with the cluster's DNS), says so in the
// state file, and keeps the node up until the stop file appears (the host
// side's suites have run) or it is told to stop.
func nodeMain(args []string) int {
	fs := flag.NewFlagSet("conformance node", flag.ContinueOnError)
	var images, aliases list
	fs.Var(&images, "image", "an image archive to import (repeatable)")
	fs.Var(&aliases, "alias", "NEW=EXISTING: a second reference for an imported image (repeatable)")
	logs := fs.String("logs", "", "directory for the node's logs (required)")
	state := fs.String("state", "", "file to write the node's state to, read by the host (required)")
	stop := fs.String("stop", "", "file whose appearance stops the node (required)")
	dns := fs.String("cluster-dns", defaultDNS.String(), "the kube-dns Service's address, the pods' nameserver")
	domain := fs.String("cluster-domain", defaultDomain, "the cluster's DNS domain")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *logs == "" || *state == "" || *stop == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "conformance node: --logs, --state and --stop are required, and nothing else")
		return 2
	}
	dnsIP, err := netip.ParseAddr(*dns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance node: --cluster-dns:", err)
		return 2
	}
	al := map[string]string{}
	for _, a := range aliases {
		n, e, ok := strings.Cut(a, "=")
		if !ok || n == "" || e == "" {
			fmt.Fprintf(os.Stderr, "conformance node: --alias %q: want NEW=EXISTING\n", a)
			return 2
		}
		al[n] = e
	}
	kubeconfig := os.Getenv(envKubeconfig)
	if kubeconfig == "" {
		fmt.Fprintf(os.Stderr, "conformance node: %s is not set (the control plane sets it)\n", envKubeconfig)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	logf := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	n, err := node.Start(ctx, node.Config{
		Kubeconfig: kubeconfig, Images: images, Aliases: al, LogDir: *logs, Logf: logf,
		ClusterDNS: []netip.Addr{dnsIP}, ClusterDomain: *domain,
	})
	if err != nil {
		_ = os.WriteFile(*state, []byte(stateFailed+": "+err.Error()+"\n"), 0o644)
		fmt.Fprintln(os.Stderr, "conformance node:", err)
		return 1
	}
	defer n.Stop()
	if err := os.WriteFile(*state, []byte(stateReady+"\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "conformance node:", err)
		return 1
	}
	logf("conformance node: ready; %s", node.Usage())
	// Where the guest's one vCPU goes, now and then, for a reader of a
	// slow or failed run.
	usage := time.NewTicker(5 * time.Minute)
	defer usage.Stop()
	poll := time.NewTicker(2 * time.Second)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			logf("conformance node: stopping: %v", ctx.Err())
			return 0
		case <-usage.C:
			logf("conformance node: %s", node.Usage())
		case <-poll.C:
			if _, err := os.Stat(*stop); err == nil {
				logf("conformance node: asked to stop; %s", node.Usage())
				return 0
			} else if !errors.Is(err, os.ErrNotExist) {
				fmt.Fprintln(os.Stderr, "conformance node:", err)
				return 1
			}
		}
	}
}
