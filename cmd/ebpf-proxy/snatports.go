package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
)

// portRange is an inclusive range of ports.
type portRange struct{ min, max uint16 }

func (r portRange) String() string { return fmt.Sprintf("%d-%d", r.min, r.max) }

func (r portRange) overlaps(o portRange) bool { return r.min <= o.max && o.min <= r.max }

var (
	defaultSNATPortRange = portRange{loader.DefaultSNATPortMin, loader.DefaultSNATPortMax}
	// nodePortRange is the API server's default --service-node-port-range:
	// kube-proxy is not told the cluster's, so the default is what we keep
	// clear of.
	nodePortRange = portRange{30000, 32767}
)

// ephemeralPortsFile holds the node's ephemeral port range, the source
// ports of its own connections; reservedPortsFile the ports within it that
// the kernel never picks for them.
const (
	ephemeralPortsFile = "/proc/sys/net/ipv4/ip_local_port_range"
	reservedPortsFile  = "/proc/sys/net/ipv4/ip_local_reserved_ports"
)

// parsePortRange parses "min-max" within 1024-65535: the ports below are
// the well-known ones the node's own servers listen on.
func parsePortRange(s string) (portRange, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return portRange{}, fmt.Errorf("%q: want min-max, such as %s", s, defaultSNATPortRange)
	}
	var r portRange
	for _, p := range []struct {
		s string
		v *uint16
	}{{lo, &r.min}, {hi, &r.max}} {
		n, err := strconv.ParseUint(strings.TrimSpace(p.s), 10, 16)
		if err != nil {
			return portRange{}, fmt.Errorf("%q: %q is not a port", s, p.s)
		}
		*p.v = uint16(n)
	}
	if r.min < 1024 || r.max < r.min {
		return portRange{}, fmt.Errorf("%q: want 1024 <= min <= max <= 65535", s)
	}
	return r, nil
}

// readPortRange reads a range written as two numbers, as in
// ip_local_port_range ("32768\t60999").
func readPortRange(path string) (portRange, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return portRange{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return portRange{}, fmt.Errorf("%s: want two ports, got %q", path, strings.TrimSpace(string(b)))
	}
	return parsePortRange(f[0] + "-" + f[1])
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
func checkSNATPortRange(r portRange, force bool, ephemeralPath, reservedPath string, log *zap.Logger) error {
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
func reservePorts(path string, r portRange, log *zap.Logger) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	cur := strings.TrimSpace(string(b))
	var have []portRange
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
		have = append(have, portRange{uint16(a), uint16(z)})
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
func covered(r portRange, have []portRange) bool {
	for p := int(r.min); p <= int(r.max); {
		next := p
		for _, h := range have {
			if int(h.min) <= p && p <= int(h.max) {
				next = int(h.max) + 1
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
