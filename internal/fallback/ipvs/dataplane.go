package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// appliedVS is a virtual server as the kernel holds it.
type appliedVS struct {
	scheduler   string
	persistence time.Duration
	// reals maps each real server to its weight: 1, or 0 while it
	// drains.
	reals map[netip.AddrPort]int
	// draining holds the deadline of each weight-0 real server.
	draining map[netip.AddrPort]time.Time
}

// Dataplane programs IPVS. It implements dataplane.Dataplane; Sync and the
// background reaper of drained real servers may run concurrently.
type Dataplane struct {
	cfg    Config
	runner *xtables.Runner
	k      *kernel
	r      renderer
	// ct deletes the UDP conntrack entries each sync made stale.
	ct *nfconntrack.Cleaner
	// dropInvalid mirrors the iptables dataplane (nf_conntrack_tcp_be_liberal).
	dropInvalid bool
	now         func() time.Time

	mu sync.Mutex
	// services are the configurations last applied per ServicePort.
	services map[model.ServicePortName]serviceConfig
	// want counts, over all services, what they need; a key stays in
	// the kernel while its count is positive.
	wantVS    map[vsKey][]virtualServer
	wantAddr  map[netip.Addr]int
	wantEntry map[setEntry]int
	// have is what the kernel holds of ours.
	haveVS    map[vsKey]*appliedVS
	haveAddr  map[netip.Addr]bool
	haveEntry map[setEntry]bool
	// chains are our iptables chains found at start-up or after a
	// failure, for the next full sync to remove those it does not need.
	chains   map[string]map[string]bool
	dummy    netlink.Link
	synced   bool
	needRead bool

	stop chan struct{}
	done chan struct{}
}

// New prepares the IPVS dataplane for the namespace in cfg: it checks that
// IPVS works (ErrNoIPVS if not), creates the dummy interface and the
// ipsets, sets the IPVS sysctls, reads what an earlier agent left (so that
// a restart neither drops connections nor leaves real servers at weight
// 0) and starts the reaper of drained real servers. Close stops it. The
// first Sync is always full.
func New(ctx context.Context, cfg Config) (*Dataplane, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("IPVS dataplane: %w", err)
	}
	if err := Available(cfg.Netns); err != nil {
		return nil, fmt.Errorf("IPVS dataplane: %w", err)
	}
	backend, err := xtables.DetectFamily(ctx, cfg.Netns, cfg.Backend, cfg.IPv6)
	if err != nil {
		return nil, fmt.Errorf("IPVS dataplane: %w", err)
	}
	k, err := openKernel(cfg.Netns, cfg.family())
	if err != nil {
		return nil, fmt.Errorf("IPVS dataplane: %w", err)
	}
	d := &Dataplane{
		cfg:         cfg,
		runner:      &xtables.Runner{Backend: backend, Netns: cfg.Netns},
		k:           k,
		ct:          cfg.conntrackCleaner(),
		dropInvalid: !sysctl.TCPBeLiberal(cfg.Netns),
		now:         time.Now,
		services:    map[model.ServicePortName]serviceConfig{},
		wantVS:      map[vsKey][]virtualServer{},
		wantAddr:    map[netip.Addr]int{},
		wantEntry:   map[setEntry]int{},
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	d.r.cfg = &d.cfg
	if err := setSysctls(cfg.Netns); err != nil {
		k.close()
		return nil, fmt.Errorf("IPVS dataplane: %w", err)
	}
	if cfg.TCPTimeout > 0 || cfg.TCPFinTimeout > 0 || cfg.UDPTimeout > 0 {
		// The kernel leaves a timeout given as 0 unchanged.
		if err := k.ipvs.SetConfig(&libipvs.Config{TimeoutTCP: cfg.TCPTimeout, TimeoutTCPFin: cfg.TCPFinTimeout, TimeoutUDP: cfg.UDPTimeout}); err != nil {
			k.close()
			return nil, fmt.Errorf("IPVS dataplane: set timeouts: %w", err)
		}
	}
	if err := d.read(ctx); err != nil {
		k.close()
		return nil, fmt.Errorf("IPVS dataplane: %w", err)
	}
	cfg.Logger.Info("IPVS dataplane ready", zap.String("ipFamily", cfg.family().name), zap.String("scheduler", cfg.Scheduler), zap.String("iptablesBackend", backend.Name),
		zap.Int("existingVirtualServers", len(d.haveVS)), zap.Int("existingAddresses", len(d.haveAddr)))
	go d.reapLoop()
	return d, nil
}

// Name returns "ipvs".
func (d *Dataplane) Name() string { return Name }

// Close stops the reaper and releases the handles. What was programmed
// stays: it keeps serving until the next agent adopts it.
func (d *Dataplane) Close() {
	select {
	case <-d.stop:
		return
	default:
	}
	close(d.stop)
	<-d.done
	d.k.close()
}

// read learns what of ours the kernel holds, in our family only: the dummy
// interface's addresses, the ipset entries, our virtual servers (those on
// the dummy's addresses or listed in the frontend sets) with their real
// servers, and our iptables chains. Real servers at weight 0 are draining.
func (d *Dataplane) read(ctx context.Context) error {
	var err error
	if d.dummy, err = d.k.dummy(true); err != nil {
		return err
	}
	small, err := d.k.ensureSets(d.cfg.family(), d.cfg.IPSetMaxElements)
	if err != nil {
		return err
	}
	if len(small) > 0 {
		d.cfg.Logger.Warn("ipsets created earlier hold fewer entries than configured; run --cleanup to recreate them",
			zap.Strings("sets", small), zap.Uint32("wanted", d.cfg.IPSetMaxElements))
	}
	if d.haveAddr, err = d.k.dummyAddrs(d.dummy, d.cfg.family()); err != nil {
		return err
	}
	exist, err := d.k.listSets()
	if err != nil {
		return err
	}
	if d.haveEntry, err = d.k.setEntries(d.cfg.family(), exist); err != nil {
		return err
	}
	frontends := map[vsKey]bool{}
	for e := range d.haveEntry {
		if slices.Contains(frontendSets, e.Set) {
			frontends[vsKey{Addr: e.IP, Proto: e.Proto, Port: e.Port}] = true
		}
	}
	services, err := d.k.ipvs.GetServices()
	if err != nil {
		return fmt.Errorf("list virtual servers: %w", err)
	}
	d.haveVS = map[vsKey]*appliedVS{}
	deadline := d.now().Add(d.cfg.GracePeriod)
	for _, s := range services {
		key, ok := keyOf(s)
		if !ok || !d.cfg.inFamily(key.Addr) || !(d.haveAddr[key.Addr] || frontends[key]) {
			continue // not ours, or the other family's dataplane's
		}
		a := &appliedVS{scheduler: s.SchedName, reals: map[netip.AddrPort]int{}, draining: map[netip.AddrPort]time.Time{}}
		if s.Flags&flagPersistent != 0 {
			a.persistence = time.Duration(s.Timeout) * time.Second
		}
		dests, err := d.k.ipvs.GetDestinations(s)
		if err != nil {
			return fmt.Errorf("list real servers of %s: %w", key, err)
		}
		for _, dst := range dests {
			rs := destKey(dst)
			a.reals[rs] = dst.Weight
			if dst.Weight == 0 {
				a.draining[rs] = deadline
			}
		}
		d.haveVS[key] = a
	}
	d.chains = map[string]map[string]bool{}
	for _, table := range xtables.Tables {
		own, err := xtables.ReadOwned(ctx, d.runner, table, xtables.Prefix)
		if err != nil {
			return err
		}
		d.chains[table] = own.Chains
	}
	d.needRead = false
	return nil
}

// Sync applies up: a full sync on the first call, when up.Full is set and
// after a failure (which re-reads the kernel first); else only the
// ServicePorts in up.Changed. Changes are ordered make-before-break:
// addresses, virtual and real servers, set entries are added first, then
// real servers drain, and only then do virtual servers, set entries and
// addresses go. Last, the UDP conntrack entries that the change made stale
// are deleted (nfconntrack.Cleaner); a failure to delete them is logged and
// does not fail the sync.
func (d *Dataplane) Sync(up model.Update) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
	defer cancel()
	full := up.Full || !d.synced || d.needRead
	if err := d.sync(ctx, up, full); err != nil {
		d.needRead = true
		return fmt.Errorf("ipvs sync (full=%t, %d changed): %w", full, len(up.Changed), err)
	}
	d.synced = true
	// IPVS moves a flow off a deleted UDP real server by itself
	// (expire_nodest_conn; TestStaleUDPFlowsAreCleared sees it do so
	// without this on kernel 6.12), but a flow that left the node untranslated before its Service was
	// programmed keeps its entry, and IPVS never sees it: delete the
	// entries the change made stale, as the iptables mode and upstream's
	// IPVS mode do.
	d.ct.Synced(up)
	return nil
}

func (d *Dataplane) sync(ctx context.Context, up model.Update, full bool) error {
	if d.needRead {
		if err := d.read(ctx); err != nil {
			return err
		}
	}
	var touchedVS []vsKey
	var touchedAddr []netip.Addr
	var touchedEntry []setEntry
	if full {
		d.r.nodeIPs, d.r.nodePortIPs = d.cfg.NodeIPs, d.cfg.NodeIPs
		if len(d.cfg.NodeIPs) == 0 {
			d.r.nodeIPs, d.r.nodePortIPs = nil, nil
			for _, a := range up.State.Node.Addrs {
				if d.cfg.inFamily(a) {
					d.r.nodeIPs = append(d.r.nodeIPs, a)
				}
			}
			d.r.nodePortIPs = up.State.Node.NodePorts.External()
		}
		d.services = map[model.ServicePortName]serviceConfig{}
		d.wantVS = map[vsKey][]virtualServer{}
		d.wantAddr = map[netip.Addr]int{}
		d.wantEntry = map[setEntry]int{}
		for name, svc := range up.State.Services {
			c := d.r.service(svc)
			d.services[name] = c
			d.claim(c, 1)
		}
		for k := range d.wantVS {
			touchedVS = append(touchedVS, k)
		}
		for k := range d.haveVS {
			touchedVS = append(touchedVS, k)
		}
		for a := range d.wantAddr {
			touchedAddr = append(touchedAddr, a)
		}
		for a := range d.haveAddr {
			touchedAddr = append(touchedAddr, a)
		}
		for e := range d.wantEntry {
			touchedEntry = append(touchedEntry, e)
		}
		for e := range d.haveEntry {
			touchedEntry = append(touchedEntry, e)
		}
	} else {
		for name := range up.Changed {
			old, had := d.services[name]
			if had {
				d.claim(old, -1)
				touchedVS, touchedAddr, touchedEntry = touch(old, touchedVS, touchedAddr, touchedEntry)
				delete(d.services, name)
			}
			if svc := up.State.Services[name]; svc != nil {
				c := d.r.service(svc)
				d.services[name] = c
				d.claim(c, 1)
				touchedVS, touchedAddr, touchedEntry = touch(c, touchedVS, touchedAddr, touchedEntry)
			}
		}
	}
	slices.SortFunc(touchedVS, func(a, b vsKey) int { return strings.Compare(a.String(), b.String()) })
	touchedVS = slices.Compact(touchedVS)

	// Make: addresses, virtual servers and their real servers, entries.
	for _, a := range touchedAddr {
		if d.wantAddr[a] > 0 && !d.haveAddr[a] {
			if err := d.k.bind(d.dummy, a); err != nil {
				return err
			}
			d.haveAddr[a] = true
		}
	}
	for _, key := range touchedVS {
		if err := d.reconcileVS(key); err != nil {
			return err
		}
	}
	for _, e := range touchedEntry {
		if d.wantEntry[e] > 0 && !d.haveEntry[e] {
			if err := d.k.addEntry(e); err != nil {
				return err
			}
			d.haveEntry[e] = true
		}
	}
	if full {
		tx, err := transaction(&d.cfg, d.dropInvalid, d.chains, func(tx *xtables.Transaction) error {
			return xtables.EnsureHooks(ctx, d.runner, xtables.Prefix, hooks(), tx)
		})
		if err != nil {
			return err
		}
		if err := d.runner.Restore(ctx, tx.Bytes()); err != nil {
			if m := d.cfg.Metrics; m != nil {
				m.IPTablesRestoreFailuresTotal.Inc()
			}
			return err
		}
		d.chains = map[string]map[string]bool{}
		for table, cs := range chains {
			d.chains[table] = map[string]bool{}
			for _, c := range cs {
				d.chains[table][c] = true
			}
		}
	}
	// Break: entries, virtual servers, addresses nobody wants.
	for _, e := range touchedEntry {
		if d.wantEntry[e] <= 0 && d.haveEntry[e] {
			if err := d.k.delEntry(e); err != nil {
				return err
			}
			delete(d.haveEntry, e)
		}
	}
	for _, key := range touchedVS {
		if len(d.wantVS[key]) == 0 && d.haveVS[key] != nil {
			if d.excluded(key.Addr) {
				// --ipvs-exclude-cidrs: kept, as kube-proxy keeps
				// them, and still known should it be wanted again.
				continue
			}
			if err := d.k.ipvs.DelService(ipvsService(key, "", 0)); err != nil {
				return fmt.Errorf("delete virtual server %s: %w", key, err)
			}
			delete(d.haveVS, key)
		}
	}
	for _, a := range touchedAddr {
		if d.wantAddr[a] <= 0 && d.haveAddr[a] {
			if err := d.k.unbind(d.dummy, a); err != nil {
				return err
			}
			delete(d.haveAddr, a)
		}
	}
	return nil
}

// claim adds (n=1) or removes (n=-1) what c needs to the wanted counts.
func (d *Dataplane) claim(c serviceConfig, n int) {
	for _, vs := range c.Servers {
		if n > 0 {
			d.wantVS[vs.Key] = append(d.wantVS[vs.Key], vs)
		} else {
			claims := d.wantVS[vs.Key]
			i := slices.IndexFunc(claims, func(o virtualServer) bool { return o.Owner == vs.Owner })
			if i >= 0 {
				claims = slices.Delete(claims, i, i+1)
			}
			if len(claims) == 0 {
				delete(d.wantVS, vs.Key)
			} else {
				d.wantVS[vs.Key] = claims
			}
		}
	}
	for _, a := range c.Addrs {
		d.wantAddr[a] += n
		if d.wantAddr[a] <= 0 {
			delete(d.wantAddr, a)
		}
	}
	for _, e := range c.Entries {
		d.wantEntry[e] += n
		if d.wantEntry[e] <= 0 {
			delete(d.wantEntry, e)
		}
	}
}

func touch(c serviceConfig, vs []vsKey, addrs []netip.Addr, entries []setEntry) ([]vsKey, []netip.Addr, []setEntry) {
	for _, s := range c.Servers {
		vs = append(vs, s.Key)
	}
	return vs, append(addrs, c.Addrs...), append(entries, c.Entries...)
}

// effective picks, when two ServicePorts claim one virtual server (a
// conflict in the Services, such as a shared ExternalIP and port), the one
// with the smallest name, so that the choice does not depend on order.
func effective(claims []virtualServer) *virtualServer {
	if len(claims) == 0 {
		return nil
	}
	best := &claims[0]
	for i := range claims[1:] {
		if claims[i+1].Owner.String() < best.Owner.String() {
			best = &claims[i+1]
		}
	}
	return best
}

// reconcileVS makes the kernel's virtual server key match its claim:
// created or updated, real servers added at weight 1, real servers no
// longer wanted set to weight 0 to drain (TCP) or deleted (UDP, SCTP). A
// virtual server nobody claims is left for the break phase.
func (d *Dataplane) reconcileVS(key vsKey) error {
	want := effective(d.wantVS[key])
	if want == nil {
		return nil
	}
	svc := ipvsService(key, want.Scheduler, want.Persistence)
	have := d.haveVS[key]
	switch {
	case have == nil:
		if err := d.k.ipvs.NewService(svc); err != nil {
			return fmt.Errorf("create virtual server %s: %w", key, err)
		}
		have = &appliedVS{scheduler: want.Scheduler, persistence: want.Persistence, reals: map[netip.AddrPort]int{}, draining: map[netip.AddrPort]time.Time{}}
		d.haveVS[key] = have
	case have.scheduler != want.Scheduler || have.persistence != want.Persistence:
		if err := d.k.ipvs.UpdateService(svc); err != nil {
			return fmt.Errorf("update virtual server %s: %w", key, err)
		}
		have.scheduler, have.persistence = want.Scheduler, want.Persistence
	}
	for _, rs := range want.Reals {
		switch w, ok := have.reals[rs]; {
		case !ok:
			if err := d.k.ipvs.NewDestination(svc, destination(rs, 1)); err != nil {
				return fmt.Errorf("add real server %s to %s: %w", rs, key, err)
			}
		case w != 1:
			// Back before it drained: serve again.
			if err := d.k.ipvs.UpdateDestination(svc, destination(rs, 1)); err != nil {
				return fmt.Errorf("restore real server %s of %s: %w", rs, key, err)
			}
		}
		have.reals[rs] = 1
		delete(have.draining, rs)
	}
	for rs, w := range have.reals {
		if slices.Contains(want.Reals, rs) {
			continue
		}
		if key.Proto != model.TCP {
			// UDP and SCTP flows have no end IPVS could wait for;
			// expire_nodest_conn moves them on at their next packet.
			if err := d.k.ipvs.DelDestination(svc, destination(rs, 0)); err != nil {
				return fmt.Errorf("delete real server %s of %s: %w", rs, key, err)
			}
			delete(have.reals, rs)
			delete(have.draining, rs)
			continue
		}
		if w != 0 {
			if err := d.k.ipvs.UpdateDestination(svc, destination(rs, 0)); err != nil {
				return fmt.Errorf("drain real server %s of %s: %w", rs, key, err)
			}
			have.reals[rs] = 0
			have.draining[rs] = d.now().Add(d.cfg.GracePeriod)
		}
	}
	return nil
}

func (d *Dataplane) reapLoop() {
	defer close(d.done)
	t := time.NewTicker(d.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			if err := d.reap(); err != nil {
				d.cfg.Logger.Warn("checking draining real servers failed; retrying", zap.Error(err))
			}
		}
	}
}

// reap deletes draining real servers that have no connection left (active
// or inactive, which includes TIME_WAIT), or whose grace period is over.
func (d *Dataplane) reap() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for key, have := range d.haveVS {
		if len(have.draining) == 0 {
			continue
		}
		svc := ipvsService(key, have.scheduler, have.persistence)
		dests, err := d.k.ipvs.GetDestinations(svc)
		if err != nil {
			errs = append(errs, fmt.Errorf("list real servers of %s: %w", key, err))
			continue
		}
		conns := map[netip.AddrPort]int{}
		present := map[netip.AddrPort]bool{}
		for _, dst := range dests {
			rs := destKey(dst)
			present[rs] = true
			conns[rs] = dst.ActiveConnections + dst.InactiveConnections
		}
		for rs, deadline := range have.draining {
			if !present[rs] {
				delete(have.draining, rs)
				delete(have.reals, rs)
				continue
			}
			expired := !d.now().Before(deadline)
			if conns[rs] > 0 && !expired {
				continue
			}
			if err := d.k.ipvs.DelDestination(svc, destination(rs, 0)); err != nil {
				errs = append(errs, fmt.Errorf("delete drained real server %s of %s: %w", rs, key, err))
				continue
			}
			d.cfg.Logger.Debug("deleted drained real server", zap.Stringer("frontend", key), zap.Stringer("backend", rs),
				zap.Int("connections", conns[rs]), zap.Bool("gracePeriodOver", expired))
			delete(have.draining, rs)
			delete(have.reals, rs)
		}
	}
	return errors.Join(errs...)
}

// excluded says whether a is in one of the ExcludeCIDRs.
func (d *Dataplane) excluded(a netip.Addr) bool {
	for _, p := range d.cfg.ExcludeCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
