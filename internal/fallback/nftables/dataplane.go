package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"go.uber.org/zap"
	"sigs.k8s.io/knftables"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// Name is the proxy mode this dataplane implements.
const Name = dataplane.NFTables

// Dataplane writes the model to an nftables table. It implements
// dataplane.Dataplane. It is not safe for concurrent use: the sync loop is
// its only caller.
type Dataplane struct {
	cfg  Config
	nft  knftables.Interface
	plan *planner
	// synced is false until the first full sync succeeded; needRead makes
	// the next sync read our chains and sets from the kernel again (after
	// a failure the kernel may hold more or less than we think) and
	// rewrite everything.
	synced, needRead bool
	// ct deletes the UDP conntrack entries each sync made stale.
	ct *nfconntrack.Cleaner
}

// New prepares the nftables dataplane for the namespace in cfg: it checks
// that nft works there, reads which of our chains and sets already exist
// (an earlier agent's, to be replaced or removed by the first sync, which
// is always full) and writes nothing. It fails where nft or the kernel's
// nf_tables do not work.
func New(ctx context.Context, cfg Config) (*Dataplane, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("nftables dataplane: %w", err)
	}
	fam := cfg.family()
	var nft knftables.Interface
	err := netns.Do(cfg.Netns, func() (err error) {
		nft, err = knftables.New(fam.nft, cfg.Table)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nftables dataplane (%s): %w", fam.name, err)
	}
	d := &Dataplane{cfg: cfg, nft: nft, plan: newPlanner(&cfg),
		ct: nfconntrack.NewCleaner(nfconntrack.CleanerConfig{Netns: cfg.Netns, IPv6: cfg.IPv6, Logger: cfg.Logger, Metrics: cfg.Metrics})}
	d.plan.r.cfg = &d.cfg
	d.plan.dropInvalid = !cfg.Beside && !sysctl.TCPBeLiberal(cfg.Netns)
	if err := d.read(ctx); err != nil {
		return nil, fmt.Errorf("nftables dataplane: %w", err)
	}
	cfg.Logger.Info("nftables dataplane ready", zap.String("ipFamily", fam.name), zap.String("table", string(fam.nft)+" "+cfg.Table),
		zap.Int("existingChains", len(d.plan.kernelChains)), zap.Int("existingSets", len(d.plan.kernelSets)))
	return d, nil
}

// Name returns "nftables".
func (d *Dataplane) Name() string { return Name }

// read learns which per-Service chains and sets of ours the kernel holds.
func (d *Dataplane) read(ctx context.Context) error {
	chains, sets := map[string]bool{}, map[string]bool{}
	err := netns.Do(d.cfg.Netns, func() error {
		for _, kind := range []struct {
			typ string
			out map[string]bool
		}{{"chains", chains}, {"sets", sets}} {
			names, err := d.nft.List(ctx, kind.typ)
			if err != nil {
				if knftables.IsNotFound(err) {
					return nil // no table yet
				}
				return fmt.Errorf("list %s: %w", kind.typ, err)
			}
			for _, n := range names {
				kind.out[n] = true
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.plan.learn(chains, sets)
	d.needRead = false
	return nil
}

// Sync applies up with one nft transaction.
//
// A full sync (up.Full), the first sync and the first after a failure
// flush every chain and map of the table and write them again, deleting
// what nothing wants any more, as upstream's periodic full syncs do;
// affinity sets keep their clients. Otherwise only the chains, sets and
// map elements of up.Changed are rewritten. A change of the addresses
// that accept NodePorts is a full sync. On failure the kernel keeps the
// table as it was (a transaction commits whole or not at all), the failure
// is counted in kubeproxy_sync_proxy_rules_nftables_sync_failures_total,
// and the next sync re-reads the table and rewrites everything. Once the
// table is written, the UDP conntrack entries the change made stale are
// deleted (nfconntrack.Cleaner), as by the iptables and IPVS dataplanes; a
// failure to delete them is logged and does not fail the sync.
func (d *Dataplane) Sync(up model.Update) error {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
	defer cancel()
	rewrite := !d.synced || d.needRead || up.Full
	if d.needRead {
		if err := d.read(ctx); err != nil {
			return fmt.Errorf("nftables sync: %w", err)
		}
	}
	if np := &up.State.Node.NodePorts; !np.Equal(&d.plan.r.nodePorts) {
		rewrite = true
		d.plan.r.nodePorts = *np
	}
	d.plan.r.nodeIPs = nil
	for _, a := range d.cfg.NodeIPs {
		if d.cfg.inFamily(a) {
			d.plan.r.nodeIPs = append(d.plan.r.nodeIPs, a)
		}
	}
	if len(d.plan.r.nodeIPs) == 0 {
		d.plan.r.nodeIPs = up.State.Node.Addrs
	}
	tx := d.nft.NewTransaction()
	var pl *plan
	if rewrite {
		pl = d.plan.full(tx, up.State)
	} else {
		pl = d.plan.partial(tx, up)
	}
	if tx.NumOperations() > 0 {
		err := netns.Do(d.cfg.Netns, func() error { return d.nft.Run(ctx, tx) })
		if err != nil {
			d.needRead = true
			if m := d.cfg.Metrics; m != nil {
				m.NFTablesSyncFailuresTotal.Inc()
			}
			return fmt.Errorf("nftables sync (%s, full=%t, %d changed, %d operations): %w",
				d.cfg.family().name, rewrite, len(up.Changed), tx.NumOperations(), err)
		}
	}
	d.plan.commit(pl)
	d.synced = true
	// The rules are in place: a flow whose entry goes now is translated
	// again by them at its next datagram.
	d.ct.Synced(up)
	return nil
}

// tables are ours, as "family name".
var tables = []string{"ip " + TableName, "ip6 " + TableName}

// Available reports whether the nftables mode can run in the namespace
// at netns ("" for the caller's): the nft tool is there and the kernel
// takes a table of ours, which it checks by creating and deleting a
// table of its own (neither ours nor anybody else's).
func Available(ctx context.Context, netnsPath string) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	const probe = "ebpf-proxy-probe"
	if _, err := runNFT(ctx, netnsPath, "add table ip "+probe+"\ndelete table ip "+probe+"\n", "-f", "-"); err != nil {
		return fmt.Errorf("nftables: the kernel refuses a table: %w", err)
	}
	return nil
}

// Present returns those of our tables that exist in the namespace at
// netns, IPv4's first; none, and no error, where the nft tool is missing (without it
// this mode never ran).
func Present(ctx context.Context, netnsPath string) ([]string, error) {
	return present(ctx, netnsPath, tables)
}

// present returns those of the tables (as "family name") that exist in the
// namespace at netnsPath, in their order.
func present(ctx context.Context, netnsPath string, tables []string) ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil
	}
	out, err := runNFT(ctx, netnsPath, "", "list", "tables")
	if err != nil {
		return nil, err
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		listed[strings.TrimPrefix(strings.TrimSpace(line), "table ")] = true
	}
	var found []string
	for _, want := range tables {
		if listed[want] {
			found = append(found, want)
		}
	}
	return found, nil
}

// Cleanup deletes our tables of both families from the namespace at netns
// ("" for the caller's), so that a start in another mode and --cleanup
// leave nothing of this one. Where none exists it only reads.
func Cleanup(ctx context.Context, netnsPath string) error {
	return cleanup(ctx, netnsPath, tables)
}

// CleanupFamily deletes our table of one family (ipv6 false: IPv4), for a
// node that no longer serves that family in this mode.
func CleanupFamily(ctx context.Context, netnsPath string, ipv6 bool) error {
	if ipv6 {
		return cleanup(ctx, netnsPath, tables[1:])
	}
	return cleanup(ctx, netnsPath, tables[:1])
}

func cleanup(ctx context.Context, netnsPath string, which []string) error {
	return DeleteTables(ctx, netnsPath, which...)
}

// DeleteTables deletes those of the tables (as "family name") that exist in
// the namespace at netnsPath ("" for the caller's). Where none exists, or
// the nft tool is missing, it only reads.
func DeleteTables(ctx context.Context, netnsPath string, tables ...string) error {
	present, err := present(ctx, netnsPath, tables)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range present {
		if _, err := runNFT(ctx, netnsPath, "", "delete", "table", t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// runNFT runs nft with args in the namespace, stdin as its input. With
// netnsPath "" it forks from the calling thread, whose namespace is the
// caller's (netns.Start would fork from a fresh thread, in the process's
// namespace, which is another one when the caller runs in netns.Do), as
// knftables does.
func runNFT(ctx context.Context, netnsPath, stdin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nft", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	start := cmd.Start
	if netnsPath != "" {
		start = func() error { return netns.Start(netnsPath, cmd) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("start nft: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
