package nfconntrack

import (
	"maps"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// Netns is the path of the network namespace whose conntrack table
	// is cleaned, the dataplane's; "" is the agent's own.
	Netns string
	// IPv6 cleans the IPv6 table; false is IPv4. It is the dataplane's
	// family: the States it is told hold addresses of that family only.
	IPv6 bool
	// Logger receives what was deleted (debug) and failures (warn); nil
	// logs nothing.
	Logger *zap.Logger
	// Metrics, if set, receives kubeproxy_conntrack_reconciler_sync_duration_seconds
	// and kubeproxy_conntrack_reconciler_deleted_entries_total.
	Metrics *metrics.FamilyMetrics
}

// Cleaner deletes, after each sync of a fallback dataplane, the UDP
// conntrack entries that the sync made stale (see Diff). It remembers the
// Services the dataplane last applied. It is not safe for concurrent use:
// the dataplane's Sync is its only caller.
type Cleaner struct {
	cfg CleanerConfig
	// applied are the Services of the last update the dataplane applied,
	// nil before the first: then every UDP frontend with endpoints is
	// checked, which also clears what was left stale while no agent ran.
	applied map[model.ServicePortName]*model.Service
}

// NewCleaner returns a Cleaner for the namespace and family in cfg.
func NewCleaner(cfg CleanerConfig) *Cleaner {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Cleaner{cfg: cfg}
}

// IPv6 reports whether the Cleaner cleans the IPv6 table.
func (c *Cleaner) IPv6() bool { return c.cfg.IPv6 }

// Netns returns the path of the namespace the Cleaner cleans ("" for the
// agent's own).
func (c *Cleaner) Netns() string { return c.cfg.Netns }

// Synced is told each update once the dataplane has applied it (never a
// failed one: the next, full, update is then compared with the last one
// applied). It records the update's Services and deletes the UDP entries
// the change made stale, returning how many it deleted. A failure is
// logged as a warning; it never fails the sync.
func (c *Cleaner) Synced(up model.Update) int {
	stale := c.staleOf(up)
	if len(stale) == 0 {
		return 0
	}
	return c.Delete(stale)
}

// staleOf records up as applied and returns what it made stale.
func (c *Cleaner) staleOf(up model.Update) Stale {
	whole := up.Full || c.applied == nil
	var names []model.ServicePortName
	if whole {
		names = slices.Collect(maps.Keys(up.State.Services))
		for n := range c.applied {
			if _, ok := up.State.Services[n]; !ok {
				names = append(names, n)
			}
		}
	} else {
		names = slices.Collect(maps.Keys(up.Changed))
	}
	stale := Diff(c.applied, up.State.Services, names)
	if whole {
		c.applied = make(map[model.ServicePortName]*model.Service, len(up.State.Services))
		maps.Copy(c.applied, up.State.Services)
		return stale
	}
	for _, n := range names {
		if svc := up.State.Services[n]; svc != nil {
			c.applied[n] = svc
		} else {
			delete(c.applied, n)
		}
	}
	return stale
}

// Delete deletes the UDP entries of the Cleaner's family and namespace
// that stale names, with one pass over the table, and returns how many it
// deleted. Failures are logged as warnings.
func (c *Cleaner) Delete(stale Stale) int {
	start := time.Now()
	f := newFilter(stale)
	family := netlink.InetFamily(unix.AF_INET)
	if c.cfg.IPv6 {
		family = unix.AF_INET6
	}
	var n uint
	err := netns.Do(c.cfg.Netns, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err != nil {
			return err
		}
		defer h.Close()
		n, err = h.ConntrackDeleteFilters(netlink.ConntrackTable, family, f)
		return err
	})
	took := time.Since(start)
	if m := c.cfg.Metrics; m != nil {
		m.ConntrackReconcilerSyncDuration.Observe(took.Seconds())
		m.ConntrackReconcilerDeletedEntriesTotal.Add(float64(n))
	}
	fronts := make([]string, 0, len(stale))
	for fr := range stale {
		fronts = append(fronts, fr.String())
	}
	slices.Sort(fronts)
	if err != nil {
		c.cfg.Logger.Warn("deleting stale UDP conntrack entries failed", zap.Strings("frontends", fronts),
			zap.Uint("deleted", n), zap.Duration("took", took), zap.Error(err))
	} else {
		c.cfg.Logger.Debug("deleted stale UDP conntrack entries", zap.Strings("frontends", fronts),
			zap.Uint("deleted", n), zap.Strings("flows", f.deleted), zap.Duration("took", took))
	}
	return int(n)
}

// filter matches the UDP flows that a Stale names. It is one filter for
// the whole Stale so that each flow of the table costs two map look-ups,
// however many frontends changed.
type filter struct {
	byAddr map[netip.AddrPort]*rule
	byPort map[uint16]*rule
	// deleted describes the flows matched, for the debug log (at most
	// maxLoggedFlows).
	deleted []string
}

// maxLoggedFlows bounds the flows one debug line lists.
const maxLoggedFlows = 32

type rule struct {
	serving, removed map[netip.AddrPort]bool
}

func newFilter(s Stale) *filter {
	f := &filter{byAddr: map[netip.AddrPort]*rule{}, byPort: map[uint16]*rule{}}
	for fr, r := range s {
		cr := &rule{serving: map[netip.AddrPort]bool{}, removed: map[netip.AddrPort]bool{}}
		for _, ep := range r.Serving {
			cr.serving[ep] = true
		}
		for _, ep := range r.Removed {
			cr.removed[ep] = true
		}
		if fr.IsNodePort() {
			f.byPort[fr.Port] = cr
		} else {
			f.byAddr[netip.AddrPortFrom(fr.Addr, fr.Port)] = cr
		}
	}
	return f
}

// stale says whether a flow whose replies come from src is stale.
func (r *rule) stale(src netip.AddrPort) bool {
	if r.serving[src] {
		return false
	}
	return len(r.serving) > 0 || r.removed[src]
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter: it matches
// a UDP flow sent to a frontend of the Stale (its original destination, or
// only its port for a NodePort) whose replies come from where that
// frontend's Rule says is stale.
func (f *filter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst := addrPort(flow.Forward.DstIP, flow.Forward.DstPort)
	src := addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort)
	match := false
	if r := f.byAddr[dst]; r != nil && r.stale(src) {
		match = true
	} else if r := f.byPort[dst.Port()]; r != nil && r.stale(src) {
		match = true
	}
	if match && len(f.deleted) < maxLoggedFlows {
		f.deleted = append(f.deleted, addrPort(flow.Forward.SrcIP, flow.Forward.SrcPort).String()+"->"+dst.String()+" replied by "+src.String())
	}
	return match
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
