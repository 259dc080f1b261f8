package bpf

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// PortRange is an inclusive range of ports.
type PortRange struct{ Min, Max uint16 }

// String returns the range as the flag takes it, "min-max".
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

func (r PortRange) overlaps(o PortRange) bool { return r.Min <= o.Max && o.Min <= r.Max }

var (
	// DefaultSNATPortRange is --nodeport-snat-port-range's default.
	DefaultSNATPortRange = PortRange{loader.DefaultSNATPortMin, loader.DefaultSNATPortMax}
	// nodePortRange is the API server's default --service-node-port-range:
	// kube-proxy is not told the cluster's, so the default is what we keep
	// clear of.
	nodePortRange = PortRange{30000, 32767}
)

// ephemeralPortsFile holds the node's ephemeral port range, the source
// ports of its own connections; reservedPortsFile the ports within it that
// the kernel never picks for them.
const (
	ephemeralPortsFile = "/proc/sys/net/ipv4/ip_local_port_range"
	reservedPortsFile  = "/proc/sys/net/ipv4/ip_local_reserved_ports"
)

// ParsePortRange parses "min-max" within 1024-65535: the ports below are
// the well-known ones the node's own servers listen on.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return PortRange{}, fmt.Errorf("%q: want min-max, such as %s", s, DefaultSNATPortRange)
	}
	var r PortRange
	for _, p := range []struct {
		s string
		v *uint16
	}{{lo, &r.Min}, {hi, &r.Max}} {
		n, err := strconv.ParseUint(strings.TrimSpace(p.s), 10, 16)
		if err != nil {
			return PortRange{}, fmt.Errorf("%q: %q is not a port", s, p.s)
		}
		*p.v = uint16(n)
	}
	if r.Min < 1024 || r.Max < r.Min {
		return PortRange{}, fmt.Errorf("%q: want 1024 <= min <= max <= 65535", s)
	}
	return r, nil
}

// readPortRange reads a range written as two numbers, as in
// ip_local_port_range ("32768\t60999").
func readPortRange(path string) (PortRange, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return PortRange{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return PortRange{}, fmt.Errorf("%s: want two ports, got %q", path, strings.TrimSpace(string(b)))
	}
	return ParsePortRange(f[0] + "-" + f[1])
}

// checkSNATPortRange keeps the source NAT range r clear of the node's own
// ports. A reply to one of the node's own connections (a hostNetwork pod's,
// say) from a backend the node also source-NATs to would otherwise be
// translated as a NodePort flow's and never reach its socket: the kernel
// cannot see our flows when it picks a port.
//
// Where r overlaps the ephemeral ports (read from ephemeralPath), as on
// nodes tuned to ip_local_port_range 1024-65535, r is added to the reserved
// ports (reservedPath, net.ipv4.ip_local_reserved_ports), which the kernel
// never picks for a connection, as Cilium does for its NodePort range; only
// if that fails is it refused. A range over the NodePorts is refused. With
// force, both are logged and accepted. An unreadable ephemeral range is
// logged and the check skipped.
func checkSNATPortRange(r PortRange, force bool, ephemeralPath, reservedPath string, log *zap.Logger) error {
	var clash []string
	eph, err := readPortRange(ephemeralPath)
	switch {
	case err != nil:
		log.Warn("cannot read the node's ephemeral port range: the source NAT port range is not checked against it",
			zap.String("snatPortRange", r.String()), zap.Error(err))
	case r.overlaps(eph):
		if err := reservePorts(reservedPath, r, log); err != nil {
			clash = append(clash, fmt.Sprintf("the node's ephemeral ports %s (net.ipv4.ip_local_port_range), and reserving it failed: %v", eph, err))
		}
	}
	if r.overlaps(nodePortRange) {
		clash = append(clash, fmt.Sprintf("the NodePort range %s", nodePortRange))
	}
	if len(clash) == 0 {
		return nil
	}
	msg := fmt.Sprintf("--nodeport-snat-port-range=%s overlaps %s", r, strings.Join(clash, " and "))
	if force {
		log.Warn(msg+": accepted (--nodeport-snat-port-range-force)", zap.String("snatPortRange", r.String()))
		return nil
	}
	return errors.New(msg + ": choose a range clear of them, or narrow ip_local_port_range, or set --nodeport-snat-port-range-force")
}

// reservePorts adds r to the reserved ports in path (comma-separated ports
// and ranges), unless they hold it already.
func reservePorts(path string, r PortRange, log *zap.Logger) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	cur := strings.TrimSpace(string(b))
	var have []PortRange
	for _, f := range strings.Split(cur, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		lo, hi, ok := strings.Cut(f, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.ParseUint(lo, 10, 16)
		z, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("%s: cannot parse %q", path, cur)
		}
		have = append(have, PortRange{uint16(a), uint16(z)})
	}
	if covered(r, have) {
		return nil
	}
	next := r.String()
	if cur != "" {
		next = cur + "," + next
	}
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		return err
	}
	log.Info("reserved the source NAT ports among the node's ephemeral ports (net.ipv4.ip_local_reserved_ports): the node's own connections no longer pick them",
		zap.String("snatPortRange", r.String()), zap.String("reservedPorts", next))
	return nil
}

// covered reports whether the ranges in have hold every port of r.
func covered(r PortRange, have []PortRange) bool {
	for p := int(r.Min); p <= int(r.Max); {
		next := p
		for _, h := range have {
			if int(h.Min) <= p && p <= int(h.Max) {
				next = int(h.Max) + 1
				break
			}
		}
		if next == p {
			return false
		}
		p = next
	}
	return true
}
