package trace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dump"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Output formats (-o).
const (
	OutputTable = "table"
	OutputJSON  = "json"
)

// Flags are trace's flags as given, before ParseOptions; Dest is the
// positional destination.
type Flags struct {
	BPFFSPath, APISocket, Output string
	Pod, Netns, Source, Device   string
	Node                         bool
	SourcePort                   uint16
	Protocol                     string
	Dest                         string
}

// Options are trace's flags, parsed.
type Options struct {
	BPFFSPath, APISocket, Output string
	// Kind is the client's kind; Addr its address (invalid: unknown).
	Kind string
	Addr netip.Addr
	// NetnsPath is the client's network namespace ("" unknown, or the
	// node's own: the one trace runs in).
	NetnsPath  string
	Device     string
	SourcePort uint16
	Dest       netip.AddrPort
	Proto      model.Protocol
}

// ParseOptions checks the flags; its error says which is wrong and why.
func ParseOptions(f Flags) (Options, error) {
	o := Options{BPFFSPath: f.BPFFSPath, APISocket: f.APISocket, Output: f.Output, NetnsPath: f.Netns, Device: f.Device,
		SourcePort: f.SourcePort}
	switch f.Output {
	case OutputTable, OutputJSON:
	default:
		return o, fmt.Errorf("-o %q: want table or json", f.Output)
	}
	dest, proto, hasProto := strings.Cut(f.Dest, "/")
	ap, err := netip.ParseAddrPort(dest)
	if err != nil {
		return o, fmt.Errorf("destination %q: want address:port[/protocol], [IPv6]:port for IPv6", f.Dest)
	}
	o.Dest = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if hasProto && f.Protocol != "" && !strings.EqualFold(proto, f.Protocol) {
		return o, fmt.Errorf("destination %q and --protocol %q disagree", f.Dest, f.Protocol)
	}
	if !hasProto {
		proto = f.Protocol
	}
	if proto == "" {
		proto = "tcp"
	}
	if o.Proto, err = model.ParseProtocol(strings.ToUpper(proto)); err != nil {
		return o, fmt.Errorf("protocol %q: want tcp, udp or sctp", proto)
	}
	kinds := 0
	if f.Pod != "" || f.Netns != "" {
		kinds++
		o.Kind = ClientPod
	}
	if f.Node {
		kinds++
		o.Kind = ClientNode
	}
	if f.Source != "" || f.Device != "" {
		kinds++
		o.Kind = ClientExternal
		if f.Source == "" || f.Device == "" {
			return o, errors.New("a client from outside needs both --source (its address) and --device (where it arrives)")
		}
	}
	if kinds != 1 {
		return o, errors.New("name the client once: --pod IP and/or --netns PATH (a pod), --node (the node itself), or --source IP --device DEV (from outside)")
	}
	for _, a := range []struct{ flag, v string }{{"--pod", f.Pod}, {"--source", f.Source}} {
		if a.v == "" {
			continue
		}
		ip, err := netip.ParseAddr(a.v)
		if err != nil {
			return o, fmt.Errorf("%s %q: not an IP address", a.flag, a.v)
		}
		o.Addr = ip.Unmap()
		if o.Addr.Is6() != o.Dest.Addr().Is6() {
			return o, fmt.Errorf("%s %s and the destination %s are not of one IP family", a.flag, o.Addr, o.Dest.Addr())
		}
	}
	if f.SourcePort != 0 && o.Kind != ClientExternal {
		return o, errors.New("--source-port applies to a client from outside (the socket programs decide per connect(), not per port)")
	}
	return o, nil
}

// Run traces o against the maps pinned under o.BPFFSPath, named by the
// agent on o.APISocket, prints the result as o.Output says and returns the
// exit code. It runs in the node's network namespace, where the devices
// and routes are.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, err)
		return 1
	}
	in := Input{Client: Client{Kind: o.Kind, Addr: o.Addr, Port: o.SourcePort, Device: o.Device}, Dest: o.Dest, Proto: o.Proto}
	own, err := loader.NetnsCookie()
	if err != nil {
		return fail(err)
	}
	switch {
	case o.Kind == ClientNode:
		in.Client.NetnsCookie = own
	case o.NetnsPath != "":
		err := netns.Do(o.NetnsPath, func() (err error) {
			in.Client.NetnsCookie, err = loader.NetnsCookie()
			return err
		})
		if err != nil {
			return fail(fmt.Errorf("--netns %s: %w", o.NetnsPath, err))
		}
		if in.Client.NetnsCookie == own {
			in.Client.Kind = ClientNode
		} else if !in.Client.Addr.IsValid() {
			// The pod's address: the source its route to the
			// destination gives, as the kernel picks it.
			_ = netns.Do(o.NetnsPath, func() error {
				rs, err := netlink.RouteGet(o.Dest.Addr().AsSlice())
				if err == nil && len(rs) > 0 && rs[0].Src != nil {
					if a, ok := netip.AddrFromSlice(rs[0].Src); ok {
						in.Client.Addr = a.Unmap()
					}
				}
				return nil
			})
		}
	case o.Kind == ClientExternal:
		ifc, err := net.InterfaceByName(o.Device)
		if err != nil {
			return fail(fmt.Errorf("--device %s: %w (trace runs in the node's network namespace)", o.Device, err))
		}
		in.Client.Ifindex = ifc.Index
	}

	sm, err := loader.OpenPinnedSockMaps(o.BPFFSPath)
	if err != nil {
		return fail(err)
	}
	defer sm.Close()
	v6 := o.Dest.Addr().Is6()
	pick := func(n4, n6 string) string {
		if v6 {
			return n6
		}
		return n4
	}
	var opened []*ebpf.Map
	defer func() {
		for _, m := range opened {
			m.Close()
		}
	}()
	open := func(n4, n6 string) (*ebpf.Map, error) {
		m, err := loader.OpenPinnedMap(o.BPFFSPath, pick(n4, n6))
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		opened = append(opened, m)
		return m, nil
	}
	aff, err := open(bpfobj.SockMapLb4AffinityV1, bpfobj.SockMapLb6AffinityV1)
	if err != nil {
		return fail(err)
	}
	ct, err := open(bpfobj.TcMapTc4CtV1, bpfobj.TcMapTc6CtV1)
	if err != nil {
		return fail(err)
	}
	snat, err := open(bpfobj.TcMapTc4SnatAddrsV1, bpfobj.TcMapTc6SnatAddrsV1)
	if err != nil {
		return fail(err)
	}
	mg, err := open(bpfobj.TcMapLb4MaglevV1, bpfobj.TcMapLb6MaglevV1)
	if err != nil {
		return fail(err)
	}

	env := Env{Route: route}
	if env.Now, err = dump.MonotonicNow(); err != nil {
		return fail(err)
	}
	if env.Maps, err = maps.KernelLookups(sm, maps.PinnedTC{Affinity: aff, Conntrack: ct, SNATAddrs: snat, Maglev: mg}, v6); err != nil {
		return fail(err)
	}
	if ct != nil {
		env.Flows = func(client netip.Addr, dest netip.AddrPort, proto model.Protocol) ([]maps.CTEntry, error) {
			es, err := maps.ReadConntrackMap(ct)
			return flowsOf(es, client, dest, proto), err
		}
	}
	env.Names = dump.AskAgent(ctx, o.APISocket, stderr)
	r, err := Trace(in, env)
	if err != nil {
		return fail(err)
	}
	if o.Output == OutputJSON {
		err = WriteJSON(stdout, r)
	} else {
		err = WriteTable(stdout, r)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// flowsOf keeps the client-side entries of client's flows to dest.
func flowsOf(es []maps.CTEntry, client netip.Addr, dest netip.AddrPort, proto model.Protocol) []maps.CTEntry {
	var out []maps.CTEntry
	for _, e := range es {
		if !e.Reply && e.Client.Addr() == client && e.Frontend == dest && e.Proto == proto {
			out = append(out, e)
		}
	}
	return out
}

// route asks the kernel which device it sends packets to dst out of, as
// the programs' bpf_fib_lookup does.
func route(dst netip.Addr) (int, string, error) {
	rs, err := netlink.RouteGet(dst.AsSlice())
	if err != nil {
		return 0, "", fmt.Errorf("route to %s: %w", dst, err)
	}
	if len(rs) == 0 || rs[0].LinkIndex == 0 {
		return 0, "", fmt.Errorf("no route to %s", dst)
	}
	return rs[0].LinkIndex, deviceName(rs[0].LinkIndex), nil
}

func deviceName(ifindex int) string {
	ifc, err := net.InterfaceByIndex(ifindex)
	if err != nil {
		return "ifindex " + strconv.Itoa(ifindex)
	}
	return ifc.Name
}
