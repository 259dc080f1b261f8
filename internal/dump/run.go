package dump

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// askTimeout bounds the question to the agent: dump must answer even when
// the agent hangs.
const askTimeout = 5 * time.Second

// Run prints what the pinned maps under o.BPFFSPath hold as o.Output says,
// with the names the agent on o.APISocket gives, and returns the exit
// code. Without an answer from the agent it prints the maps' ids instead
// and says so in one line on stderr.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) int {
	sm, err := loader.OpenPinnedSockMaps(o.BPFFSPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer sm.Close()
	if o.Output == OutputEntries {
		return entries(sm, stdout, stderr)
	}
	v4, err := maps.ReadFrontends(maps.KernelMaps(sm))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	v6, err := maps.ReadFrontends6(maps.KernelMaps6(sm))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	names := AskAgent(ctx, o.APISocket, stderr)
	r := Filter(Join([]Family{{"IPv4", v4}, {"IPv6", v6}}, names), o)
	if o.Output == OutputJSON {
		err = WriteJSON(stdout, r)
	} else {
		err = WriteTable(stdout, r, o.Output == OutputWide)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// AskAgent returns the Services of the agent on socket, or nil after one
// line on stderr saying why (no socket, or no answer within 5 s).
func AskAgent(ctx context.Context, socket string, stderr io.Writer) *api.Services {
	if socket == "" {
		fmt.Fprintln(stderr, "no --api-socket: showing the maps' ids, not Service names")
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	names, err := api.Get(ctx, socket)
	if err != nil {
		fmt.Fprintf(stderr, "no agent answered on %s (%v): showing the maps' ids, not Service names\n", socket, err)
		return nil
	}
	return names
}

// entries prints every entry of the maps in the canonical sorted form
// (maps.Dump), IPv4 then IPv6 under a header.
func entries(sm *bpfobj.SockMaps, stdout, stderr io.Writer) int {
	lines, err := maps.Dump(maps.KernelMaps(sm))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	// The IPv6 maps number their ids apart from the IPv4 ones: a header
	// keeps "backend 1" of one family from reading as the other's.
	lines6, err := maps.Dump6(maps.KernelMaps6(sm))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if len(lines6) > 0 {
		lines = append(append(lines, "# IPv6"), lines6...)
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return 0
}
