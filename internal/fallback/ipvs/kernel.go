package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// ErrNoIPVS is returned by New and Available when the kernel has no IPVS
// (the ip_vs module is missing or cannot be loaded).
var ErrNoIPVS = errors.New("IPVS is not available in this kernel")

// flagPersistent is IP_VS_SVC_F_PERSISTENT; the kernel adds
// IP_VS_SVC_F_HASHED (2) to what it reports.
const flagPersistent = 0x1

// Available loads ip_vs if needed and reports whether IPVS works in the
// namespace at netnsPath ("" for the caller's): nil if it does, an error
// wrapping ErrNoIPVS if the kernel lacks it, another error if the probe
// itself failed.
func Available(netnsPath string) error {
	if ok, err := procNetIPVS(netnsPath); err != nil || ok {
		return err
	}
	out, merr := exec.Command("modprobe", "ip_vs").CombinedOutput()
	if ok, err := procNetIPVS(netnsPath); err != nil || ok {
		return err
	}
	return fmt.Errorf("%w: modprobe ip_vs: %v %s", ErrNoIPVS, merr, strings.TrimSpace(string(out)))
}

// kernel wraps the handles that program one namespace; fam is the family
// of the dataplane that uses it (nil for the cleanup, which passes the
// family to each call).
type kernel struct {
	ipvs *libipvs.Handle
	nl   *netlink.Handle
	fam  *family
}

func openKernel(netnsPath string, f *family) (*kernel, error) {
	k, err := openNetlink(netnsPath)
	if err != nil {
		return nil, err
	}
	k.fam = f
	if k.ipvs, err = libipvs.New(netnsPath); err != nil {
		k.nl.Close()
		return nil, fmt.Errorf("IPVS handle: %w", err)
	}
	return k, nil
}

// openNetlink opens the netlink handle only: enough for the dummy
// interface and the ipsets.
func openNetlink(netnsPath string) (*kernel, error) {
	families := []int{unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER}
	if netnsPath == "" {
		nlh, err := netlink.NewHandle(families...)
		if err != nil {
			return nil, fmt.Errorf("netlink handle: %w", err)
		}
		return &kernel{nl: nlh}, nil
	}
	ns, err := vnetns.GetFromPath(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", netnsPath, err)
	}
	defer ns.Close()
	nlh, err := netlink.NewHandleAt(ns, families...)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", netnsPath, err)
	}
	return &kernel{nl: nlh}, nil
}

func (k *kernel) close() {
	if k.ipvs != nil {
		k.ipvs.Close()
	}
	k.nl.Close()
}

// link returns the interface named name, nil if there is none.
func (k *kernel) link(name string) (netlink.Link, error) {
	l, err := k.nl.LinkByName(name)
	if err == nil {
		return l, nil
	}
	var notFound netlink.LinkNotFoundError
	if !errors.As(err, &notFound) {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	return nil, nil
}

// dummy returns the dummy interface, creating it when create is set.
func (k *kernel) dummy(create bool) (netlink.Link, error) {
	l, err := k.link(DummyName)
	if err != nil || l != nil || !create {
		return l, err
	}
	// Left down, as kube-ipvs0: its addresses are local all the same,
	// and no route points at it.
	// The other family's dataplane may have created it meanwhile.
	if err := k.nl.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DummyName}}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create %s: %w", DummyName, err)
	}
	l, err = k.nl.LinkByName(DummyName)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", DummyName, err)
	}
	return l, nil
}

// dummyAddrs lists the addresses of family f on the dummy interface. An
// IPv6 link-local address, which the kernel adds should anyone set the
// interface up, is no Service address and is left alone.
func (k *kernel) dummyAddrs(l netlink.Link, f *family) (map[netip.Addr]bool, error) {
	addrs, err := k.nl.AddrList(l, f.netlink)
	if err != nil {
		return nil, fmt.Errorf("list %s addresses of %s: %w", f.name, DummyName, err)
	}
	out := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out[ip.Unmap()] = true
		}
	}
	return out, nil
}

// hostAddr is a as a host address of the dummy interface. An IPv6 one
// skips duplicate address detection (nodad, as upstream binds them): it
// would hold the address tentative, unusable, for its duration.
func hostAddr(a netip.Addr) *netlink.Addr {
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	return addr
}

func (k *kernel) bind(l netlink.Link, a netip.Addr) error {
	if err := k.nl.AddrAdd(l, hostAddr(a)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("bind %s to %s: %w", a, DummyName, err)
	}
	return nil
}

func (k *kernel) unbind(l netlink.Link, a netip.Addr) error {
	if err := k.nl.AddrDel(l, hostAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("unbind %s from %s: %w", a, DummyName, err)
	}
	return nil
}

// ensureSets creates our ipsets of family f where missing, each holding at
// most maxElements entries. It returns the sets that exist with a lower
// cap.
func (k *kernel) ensureSets(f *family, maxElements uint32) (small []string, err error) {
	all, err := k.nl.IpsetListAll()
	if err != nil {
		return nil, fmt.Errorf("list ipsets: %w", err)
	}
	existing := map[string]uint32{}
	for _, s := range all {
		existing[s.SetName] = s.MaxElements
	}
	for _, s := range ipsetTypes {
		name := f.set(s.name)
		if max, ok := existing[name]; ok {
			if max != 0 && max < maxElements {
				small = append(small, fmt.Sprintf("%s (%d)", name, max))
			}
			continue
		}
		opts := netlink.IpsetCreateOptions{Family: f.af, MaxElements: maxElements}
		if err := k.nl.IpsetCreate(name, s.typ, opts); err != nil {
			return nil, fmt.Errorf("create ipset %s (%s, %s): %w", name, s.typ, f.name, err)
		}
	}
	return small, nil
}

func (k *kernel) listSets() (map[string]bool, error) {
	all, err := k.nl.IpsetListAll()
	if err != nil {
		return nil, fmt.Errorf("list ipsets: %w", err)
	}
	out := map[string]bool{}
	for _, s := range all {
		out[s.SetName] = true
	}
	return out, nil
}

// setEntries reads the entries of those of our sets of family f that
// exist; each entry names its set by the IPv4 name.
func (k *kernel) setEntries(f *family, exist map[string]bool) (map[setEntry]bool, error) {
	out := map[setEntry]bool{}
	for _, s := range ipsetTypes {
		name := f.set(s.name)
		if !exist[name] {
			continue
		}
		res, err := k.nl.IpsetList(name)
		if err != nil {
			return nil, fmt.Errorf("list ipset %s: %w", name, err)
		}
		for _, e := range res.Entries {
			se := setEntry{Set: s.name}
			se.IP, _ = netip.AddrFromSlice(e.IP)
			se.IP = se.IP.Unmap()
			if e.Protocol != nil {
				se.Proto = model.Protocol(*e.Protocol)
			}
			if e.Port != nil {
				se.Port = *e.Port
			}
			if e.IP2 != nil {
				se.IP2, _ = netip.AddrFromSlice(e.IP2)
				se.IP2 = se.IP2.Unmap()
				se.CIDR2 = int(e.CIDR2)
				if se.CIDR2 == 0 {
					se.CIDR2 = se.IP2.BitLen()
				}
			}
			out[se] = true
		}
	}
	return out, nil
}

func netlinkEntry(e setEntry) *netlink.IPSetEntry {
	proto := uint8(e.Proto)
	port := e.Port
	ne := &netlink.IPSetEntry{IP: e.IP.AsSlice(), Protocol: &proto, Port: &port, Replace: true}
	if e.IP2.IsValid() {
		ne.IP2 = e.IP2.AsSlice()
		if e.CIDR2 != e.IP2.BitLen() {
			ne.CIDR2 = uint8(e.CIDR2)
		}
	}
	return ne
}

func (k *kernel) addEntry(e setEntry) error {
	set := k.fam.set(e.Set)
	err := k.nl.IpsetAdd(set, netlinkEntry(e))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nl.IPSetError(nl.IPSET_ERR_TYPE_SPECIFIC)):
		// The one hash-type error an add can meet.
		return fmt.Errorf("add %s to ipset %s: the set is full (see Config.IPSetMaxElements): %w", e, set, err)
	}
	return fmt.Errorf("add %s to ipset %s: %w", e, set, err)
}

func (k *kernel) delEntry(e setEntry) error {
	set := k.fam.set(e.Set)
	err := k.nl.IpsetDel(set, netlinkEntry(e))
	if err != nil && !errors.Is(err, nl.IPSetError(nl.IPSET_ERR_EXIST)) {
		return fmt.Errorf("delete %s from ipset %s: %w", e, set, err)
	}
	return nil
}

// ipvsService is the moby/ipvs form of a virtual server, of its address's
// family. The netmask groups clients for persistence (ClientIP affinity):
// one address each, which IPVS writes as a mask for IPv4 and as a prefix
// length (128) for IPv6, as upstream sets them.
func ipvsService(k vsKey, scheduler string, persistence time.Duration) *libipvs.Service {
	s := &libipvs.Service{
		AddressFamily: unix.AF_INET,
		Protocol:      uint16(k.Proto),
		Address:       k.Addr.AsSlice(),
		Port:          k.Port,
		SchedName:     scheduler,
		Netmask:       0xffffffff,
	}
	if k.Addr.Is6() {
		s.AddressFamily, s.Netmask = unix.AF_INET6, 128
	}
	if persistence > 0 {
		s.Flags = flagPersistent
		s.Timeout = uint32(max(1, persistence/time.Second))
	}
	return s
}

// keyOf identifies a virtual server of either family; false for one
// keyed on a firewall mark, which we never create.
func keyOf(s *libipvs.Service) (vsKey, bool) {
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok || s.FWMark != 0 || (s.AddressFamily != unix.AF_INET && s.AddressFamily != unix.AF_INET6) {
		return vsKey{}, false
	}
	return vsKey{Addr: a.Unmap(), Proto: model.Protocol(s.Protocol), Port: s.Port}, true
}

// destination is the moby/ipvs form of a real server, of its address's
// family (always the virtual server's: the model serves one family).
func destination(rs netip.AddrPort, weight int) *libipvs.Destination {
	af := uint16(unix.AF_INET)
	if rs.Addr().Is6() {
		af = unix.AF_INET6
	}
	return &libipvs.Destination{
		AddressFamily:   af,
		Address:         rs.Addr().AsSlice(),
		Port:            rs.Port(),
		Weight:          weight,
		ConnectionFlags: libipvs.ConnectionFlagMasq,
	}
}

func destKey(d *libipvs.Destination) netip.AddrPort {
	a, _ := netip.AddrFromSlice(d.Address)
	return netip.AddrPortFrom(a.Unmap(), d.Port)
}

// sysctls IPVS needs in the namespace, as kube-proxy sets them:
// conntrack lets iptables NAT (masquerade) IPVS traffic; expire_nodest_conn
// ends flows to deleted real servers at their next packet instead of
// black-holing them; expire_quiescent_template lets persistence templates
// of weight-0 real servers expire, so that affinity moves on.
var sysctls = map[string]string{
	"net/ipv4/vs/conntrack":                 "1",
	"net/ipv4/vs/expire_nodest_conn":        "1",
	"net/ipv4/vs/expire_quiescent_template": "1",
}

func setSysctls(netnsPath string) error {
	return netns.Do(netnsPath, func() error {
		for key, val := range sysctls {
			path := "/proc/sys/" + key
			cur, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("read %s: %w", key, err)
			}
			if strings.TrimSpace(string(cur)) == val {
				continue
			}
			if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
				return fmt.Errorf("set %s=%s: %w", key, val, err)
			}
		}
		return nil
	})
}
