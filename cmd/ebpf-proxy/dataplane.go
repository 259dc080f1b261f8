package main

import (
	"context"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sockterm"
)

// bpfDataplane is the maps Writer plus the ending of sockets still
// connected to backends a sync removed: TCP connections are aborted rather
// than left hanging on a dead pod, and connected UDP sockets (a DNS client's)
// are closed so that the application reconnects to a live backend.
type bpfDataplane struct {
	*maps.Writer
	term *sockterm.Terminator
	log  *zap.Logger
	// prepare, when set, runs before each sync and may change the update:
	// the TC attacher gives the NodePort addresses and attaches once the
	// node's devices are known.
	prepare func(*model.Update) error
	// ranges attaches and detaches the source range check around syncs.
	ranges *sourceRangeCheck

	mu      sync.Mutex
	pending []sockterm.Backend
	wake    chan struct{}

	terminated *prometheus.CounterVec
}

func newBPFDataplane(w *maps.Writer, term *sockterm.Terminator, reg prometheus.Registerer, log *zap.Logger) *bpfDataplane {
	d := &bpfDataplane{Writer: w, term: term, log: log, wake: make(chan struct{}, 1),
		terminated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ebpfproxy_sockets_terminated_total",
			Help: "Sockets ended because the backend they were connected to through a Service was removed, by protocol.",
		}, []string{"protocol"}),
	}
	reg.MustRegister(d.terminated)
	return d
}

// Sync implements proxier.Dataplane. Sockets are ended after the maps no
// longer name the removed backends, so a reconnecting client cannot land on
// them again, and outside the sync loop, which must not wait for a scan of
// every network namespace.
func (d *bpfDataplane) Sync(up model.Update) error {
	if d.prepare != nil {
		if err := d.prepare(&up); err != nil {
			return err
		}
	}
	if err := d.ranges.before(up); err != nil {
		return err
	}
	if err := d.Writer.Sync(up); err != nil {
		return err
	}
	d.ranges.after(d.Writer)
	if d.term == nil {
		return nil
	}
	var gone []sockterm.Backend
	for _, b := range d.Writer.Removed() {
		if b.Proto == model.TCP || b.Proto == model.UDP {
			gone = append(gone, sockterm.Backend{Addr: netipAddrPort(b), Proto: b.Proto})
		}
	}
	if len(gone) == 0 {
		return nil
	}
	d.mu.Lock()
	d.pending = append(d.pending, gone...)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	return nil
}

// run ends the sockets of removed backends until ctx is done.
func (d *bpfDataplane) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		}
		d.mu.Lock()
		batch := d.pending
		d.pending = nil
		d.mu.Unlock()
		st, err := d.term.Terminate(ctx, batch)
		d.terminated.WithLabelValues("TCP").Add(float64(st.DestroyedTCP))
		d.terminated.WithLabelValues("UDP").Add(float64(st.DestroyedUDP))
		if err != nil {
			d.log.Warn("ending sockets of removed backends", zap.Int("backends", len(batch)), zap.Error(err))
		}
		if st.DestroyedTCP+st.DestroyedUDP > 0 {
			d.log.Info("ended sockets connected to removed backends", zap.Int("backends", len(batch)),
				zap.Int("tcp", st.DestroyedTCP), zap.Int("udp", st.DestroyedUDP), zap.Int("namespaces", st.Namespaces))
		}
	}
}

func netipAddrPort(b maps.Backend) netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }
