// Package ipvs is the IPVS fallback dataplane: every Service frontend is an
// IPVS virtual server (ClusterIPs, ExternalIPs and LoadBalancer IPs bound on
// a dummy interface so that they are local; NodePorts on the node's
// addresses), its real servers are the endpoints the model's verdict names
// (model.Service.Internal for ClusterIPs, External for the rest), and a few
// iptables rules matching ipsets do what IPVS cannot: masquerade, drop
// (internal or external traffic policy Local without a local endpoint) and
// loadBalancerSourceRanges. It uses github.com/moby/ipvs for IPVS and
// github.com/vishvananda/netlink for the dummy interface and the ipsets.
//
// Verdicts map to IPVS like this:
//
//	Forward  real servers = the verdict's endpoints, weight 1
//	Reject   a virtual server without real servers: IPVS answers every new
//	         connection with ICMP port unreachable (connection refused)
//	Drop     the same, plus an entry in EBPFPROXY-DROP, which the mangle
//	         table drops before IPVS sees the packet
//
// An endpoint that leaves is not deleted at once: its weight drops to 0, so
// that it gets no new connections, and it is deleted once IPVS holds no
// connection to it (active or inactive) or after Config.GracePeriod. UDP
// and SCTP endpoints are deleted at once, as upstream: with
// expire_nodest_conn their flows move on at the next packet.
//
// Like upstream's IPVS mode, traffic from pods and from the node to an
// external frontend of an externalTrafficPolicy=Local Service is not
// short-circuited to all endpoints (model.Service.ShortCircuit): IPVS keys
// a virtual server on the destination alone.
//
// The dataplane serves one IP family, as each of upstream's per-family
// IPVS proxiers does: Config.IPv6 makes it the IPv6 one, with virtual and
// real servers of family AF_INET6, ipsets of family inet6 (named
// EBPFPROXY-6-...), rules written with the ip6tables tools of the back end
// and a persistence netmask of 128. A dual-stack node runs one dataplane
// per family, each fed the model State of its family. The two share the
// dummy interface and the namespace's IPVS table, and each reads, changes
// and deletes only its own family's addresses and virtual servers, so
// that neither undoes the other's work. IPVS itself answers a new
// connection to a virtual server without real servers with ICMPv6 port
// unreachable, as it answers IPv4 with ICMP.
package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/xtables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
)

// Name is the proxy mode this dataplane implements.
const Name = dataplane.IPVS

// DummyName is the interface that holds the Service addresses.
const DummyName = "ebpfproxy-ipvs0"

// Schedulers accepted in Config.Scheduler, as --ipvs-scheduler.
var Schedulers = []string{"rr", "lc", "dh", "sh", "sed", "nq"}

// Defaults.
const (
	DefaultScheduler = "rr"
	// DefaultGracePeriod bounds how long a removed endpoint keeps the
	// connections it has before it is deleted anyway.
	DefaultGracePeriod = 15 * time.Minute
	// DefaultReapInterval is how often removed endpoints are checked
	// for remaining connections.
	DefaultReapInterval = time.Minute
	// DefaultIPSetMaxElements caps each ipset. The kernel's default,
	// 65,536, is less than the hairpin set needs for 100,000 endpoints;
	// hash sets grow as needed, so a high cap costs nothing until used.
	DefaultIPSetMaxElements = 1 << 20
)

// Config configures the IPVS dataplane of one IP family. Its NodeIPs, if
// set, are the addresses NodePorts are served on, instead of the State's
// NodePort addresses; they must be of the dataplane's family.
type Config struct {
	xtables.Netfilter
	// Backend is the iptables back end for the few rules (see
	// xtables.Detect); empty picks one.
	Backend string
	// Scheduler is one of Schedulers; empty means DefaultScheduler.
	Scheduler string
	// ExcludeCIDRs hold virtual servers that are never removed, even when
	// they look like ours (--ipvs-exclude-cidrs). Prefixes of the other
	// family hold none of ours.
	ExcludeCIDRs []netip.Prefix
	// GracePeriod bounds graceful termination; 0 means DefaultGracePeriod.
	GracePeriod time.Duration
	// ReapInterval is how often removed endpoints are checked; 0 means
	// DefaultReapInterval.
	ReapInterval time.Duration
	// TCPTimeout, TCPFinTimeout and UDPTimeout are IPVS's idle timeouts
	// of TCP sessions, of TCP sessions after a FIN, and of UDP flows
	// (--ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout).
	// They are global to the namespace; 0 leaves one as it is.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
	// IPSetMaxElements caps each of our ipsets when it is created; 0
	// means DefaultIPSetMaxElements. A set that already exists keeps its
	// cap (a warning says so if it is lower).
	IPSetMaxElements uint32
}

func (c *Config) setDefaults() error {
	if c.Scheduler == "" {
		c.Scheduler = DefaultScheduler
	}
	if !slices.Contains(Schedulers, c.Scheduler) {
		return fmt.Errorf("IPVS scheduler %q: want one of %v", c.Scheduler, Schedulers)
	}
	if err := c.Netfilter.SetDefaults(); err != nil {
		return err
	}
	for _, a := range c.NodeIPs {
		if !c.inFamily(a) {
			return fmt.Errorf("node IP %s: not of the dataplane's family %s", a, c.family().name)
		}
	}
	if err := xtables.CheckBackend(c.Backend); err != nil {
		return err
	}
	for name, d := range map[string]time.Duration{"TCP": c.TCPTimeout, "TCP FIN": c.TCPFinTimeout, "UDP": c.UDPTimeout} {
		if d < 0 || d%time.Second != 0 {
			return fmt.Errorf("IPVS %s timeout %s: want whole seconds, 0 or more", name, d)
		}
	}
	if c.GracePeriod <= 0 {
		c.GracePeriod = DefaultGracePeriod
	}
	if c.ReapInterval <= 0 {
		c.ReapInterval = DefaultReapInterval
	}
	if c.IPSetMaxElements == 0 {
		c.IPSetMaxElements = DefaultIPSetMaxElements
	}
	return nil
}

// conntrackCleaner returns the Cleaner of the dataplane's namespace and
// family.
func (c *Config) conntrackCleaner() *nfconntrack.Cleaner {
	return nfconntrack.NewCleaner(nfconntrack.CleanerConfig{Netns: c.Netns, IPv6: c.IPv6, Logger: c.Logger, Metrics: c.Metrics})
}

// family holds what the two IP families' dataplanes differ in, besides the
// addresses themselves; upstream's IPVS proxier makes the same choices for
// each family.
type family struct {
	name string
	// af is the address family of the virtual and real servers and of
	// the ipsets.
	af uint8
	// netlink is the family the dummy interface's addresses are listed
	// with.
	netlink int
	// setPrefix starts the names of the family's ipsets, which replaces
	// xtables.Prefix in the IPv4 names (as upstream's KUBE-6- sets).
	setPrefix string
}

var (
	familyIPv4 = family{name: "IPv4", af: unix.AF_INET, netlink: netlink.FAMILY_V4, setPrefix: xtables.Prefix}
	familyIPv6 = family{name: "IPv6", af: unix.AF_INET6, netlink: netlink.FAMILY_V6, setPrefix: xtables.Prefix + "6-"}
	// families are both, for what removes every family's objects.
	families = []*family{&familyIPv4, &familyIPv6}
)

// family returns the configured family's differences.
func (c *Config) family() *family {
	if c.IPv6 {
		return &familyIPv6
	}
	return &familyIPv4
}

// inFamily reports whether a is of the configured family; an IPv4-mapped
// IPv6 address is IPv4.
func (c *Config) inFamily(a netip.Addr) bool { return a.Unmap().Is6() == c.IPv6 }

// set returns the family's name of the ipset whose IPv4 name is name (one
// of the set constants).
func (f *family) set(name string) string {
	return f.setPrefix + strings.TrimPrefix(name, xtables.Prefix)
}
