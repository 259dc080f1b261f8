package main

import (
	"github.com/spf13/pflag"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
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
