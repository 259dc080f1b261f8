package nfconntrack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// KeepTable is the nftables table (family inet) that keeps connection
// tracking running in a namespace for the connections it translated before
// a mode without netfilter took over (Keep). It holds one chain, without a
// hook, whose one rule reads the connection state: no packet ever passes
// it, but while it exists the kernel tracks connections in the namespace,
// as it does while any rule needs conntrack.
const KeepTable = "ebpf-proxy-conntrack"

// DefaultKeepInterval is how often Keep counts the translated connections
// again while it keeps connection tracking running.
const DefaultKeepInterval = time.Minute

// KeepConfig configures Keep.
type KeepConfig struct {
	// Netns is the path of the dataplane's network namespace; "" is the
	// agent's own.
	Netns string
	// Interval is how often the connections are counted again;
	// DefaultKeepInterval if zero.
	Interval time.Duration
	// Logger receives what Keep does; nil logs nothing.
	Logger *zap.Logger
	// Held, if set, is set to the number of translated connections last
	// counted while they are kept, and to 0 once none is left.
	Held prometheus.Gauge
}

// Keep keeps the kernel's connection tracking running in the namespace for
// as long as it holds TCP connections that netfilter translated to another
// destination (Translated): kube-proxy's connections through Services, or
// a fallback mode's, on a node whose traffic a mode without netfilter (the
// BPF mode) now translates. Their packets are handed to the kernel (bpf/lib/
// nfct.h), whose conntrack entries go on translating them even once the
// rules that made them are removed, but only while connection tracking
// runs in the namespace, which the kernel does only while some rule needs
// it. So Keep, called before those rules are removed, creates KeepTable
// when such connections exist (else it deletes an earlier agent's) and
// returns how many there are. A goroutine then counts them again every
// Interval and deletes the table once none is left, or stops when ctx
// ends, leaving the table for the next agent's Keep; its errors are logged
// and retried.
func Keep(ctx context.Context, cfg KeepConfig) (int, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultKeepInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	n, err := Translated(cfg.Netns)
	if err != nil {
		return 0, fmt.Errorf("count the connections netfilter translated: %w", err)
	}
	cfg.held(n)
	if n == 0 {
		return 0, RemoveKeep(ctx, cfg.Netns)
	}
	if err := addKeep(ctx, cfg.Netns); err != nil {
		return n, fmt.Errorf("keep connection tracking running for %d connections netfilter translated: %w", n, err)
	}
	cfg.Logger.Info("keeping connection tracking running for the connections netfilter translated before this mode",
		zap.Int("connections", n), zap.String("table", "inet "+KeepTable))
	go cfg.watch(ctx)
	return n, nil
}

func (cfg *KeepConfig) held(n int) {
	if cfg.Held != nil {
		cfg.Held.Set(float64(n))
	}
}

// watch counts the translated connections every Interval and deletes
// KeepTable once none is left.
func (cfg *KeepConfig) watch(ctx context.Context) {
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := Translated(cfg.Netns)
		if err != nil {
			cfg.Logger.Warn("counting the connections netfilter translated", zap.Error(err))
			continue
		}
		cfg.held(n)
		if n > 0 {
			continue
		}
		if err := RemoveKeep(ctx, cfg.Netns); err != nil {
			cfg.Logger.Warn("removing the table that kept connection tracking running", zap.Error(err))
			continue
		}
		cfg.Logger.Info("the connections netfilter translated are gone: connection tracking no longer kept running",
			zap.String("table", "inet "+KeepTable))
		return
	}
}

// addKeep creates KeepTable, or leaves it as it is.
func addKeep(ctx context.Context, netnsPath string) error {
	return runKeep(ctx, netnsPath, false, func(tx *knftables.Transaction) {
		tx.Add(&knftables.Table{Comment: knftables.PtrTo("ebpf-proxy: keeps connection tracking running for connections translated before the BPF mode")})
		tx.Add(&knftables.Chain{Name: "keep"})
		tx.Flush(&knftables.Chain{Name: "keep"})
		tx.Add(&knftables.Rule{Chain: "keep", Rule: "ct state established counter"})
	})
}

// RemoveKeep deletes KeepTable from the namespace at netnsPath ("" for the
// caller's), where it exists: a mode translating with netfilter needs none,
// and --cleanup leaves none.
func RemoveKeep(ctx context.Context, netnsPath string) error {
	return runKeep(ctx, netnsPath, true, func(tx *knftables.Transaction) {
		// Adding first makes the deletion succeed where it is absent.
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
	})
}

// runKeep runs the transaction fill writes on KeepTable. Where nft or the
// kernel's nf_tables do not work, no table can be there: with removing,
// that is nothing to do.
func runKeep(ctx context.Context, netnsPath string, removing bool, fill func(*knftables.Transaction)) error {
	return netns.Do(netnsPath, func() error {
		nft, err := knftables.New(knftables.InetFamily, KeepTable)
		if err != nil {
			if removing {
				return nil
			}
			return err
		}
		tx := nft.NewTransaction()
		fill(tx)
		return nft.Run(ctx, tx)
	})
}

// The TCP states of the kernel's conntrack (enum tcp_conntrack) of a
// connection that is still open.
var openTCPStates = map[uint8]bool{
	1: true, // SYN_SENT
	2: true, // SYN_RECV
	3: true, // ESTABLISHED
	4: true, // FIN_WAIT
	5: true, // CLOSE_WAIT
	6: true, // LAST_ACK
	9: true, // SYN_SENT2
}

// Translated counts the open TCP connections, of both IP families, whose
// destination netfilter translated (DNAT: what kube-proxy does to a
// connection to a Service) in the namespace at netnsPath ("" for the
// caller's).
func Translated(netnsPath string) (int, error) {
	n := 0
	err := netns.Do(netnsPath, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err != nil {
			return err
		}
		defer h.Close()
		var errs []error
		for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			flows, err := h.ConntrackTableList(netlink.ConntrackTable, family)
			errs = append(errs, err)
			for _, f := range flows {
				if isTranslatedOpenTCP(f) {
					n++
				}
			}
		}
		return errors.Join(errs...)
	})
	return n, err
}

// isTranslatedOpenTCP says whether f is an open TCP connection whose
// destination was translated: its replies come from elsewhere than where
// it was sent.
func isTranslatedOpenTCP(f *netlink.ConntrackFlow) bool {
	if f.Forward.Protocol != unix.IPPROTO_TCP {
		return false
	}
	tcp, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP)
	if !ok || !openTCPStates[tcp.State] {
		return false
	}
	return !f.Forward.DstIP.Equal(f.Reverse.SrcIP) || f.Forward.DstPort != f.Reverse.SrcPort
}
