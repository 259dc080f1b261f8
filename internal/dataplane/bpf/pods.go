package bpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Where pods are translated (--socket-lb-scope).
const (
	// SocketLBAll translates every socket of the node and its pods at
	// connect() and sendmsg(): the fastest, and the default.
	SocketLBAll = "all"
	// SocketLBNode translates only the node's own sockets there; pods'
	// packets are translated at their devices on the node, so that a
	// proxy inside a pod (a service mesh's sidecar) sees the Service
	// address its pod connected to.
	SocketLBNode = "node"
)

// ValidateSocketLBScope checks --socket-lb-scope.
func ValidateSocketLBScope(s string) error {
	if s != SocketLBAll && s != SocketLBNode {
		return fmt.Errorf("--socket-lb-scope %q: want %q or %q", s, SocketLBAll, SocketLBNode)
	}
	return nil
}

// Bounds of the pods' devices watch: link events are gathered for
// podSettle before the devices are attached to (a pod's creation brings
// several), and the devices are listed again every podRescan in case an
// event was lost (a full netlink socket).
const (
	podSettle = 50 * time.Millisecond
	podRescan = 10 * time.Second
)

// podMetrics are the pods' devices the TC programs are attached to and the
// attempts that failed.
type podMetrics struct {
	devices  prometheus.Gauge
	failures prometheus.Counter
}

func newPodMetrics() podMetrics {
	return podMetrics{
		devices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ebpfproxy_bpf_pod_devices",
			Help: "Pods' devices on the node (host sides of their veths) whose packets the TC programs translate per packet: every pod's under --socket-lb-scope=node, those of pods opted out of the socket hooks otherwise.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ebpfproxy_bpf_pod_device_attach_failures_total",
			Help: "Attempts to attach the TC programs to the pods' devices that failed; the devices attached before keep their programs, and the next attempt comes at the next change or within 10s.",
		}),
	}
}

// podDeviceNames are the node's devices that are pods' in the namespace of
// nl: veths whose peer is in another network namespace (the host sides a
// CNI plugin makes), but for exclude (the node's own devices). Sorted.
func podDeviceNames(nl *netlink.Handle, exclude []string) ([]string, error) {
	links, err := nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list devices: %w", err)
	}
	var out []string
	for _, lk := range links {
		if isPodDevice(lk) && !slices.Contains(exclude, lk.Attrs().Name) {
			out = append(out, lk.Attrs().Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// podDevices are the pods' devices to attach to, but for exclude (the
// node's own devices), sorted: every pod's with pods, else those of the
// pods opted out of the socket hooks that still exist (the others are
// forgotten). It runs in the attacher's namespace.
func (a *tcAttacher) podDevices(exclude []string) ([]string, error) {
	if a.pods {
		return podDeviceNames(a.nl, exclude)
	}
	var out []string
	for name := range a.optedOut {
		lk, err := a.nl.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				return nil, fmt.Errorf("device %s: %w", name, err)
			}
			delete(a.optedOut, name)
			continue
		}
		if isPodDevice(lk) && !slices.Contains(exclude, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// isPodDevice says whether lk is a veth whose peer is in another network
// namespace.
func isPodDevice(lk netlink.Link) bool {
	return lk.Type() == "veth" && lk.Attrs().NetNsID >= 0
}

// hairpinAddress is the address of family v6 a pod reaching itself through
// a Service is shown (kube-proxy masquerades that hairpin to the address
// the node routes to the pod from): its device's own, else that of the
// bridge it is a port of, else the node's first address of the family; the
// zero Addr when there is none (such flows are then dropped and counted,
// tc_snat_no_address).
func hairpinAddress(nl *netlink.Handle, dev string, v6 bool, nodeAddrs []netip.Addr) (netip.Addr, error) {
	ip, err := snatAddress(nl, dev, v6, nodeAddrs)
	if err != nil || ip.IsValid() {
		return ip, err
	}
	lk, err := nl.LinkByName(dev)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("device %s: %w", dev, err)
	}
	if m := lk.Attrs().MasterIndex; m > 0 {
		master, err := nl.LinkByIndex(m)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("bridge of %s: %w", dev, err)
		}
		if ip, err = snatAddress(nl, master.Attrs().Name, v6, nodeAddrs); err != nil || ip.IsValid() {
			return ip, err
		}
	}
	for _, a := range nodeAddrs {
		if a.Is6() == v6 {
			return a, nil
		}
	}
	return netip.Addr{}, nil
}

// watchPods attaches the TC programs to pods' devices as they come and
// go, until ctx is done: on the node's link events, and every podRescan.
func (d *Dataplane) watchPods(ctx context.Context) {
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	ns := d.tc.ns
	subscribed := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		Namespace:     &ns,
		ErrorCallback: func(err error) { d.log.Warn("pods' devices: link events", zap.Error(err)) },
	})
	if subscribed != nil {
		d.log.Error("pods' devices: cannot watch the node's links; new pods' devices are found every 10s", zap.Error(subscribed))
		updates = nil
	}
	rescan := time.NewTicker(podRescan)
	defer rescan.Stop()
	settle := time.NewTimer(0)
	defer settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-updates:
			if !ok {
				d.log.Warn("pods' devices: link events ended; new pods' devices are found every 10s")
				updates = nil
				continue
			}
			if u.Link != nil && u.Link.Type() == "veth" && (u.Header.Type == unix.RTM_DELLINK || isPodDevice(u.Link)) {
				settle.Reset(podSettle)
			}
			continue
		case <-settle.C:
		case <-rescan.C:
		}
		d.syncMu.Lock()
		switch {
		case d.closed:
		case d.optOut == nil:
			if err := d.refreshPods(); err != nil {
				d.log.Error("pods' devices: cannot attach the TC programs; pods whose device lacks them reach no Service (their sockets are not translated)", zap.Error(err))
			}
		case len(d.optOut.want) > 0 || len(d.optOut.cookies) > 0:
			if err := d.refreshOptOut(ctx); err != nil {
				d.log.Warn("pods opted out of the socket hooks", zap.Error(err))
			}
		}
		d.syncMu.Unlock()
	}
}

// refreshPods attaches the TC programs to the pods' devices there are now,
// once the node's devices have theirs, guards the pins of what changed and
// counts a failure, which the caller logs. Called with syncMu held.
func (d *Dataplane) refreshPods() error {
	changed, err := d.tc.refreshPods()
	if changed {
		d.refreshPins()
	}
	if err != nil {
		d.tc.podMetrics.failures.Inc()
	}
	return err
}

// refreshPods attaches the programs to the pods' devices, when those
// changed since the last call; changed says the links did (attached or
// detached).
func (a *tcAttacher) refreshPods() (changed bool, err error) {
	if a.loaded == nil {
		return false, nil
	}
	var names []string
	err = netns.DoHandle(a.ns, func() (err error) {
		names, err = a.podDevices(a.names)
		return err
	})
	if err != nil || slices.Equal(names, a.podNames) {
		return false, err
	}
	devs, snat, err := a.tcDevices(a.names, names)
	if err != nil {
		return false, err
	}
	cfg := a.cfg
	cfg.Devices = devs
	if err := netns.DoHandle(a.ns, func() error { return a.loaded.SetDevices(cfg) }); err != nil {
		return true, err
	}
	added, removed := diffNames(a.podNames, names)
	a.podNames, a.snat = names, snat
	a.podMetrics.devices.Set(float64(len(names)))
	a.log.Info("pods' devices: TC programs attached", zap.Int("devices", len(names)), zap.Strings("added", added), zap.Strings("removed", removed))
	return true, nil
}

// diffNames returns what is in next but not in prev, and the other way.
func diffNames(prev, next []string) (added, removed []string) {
	for _, n := range next {
		if !slices.Contains(prev, n) {
			added = append(added, n)
		}
	}
	for _, n := range prev {
		if !slices.Contains(next, n) {
			removed = append(removed, n)
		}
	}
	return added, removed
}
