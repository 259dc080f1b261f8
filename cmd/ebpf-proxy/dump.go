package main

import (
	"github.com/spf13/pflag"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/trace"
)

// addDumpFlags registers dump's flags (internal/dump checks them).
func addDumpFlags(fs *pflag.FlagSet, f *dump.Flags) {
	fs.StringVar(&f.BPFFSPath, "bpffs-path", loader.DefaultBPFFSPath, "Directory on a bpf filesystem where the agent pinned its maps.")
	fs.StringVar(&f.APISocket, "api-socket", api.DefaultSocket, "The agent's local API socket, where Service names come from; empty: print the maps' ids only.")
	fs.StringVarP(&f.Output, "output", "o", dump.OutputTable, "Output format: table, wide (adds ids, policies, flags), json, or entries (every map entry, one per line, with ids only).")
	fs.StringVar(&f.Service, "service", "", "Only the Service namespace/name.")
	fs.StringVar(&f.Address, "address", "", "Only the frontends on this IP address or with a backend on it.")
	fs.StringVar(&f.Protocol, "protocol", "", "Only this protocol: tcp, udp or sctp.")
}

// addTraceFlags registers trace's flags (internal/trace checks them).
func addTraceFlags(fs *pflag.FlagSet, f *trace.Flags) {
	fs.StringVar(&f.BPFFSPath, "bpffs-path", loader.DefaultBPFFSPath, "Directory on a bpf filesystem where the agent pinned its maps.")
	fs.StringVar(&f.APISocket, "api-socket", api.DefaultSocket, "The agent's local API socket, where Service names come from; empty: the maps' ids only.")
	fs.StringVarP(&f.Output, "output", "o", trace.OutputTable, "Output format: table or json.")
	fs.StringVar(&f.Pod, "pod", "", "The client is the pod with this IP on this node (its source address; give --netns too for its session affinity).")
	fs.StringVar(&f.Netns, "netns", "", "The client is the network namespace at this path (/proc/PID/ns/net, /var/run/netns/NAME).")
	fs.BoolVar(&f.Node, "node", false, "The client is the node itself (the network namespace trace runs in).")
	fs.StringVar(&f.Source, "source", "", "The client is outside the node, with this address (with --device).")
	fs.StringVar(&f.Device, "device", "", "The device an outside client's packets arrive on (with --source).")
	fs.Uint16Var(&f.SourcePort, "source-port", 0, "An outside client's source port: picks the Maglev slot and the existing flow.")
	fs.StringVar(&f.Protocol, "protocol", "", "tcp (default), udp or sctp, when the destination does not say /protocol.")
}
