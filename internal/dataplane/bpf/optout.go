package bpf

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf/sockterm"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Pods opted out of the socket hooks: under --socket-lb-scope=all, the
// pods the agent is told of (the opt-out annotation) are translated as
// every pod is under --socket-lb-scope=node. Each is found by its address:
// the network namespace holding it on a veth whose peer is in the node's
// namespace. Its namespace's cookie goes into sock_netns_packet_v1, which
// the socket hooks skip, and the peer, its device on the node, gets the TC
// programs, first: the pod is never without a translation. A device once
// attached stays attached while it exists (the pod's flows tracked per
// packet keep their translation if the pod opts back in); its cookie goes
// at once.

// podNetns is where an opted-out pod lives.
type podNetns struct {
	// cookie is its network namespace's (bpf_get_netns_cookie).
	cookie uint64
	// device is the host side of its veth, in the node's namespace.
	device string
}

// optOutMetrics count the opted-out pods.
type optOutMetrics struct {
	pods, unresolved prometheus.Gauge
}

func newOptOutMetrics() optOutMetrics {
	return optOutMetrics{
		pods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ebpfproxy_bpf_opted_out_pods",
			Help: "Pods opted out of the socket hooks (their Service traffic translated per packet at their devices) whose network namespace and device were found and attached.",
		}),
		unresolved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ebpfproxy_bpf_opted_out_pods_unresolved",
			Help: "Addresses of pods opted out of the socket hooks that no network namespace of the node holds on a veth to the node, or whose device could not be attached: their sockets stay translated at connect(). Found again on the node's link events and every 10s.",
		}),
	}
}

// optOut is the opted-out pods' state, guarded by the dataplane's syncMu.
type optOut struct {
	// want are the opted-out pods' addresses, as the agent last set them.
	want []netip.Addr
	// cookies are those written to sock_netns_packet_v1.
	cookies map[uint64]bool
	// reported is the last unresolved count logged, -1 for none yet.
	reported int
	metrics  optOutMetrics
	// lister lists the node's network namespaces.
	lister sockterm.NamespaceLister
}

// SetOptedOutPods sets the pods, by address, whose sockets the socket hooks
// leave as they are under --socket-lb-scope=all: their Service traffic is
// translated per packet at their devices, as every pod's is under
// --socket-lb-scope=node, so that a proxy inside them (a service mesh's
// sidecar) sees the Service address. It finds each pod's network namespace
// and device, attaches the TC programs to the device, then has the socket
// hooks skip the namespace; pods no longer listed are translated at their
// sockets again. Pods not found now (not yet created) are looked for again
// on the node's link events and every 10s. Under --socket-lb-scope=node
// every pod is translated so already, and it does nothing. The error says
// what could not be done; what could is done.
func (d *Dataplane) SetOptedOutPods(ctx context.Context, addrs []netip.Addr) error {
	if d.optOut == nil {
		return nil
	}
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	if d.closed {
		return errors.New("the dataplane is closed")
	}
	d.optOut.want = slices.Clone(addrs)
	return d.refreshOptOut(ctx)
}

// refreshOptOut finds the opted-out pods again and applies what it found.
// Called with syncMu held.
func (d *Dataplane) refreshOptOut(ctx context.Context) error {
	o, a := d.optOut, d.tc
	if a == nil || a.loaded == nil {
		// The TC programs come with the first sync that knows the
		// node's devices, which calls this again; until then the pods'
		// sockets stay translated.
		o.metrics.unresolved.Set(float64(len(o.want)))
		return nil
	}
	found := map[netip.Addr]podNetns{}
	var errs []error
	if len(o.want) > 0 {
		var err error
		found, err = findPods(ctx, o.lister, a.ns, a.nl, o.want)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range found {
		a.optedOut[p.device] = true
	}
	if err := d.refreshPods(); err != nil {
		errs = append(errs, err)
	}
	next := map[uint64]bool{}
	unresolved := len(o.want) - len(found)
	for _, p := range found {
		if slices.Contains(a.podNames, p.device) {
			next[p.cookie] = true
		} else {
			unresolved++
		}
	}
	m := d.loaded.Objects.SockNetnsPacketV1
	for c := range next {
		if !o.cookies[c] {
			if err := m.Put(c, uint8(1)); err != nil {
				errs = append(errs, fmt.Errorf("skip a pod's sockets (netns cookie %d): %w", c, err))
				unresolved++
				delete(next, c)
			}
		}
	}
	for c := range o.cookies {
		if !next[c] {
			if err := m.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("translate a pod's sockets again (netns cookie %d): %w", c, err))
				next[c] = true
			}
		}
	}
	added, removed := 0, 0
	for c := range next {
		if !o.cookies[c] {
			added++
		}
	}
	for c := range o.cookies {
		if !next[c] {
			removed++
		}
	}
	o.cookies = next
	o.metrics.pods.Set(float64(len(next)))
	o.metrics.unresolved.Set(float64(unresolved))
	if added > 0 || removed > 0 || unresolved != o.reported {
		log := d.log.Info
		if unresolved > 0 {
			log = d.log.Warn
		}
		log("pods opted out of the socket hooks: translated per packet at their devices",
			zap.Int("pods", len(next)), zap.Int("added", added), zap.Int("removed", removed),
			zap.Int("notFound", unresolved), zap.Strings("devices", slices.Sorted(maps.Keys(a.optedOut))))
		o.reported = unresolved
	}
	return errors.Join(errs...)
}

// findPods finds the network namespaces of the node holding addrs, each on
// a veth whose peer is in the node's namespace (node, with its netlink
// handle nl): a pod's. Addresses no such namespace holds are left out; so
// are namespaces it cannot read, which the error names when some address
// was not found.
func findPods(ctx context.Context, lister sockterm.NamespaceLister, node vnetns.NsHandle, nl *netlink.Handle, addrs []netip.Addr) (map[netip.Addr]podNetns, error) {
	spaces, listErr := lister(ctx)
	found := map[netip.Addr]podNetns{}
	var errs []error
	if listErr != nil && len(spaces) == 0 {
		return found, listErr
	}
	nodeIno, err := inode(node)
	if err != nil {
		return found, err
	}
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		want[a.Unmap()] = true
	}
	for _, ns := range spaces {
		if len(found) == len(want) {
			break
		}
		if ns.Inode == nodeIno {
			continue
		}
		got, err := podIn(ns, node, nl, want)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		maps.Copy(found, got)
	}
	if len(found) == len(want) {
		// Namespaces it could not read (the node's other processes'
		// under a security module) hold none of them.
		return found, nil
	}
	if listErr != nil {
		errs = append(errs, listErr)
	}
	return found, errors.Join(errs...)
}

// podIn returns the addresses of want that the namespace ns holds on a
// veth whose peer is in node, with the namespace's cookie and the peer's
// name; none when ns is not such a pod's (or has vanished).
func podIn(ns sockterm.Namespace, node vnetns.NsHandle, nl *netlink.Handle, want map[netip.Addr]bool) (map[netip.Addr]podNetns, error) {
	h, ok, err := sockterm.OpenNamespace(ns)
	if err != nil || !ok {
		return nil, err
	}
	defer h.Close()
	pnl, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", ns.Path, err)
	}
	defer pnl.Close()
	addrs, err := pnl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses in %s: %w", ns.Path, err)
	}
	out := map[netip.Addr]podNetns{}
	var nodeID *int
	for _, ad := range addrs {
		ip, ok := netip.AddrFromSlice(ad.IP)
		if !ok || !want[ip.Unmap()] {
			continue
		}
		lk, err := pnl.LinkByIndex(ad.LinkIndex)
		if err != nil || lk.Type() != "veth" {
			continue
		}
		// The peer must be in the node's namespace: the same address
		// may be a pod's of another node on the same machine (a test).
		if nodeID == nil {
			id, err := pnl.GetNetNsIdByFd(int(node))
			if err != nil {
				return nil, fmt.Errorf("the node's namespace id in %s: %w", ns.Path, err)
			}
			nodeID = &id
		}
		if *nodeID < 0 || lk.Attrs().NetNsID != *nodeID {
			continue
		}
		peer, err := nl.LinkByIndex(lk.Attrs().ParentIndex)
		if err != nil || !isPodDevice(peer) {
			continue
		}
		var cookie uint64
		if err := netns.DoHandle(h, func() (err error) {
			cookie, err = loader.NetnsCookie()
			return err
		}); err != nil {
			return nil, fmt.Errorf("cookie of %s: %w", ns.Path, err)
		}
		out[ip.Unmap()] = podNetns{cookie: cookie, device: peer.Attrs().Name}
	}
	return out, nil
}

// inode is the inode number of the namespace h.
func inode(h vnetns.NsHandle) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		return 0, fmt.Errorf("the node's namespace: %w", err)
	}
	return st.Ino, nil
}
