// Package sockterm ends the sockets that the socket load balancer connected
// to a backend that has since been removed from its Service.
//
// connect4 rewrites a socket's destination once, at connect(): a connected
// UDP socket or a TCP connection then talks to its backend directly, and
// nothing in the load balancer moves it when the backend goes away. A DNS
// client such as Envoy's keeps sending to a CoreDNS pod that no longer
// exists over a connected UDP socket and never gets an answer
// (kubernetes#125467, cilium#48096); a TCP connection to a vanished pod hangs
// until its retransmissions time out. The Terminator finds such sockets in
// every network namespace of the node through sock_diag and destroys them
// (SOCK_DESTROY, CONFIG_INET_DIAG_DESTROY): the application's next call on a
// TCP socket fails with ECONNABORTED at once, and a UDP socket's pending
// receive fails with ECONNABORTED and its next send with EDESTADDRREQ, so
// that the application opens a new socket, and connect4 picks a live
// backend.
//
// Only sockets that the hooks translated are touched (Config.Translated): an
// application that connected to a pod's IP itself keeps its socket.
//
// Backends of both families are handled: an IPv4 backend's sockets are
// AF_INET ones and the AF_INET6 ones of dual-stack clients that reached an
// IPv4 Service through its IPv4-mapped address (::ffff:a.b.c.d), which the
// hooks translate as IPv4; an IPv6 backend's are AF_INET6 ones.
package sockterm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink/nl"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// diagTimeout bounds each wait for the kernel's sock_diag answers.
const diagTimeout = 5 * time.Second

// Errors of Terminate.
var (
	// ErrUnsupportedBackend is returned (wrapped, naming the backend) for a
	// removed backend that is not an IP address with a port, or whose
	// protocol sock_diag cannot destroy sockets of (only TCP and UDP); the
	// other backends are still handled.
	ErrUnsupportedBackend = errors.New("only TCP and UDP backends with an address and a port can have their sockets terminated")
	// ErrNoDestroy is returned (wrapped) when the kernel was built without
	// CONFIG_INET_DIAG_DESTROY and cannot destroy sockets.
	ErrNoDestroy = errors.New("the kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY is off)")
	// ErrNamespaceAccess is returned (wrapped, with a count and an example)
	// by NodeNamespaces, and so by Terminate, when the network namespaces
	// of some processes or mounts could not be read; their sockets are not
	// searched. A privileged agent with hostPID can read them all.
	ErrNamespaceAccess = errors.New("permission denied reading some network namespaces")
)

// Backend is a removed backend: the address and port that translated
// sockets were connected to, and their protocol.
type Backend struct {
	// Addr is the backend's address (IPv4 or IPv6; an IPv4-mapped one
	// stands for its IPv4 address) and port.
	Addr netip.AddrPort
	// Proto is model.TCP or model.UDP.
	Proto model.Protocol
}

// String returns "address:port/PROTO".
func (b Backend) String() string { return b.Addr.String() + "/" + b.Proto.String() }

// TranslatedFunc reports whether the socket load balancer translated the
// socket with this cookie to backend, that is whether sock4_revnat_v1 (for
// an IPv4 backend, also of an AF_INET6 socket) or sock6_revnat_v1 (for an
// IPv6 one) holds (cookie, backend). It is called from the goroutine that
// runs Terminate.
type TranslatedFunc func(cookie uint64, backend netip.AddrPort) bool

// Config configures a Terminator.
type Config struct {
	// Namespaces lists the network namespaces to search; nil means
	// NodeNamespaces, every namespace of the node.
	Namespaces NamespaceLister
	// Translated selects the sockets that are ours to destroy. It is
	// required.
	Translated TranslatedFunc
	// Logger receives a line per Terminate that destroyed sockets or failed
	// somewhere, and a debug line per destroyed socket; nil logs nothing.
	Logger *zap.Logger
}

// Terminator destroys the translated sockets of removed backends. Its
// methods are safe for concurrent use if Config.Translated and
// Config.Namespaces are.
type Terminator struct {
	list       NamespaceLister
	translated TranslatedFunc
	log        *zap.Logger
}

// New returns a Terminator for cfg.
func New(cfg Config) (*Terminator, error) {
	if cfg.Translated == nil {
		return nil, errors.New("socket terminator: Config.Translated is required: only sockets the load balancer translated may be destroyed")
	}
	t := &Terminator{list: cfg.Namespaces, translated: cfg.Translated, log: cfg.Logger}
	if t.list == nil {
		t.list = NodeNamespaces
	}
	if t.log == nil {
		t.log = zap.NewNop()
	}
	return t, nil
}

// Stats describe one Terminate.
type Stats struct {
	// Namespaces counts the network namespaces searched.
	Namespaces int
	// Vanished counts the namespaces that were listed but gone by the time
	// they were to be searched; that is not an error.
	Vanished int
	// DestroyedTCP and DestroyedUDP count the sockets destroyed.
	DestroyedTCP, DestroyedUDP int
	// NotTranslated counts the sockets connected to a removed backend that
	// the load balancer did not translate, left alone.
	NotTranslated int
	// Gone counts the sockets that closed between being found and being
	// destroyed.
	Gone int
	// Failed counts the sockets whose destruction failed.
	Failed int
	// NamespaceErrors counts the namespaces where the search or a
	// destruction failed.
	NamespaceErrors int
}

// destSet is the removed backends of one protocol.
type destSet struct {
	list []netip.AddrPort
	set  map[netip.AddrPort]bool
	// has4 says whether list holds an IPv4 backend.
	has4 bool
}

// families are the socket families to dump for d: AF_INET for its IPv4
// backends, AF_INET6 for its IPv6 ones and for the IPv4-mapped peers of
// its IPv4 ones, which only AF_INET6 sockets have.
func (d *destSet) families() []uint8 {
	switch {
	case d.has4:
		return []uint8{unix.AF_INET, unix.AF_INET6}
	case len(d.list) > 0:
		return []uint8{unix.AF_INET6}
	}
	return nil
}

// Terminate destroys, in every listed network namespace, the sockets
// connected to a removed backend that Config.Translated says the load
// balancer translated: TCP sockets in any state but LISTEN, CLOSE and
// TIME_WAIT, and connected UDP sockets. Each namespace costs one sock_diag
// dump per protocol and socket family (AF_INET6 sockets are dumped for IPv6
// backends and for the IPv4-mapped peers of IPv4 ones), filtered by
// destination in the kernel (in userspace for more than 256 backends of a
// protocol), and one SOCK_DESTROY per socket.
//
// It goes on after errors: the returned error joins those of the listing,
// of each namespace (wrapped with its path) and of unsupported backends
// (ErrUnsupportedBackend); the Stats count what was done. It stops early,
// returning ctx's error, when ctx is done.
func (t *Terminator) Terminate(ctx context.Context, removed []Backend) (Stats, error) {
	var st Stats
	want, errs := group(removed)
	if len(want) == 0 {
		return st, errors.Join(errs...)
	}
	start := time.Now()
	namespaces, err := t.list(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list network namespaces: %w", err))
	}
	for _, ns := range namespaces {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		vanished, err := t.search(ns, want, &st)
		switch {
		case vanished:
			st.Vanished++
		case err != nil:
			st.Namespaces++
			st.NamespaceErrors++
			errs = append(errs, fmt.Errorf("network namespace %s: %w", ns.Path, err))
		default:
			st.Namespaces++
		}
	}
	err = errors.Join(errs...)
	if st.DestroyedTCP+st.DestroyedUDP > 0 || err != nil {
		t.log.Info("terminated sockets of removed backends",
			zap.Int("backends", len(removed)),
			zap.Int("destroyedTCP", st.DestroyedTCP), zap.Int("destroyedUDP", st.DestroyedUDP),
			zap.Int("notTranslated", st.NotTranslated), zap.Int("gone", st.Gone), zap.Int("failed", st.Failed),
			zap.Int("namespaces", st.Namespaces), zap.Int("vanished", st.Vanished),
			zap.Int("namespaceErrors", st.NamespaceErrors),
			zap.Duration("took", time.Since(start)), zap.Error(err))
	}
	return st, err
}

// group sorts the removed backends by protocol, dropping duplicates; it
// returns an error for each backend it cannot handle.
func group(removed []Backend) (map[model.Protocol]*destSet, []error) {
	want := map[model.Protocol]*destSet{}
	var errs []error
	for _, b := range removed {
		addr := netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port())
		if !addr.Addr().IsValid() || addr.Addr().Zone() != "" || addr.Port() == 0 || (b.Proto != model.TCP && b.Proto != model.UDP) {
			errs = append(errs, fmt.Errorf("backend %s: %w", b, ErrUnsupportedBackend))
			continue
		}
		d := want[b.Proto]
		if d == nil {
			d = &destSet{set: map[netip.AddrPort]bool{}}
			want[b.Proto] = d
		}
		if !d.set[addr] {
			d.set[addr] = true
			d.list = append(d.list, addr)
			d.has4 = d.has4 || addr.Addr().Is4()
		}
	}
	return want, errs
}

// search searches one namespace; it reports vanished if the namespace is
// gone.
func (t *Terminator) search(ns Namespace, want map[model.Protocol]*destSet, st *Stats) (vanished bool, err error) {
	h, ok, err := OpenNamespace(ns)
	if err != nil || !ok {
		return !ok && err == nil, err
	}
	defer h.Close()
	c, err := openDiag(h)
	if err != nil {
		return false, err
	}
	defer c.Close()
	var errs []error
	for _, proto := range []model.Protocol{model.TCP, model.UDP} {
		if d := want[proto]; d != nil {
			if err := t.searchProto(c, ns, proto, d, st); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return false, errors.Join(errs...)
}

// searchProto dumps the namespace's sockets of one protocol connected to the
// removed backends and destroys those the load balancer translated.
func (t *Terminator) searchProto(c *diagConn, ns Namespace, proto model.Protocol, d *destSet, st *Stats) error {
	states := uint32(tcpStates)
	if proto == model.UDP {
		states = udpStates
	}
	var filter []netip.AddrPort
	if len(d.list) <= maxFilterDests {
		filter = d.list
	}
	var (
		errs  []error
		socks []diagSocket
	)
	for _, family := range d.families() {
		found, err := c.dump(family, uint8(proto), states, filter)
		socks = append(socks, found...)
		if err != nil {
			// An interrupted dump still lists sockets that are worth
			// destroying; the caller hears that some may have been
			// missed.
			err = fmt.Errorf("dump %s %s sockets: %w", familyName(family), proto, err)
			if !errors.Is(err, nl.ErrDumpInterrupted) {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, err)
		}
	}
	var (
		failed   int
		firstErr error
	)
	for _, s := range socks {
		// The kernel filtered already, unless there were too many
		// backends for its filter; checking again costs nothing.
		if !d.set[s.remote] || states&(1<<s.state) == 0 {
			continue
		}
		if !t.translated(s.cookie, s.remote) {
			st.NotTranslated++
			continue
		}
		err := c.destroy(uint8(proto), s)
		switch {
		case err == nil:
			if proto == model.TCP {
				st.DestroyedTCP++
			} else {
				st.DestroyedUDP++
			}
			t.log.Debug("destroyed socket of a removed backend", zap.String("netns", ns.Path),
				zap.Stringer("proto", proto), zap.Stringer("local", s.local), zap.Stringer("backend", s.remote),
				zap.Uint64("cookie", s.cookie), zap.Uint32("inode", s.inode))
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ESTALE):
			st.Gone++
		case errors.Is(err, unix.EOPNOTSUPP):
			st.Failed++
			return errors.Join(append(errs, fmt.Errorf("destroy %s sockets: %w: %w", proto, ErrNoDestroy, err))...)
		default:
			st.Failed++
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("destroy %s socket %s -> %s (cookie %d): %w", proto, s.local, s.remote, s.cookie, err)
			}
		}
	}
	if failed > 0 {
		errs = append(errs, fmt.Errorf("%d of the %s sockets could not be destroyed, the first: %w", failed, proto, firstErr))
	}
	return errors.Join(errs...)
}

// familyName names a socket family in errors.
func familyName(family uint8) string {
	if family == unix.AF_INET6 {
		return "IPv6"
	}
	return "IPv4"
}
