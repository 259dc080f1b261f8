package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// HandoverGrace bounds how long a handover waits for the TCP connections
// in progress through the virtual servers it deletes (Handover).
const HandoverGrace = 500 * time.Millisecond

// Handover lists, in the namespace at netnsPath ("" for the caller's), our
// virtual servers of both families, before the mode that replaces IPVS's
// writes its first sync, and returns what deletes a family's (metrics.IPv4
// or metrics.IPv6), for that mode to call right after its first sync of
// the family is written (mode.Env.Written). Until then they serve (make
// before break).
//
// From then on new connections no longer reach them, and they must go
// soon, but not at once:
//   - A closed IPVS connection (kept for two minutes) still rewrites the
//     replies of its backend to its client port, so a new connection from
//     that port straight to that backend fails until the virtual server's
//     deletion flushes it (removeVirtualServers). Such a client's SYN is
//     retransmitted after a second: the deletion must come before that.
//   - The deletion ends the connections still in progress through them:
//     their next packets are dropped. A connect() made just before the
//     write, still in its handshake or waiting for its answer, would fail.
//
// So it waits until no TCP connection through the family's servers is in
// progress (IPVS's state is neither TIME_WAIT nor CLOSE), at most
// HandoverGrace, then deletes them. A connection still open after that
// (a long-lived one) ends as it would without the wait. The listing done
// beforehand leaves the wait and a few netlink requests between the write
// and the deletion. The first call for a family deletes its servers and
// says how many; later ones do nothing.
func Handover(ctx context.Context, netnsPath string) (func(family string) (int, error), error) {
	if ok, err := procNetIPVS(netnsPath); err != nil || !ok {
		// A kernel without IPVS has none of ours.
		return func(string) (int, error) { return 0, nil }, err
	}
	k, dummy, sets, err := openLeftovers(ctx, netnsPath)
	if err != nil {
		return nil, err
	}
	defer k.close()
	owned := map[string][]vsKey{}
	for _, f := range families {
		keys, err := k.ownedServices(netnsPath, f, dummy, sets)
		if err != nil {
			return nil, err
		}
		owned[f.name] = keys
	}
	var mu sync.Mutex
	return func(family string) (int, error) {
		mu.Lock()
		keys := owned[family]
		delete(owned, family)
		mu.Unlock()
		if len(keys) == 0 {
			return 0, nil
		}
		waitForConnections(netnsPath, keys, HandoverGrace)
		return deleteServices(netnsPath, keys)
	}, nil
}

// waitForConnections waits until no TCP connection through the virtual
// servers keys names is in progress, or for at most grace. A table it
// cannot read ends the wait.
func waitForConnections(netnsPath string, keys []vsKey, grace time.Duration) {
	servers := map[vsKey]bool{}
	for _, k := range keys {
		if k.Proto == model.TCP {
			servers[k] = true
		}
	}
	if len(servers) == 0 {
		return
	}
	deadline := time.Now().Add(grace)
	for {
		n, err := connectionsInProgress(netnsPath, servers)
		if err != nil || n == 0 || !time.Now().Before(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connectionsInProgress counts the TCP connections through servers that
// IPVS holds in the namespace at netnsPath in a state other than TIME_WAIT
// and CLOSE.
func connectionsInProgress(netnsPath string, servers map[vsKey]bool) (int, error) {
	var table []byte
	err := netns.Do(netnsPath, func() (err error) {
		// The calling thread's namespace: /proc/net is the process's.
		table, err = os.ReadFile("/proc/thread-self/net/ip_vs_conn")
		return err
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range parseConnections(string(table)) {
		if servers[c.server] && c.state != "TIME_WAIT" && c.state != "CLOSE" {
			n++
		}
	}
	return n, nil
}

// ipvsConn is one line of /proc/net/ip_vs_conn: the virtual server it went
// through and its state.
type ipvsConn struct {
	server vsKey
	state  string
}

// parseConnections reads the TCP connections of /proc/net/ip_vs_conn:
//
//	Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
//	TCP 0AF4010C DBF0 0A600050 0050 0AF4010A 1F90 ESTABLISHED     899
//
// IPv4 addresses in hexadecimal, IPv6 ones written out, ports in
// hexadecimal; ToIP and TPrt are the virtual server's. Lines it cannot read
// are skipped.
func parseConnections(table string) []ipvsConn {
	var out []ipvsConn
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || f[0] != "TCP" {
			continue
		}
		addr, err := parseConnAddr(f[3])
		if err != nil {
			continue
		}
		port, err := strconv.ParseUint(f[4], 16, 16)
		if err != nil {
			continue
		}
		out = append(out, ipvsConn{server: vsKey{Addr: addr, Proto: model.TCP, Port: uint16(port)}, state: f[7]})
	}
	return out
}

// parseConnAddr reads an address of /proc/net/ip_vs_conn: eight hexadecimal
// digits for IPv4 (in network order), an IPv6 address as written.
func parseConnAddr(s string) (netip.Addr, error) {
	if strings.Contains(s, ":") {
		return netip.ParseAddr(s)
	}
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil || len(s) != 8 {
		return netip.Addr{}, fmt.Errorf("address %q", s)
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), nil
}
