package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Sandbox is a set of network namespaces wired together (see AddNode, AddPod,
// AddClient and AddExternalClient), a private child cgroup and a private
// bpffs. Its methods are safe for concurrent use.
type Sandbox struct {
	// ID is the "ebpt-<6 hex>" prefix of every namespace, cgroup and mount
	// point the sandbox creates.
	ID string
	// Cgroup is where client probes run and where BPF programs under test
	// are attached.
	Cgroup *Cgroup
	// BPFFS is a private bpffs for pins.
	BPFFS *BPFFS
	// Router joins the node network and the external network. It has no
	// uplink, so it is where any stray packet ends.
	Router *Host

	mu       sync.Mutex
	closed   bool
	hosts    []*Host // in creation order, closed in reverse
	names    map[string]bool
	nodes    []*Node
	external []*Host
	sessions map[*session]struct{}
	veths    int
	cgroups  []*Cgroup // made by AddCgroup, closed before Cgroup
}

// New creates a sandbox with its cgroup, bpffs and router namespace. Nodes,
// pods and clients are added with the Add methods. The caller must Close it.
func New() (_ *Sandbox, err error) {
	if _, ok := os.LookupEnv(probeEnv); ok {
		return nil, errors.New("this process was started as a sandbox probe but did not call sandbox.Main first; call it at the top of TestMain or main")
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	s := &Sandbox{ID: id, names: map[string]bool{}, sessions: map[*session]struct{}{}}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("sandbox %s: %w", id, err), s.Close())
		}
	}()
	if s.Cgroup, err = newCgroup(id); err != nil {
		return nil, err
	}
	if s.BPFFS, err = newBPFFS(id); err != nil {
		return nil, err
	}
	if err := s.addRouter(); err != nil {
		return nil, err
	}
	return s, nil
}

// ForTest creates a sandbox for a privileged test and closes it in
// t.Cleanup. It stops the test as RequireRoot does when not root.
func ForTest(tb testing.TB) *Sandbox {
	tb.Helper()
	RequireRoot(tb)
	s, err := New()
	if err != nil {
		tb.Fatalf("create sandbox: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("sandbox at failure:\n%s", s)
		}
		if err := s.Close(); err != nil {
			tb.Errorf("close sandbox: %v", err)
		}
	})
	return s
}

// register reserves a host name; it must be called with s.mu held.
func (s *Sandbox) register(name string) error {
	if s.closed {
		return errors.New("sandbox is closed")
	}
	if err := checkHostName(name); err != nil {
		return err
	}
	if s.names[name] {
		return fmt.Errorf("host name %q is already used in this sandbox", name)
	}
	s.names[name] = true
	return nil
}

// newHost creates the namespace of a host, with ip and IPv6Of(ip) as its
// addresses, and tracks it for Close; it must be called with s.mu held, after
// register.
func (s *Sandbox) newHost(name string, ip netip.Addr) (*Host, error) {
	ns, err := newNetns(s.ID + "-" + name)
	if err != nil {
		return nil, err
	}
	h := &Host{Name: name, NS: ns, IP: ip, IP6: IPv6Of(ip)}
	s.hosts = append(s.hosts, h)
	if err := ns.Do(setUpIPv6); err != nil {
		return nil, fmt.Errorf("in %s: %w", name, err)
	}
	return h, nil
}

// AddCgroup creates a cgroup named name inside the sandbox's Cgroup, for
// example one per node: a proxy under test attaches to its node's cgroup, and
// the node's clients run there (Client.InCgroup), while clients in the
// sandbox's own Cgroup or in another node's stay out of its reach. Programs
// attached to the sandbox's Cgroup also act on its children. Close removes
// it.
func (s *Sandbox) AddCgroup(name string) (*Cgroup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("sandbox is closed")
	}
	if err := checkHostName(name); err != nil {
		return nil, fmt.Errorf("add cgroup: %w", err)
	}
	for _, cg := range s.cgroups {
		if cg.name == s.Cgroup.name+"/"+name {
			return nil, fmt.Errorf("add cgroup: %q already exists in this sandbox", name)
		}
	}
	cg, err := s.Cgroup.newChild(name)
	if err != nil {
		return nil, fmt.Errorf("add cgroup: %w", err)
	}
	s.cgroups = append(s.cgroups, cg)
	return cg, nil
}

// String describes the sandbox's hosts, one a line, for failure logs.
func (s *Sandbox) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "sandbox %s, cgroup %s, bpffs %s\n", s.ID, s.Cgroup.Path(), s.BPFFS.Path())
	for _, h := range s.hosts {
		fmt.Fprintf(&b, "  %-12s %-15s %-24s netns %s\n", h.Name, h.IP, h.IP6, h.NS.Name())
	}
	return b.String()
}

// Close stops the probes and servers and removes every namespace, the cgroup
// and the bpffs. It goes on after errors and returns them all, so it also
// cleans up a sandbox that failed half way. Close is idempotent.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	hosts := slices.Clone(s.hosts)
	s.mu.Unlock()

	var errs []error
	for _, ss := range sessions {
		if err := ss.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	slices.Reverse(hosts)
	for _, h := range hosts {
		if err := h.close(); err != nil {
			errs = append(errs, err)
		}
	}
	// The cgroups kill whatever probe might still be left in them; the
	// children go first, since a cgroup with children cannot be removed.
	s.mu.Lock()
	children := slices.Clone(s.cgroups)
	s.mu.Unlock()
	for _, cg := range slices.Backward(children) {
		if err := cg.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.Cgroup != nil {
		if err := s.Cgroup.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.BPFFS != nil {
		if err := s.BPFFS.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
