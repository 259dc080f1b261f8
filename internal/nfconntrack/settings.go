// Package nfconntrack applies kube-proxy's connection tracking settings
// (cmd/kube-proxy's setupConntrack) to the node's netfilter parameters,
// and deletes the UDP entries that a sync of the iptables or IPVS
// fallback made stale (Cleaner), as kube-proxy's conntrack reconciler does.
package nfconntrack

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// In iptables and ipvs mode every Service connection is a NAT entry of the
// kernel's connection tracking table, and kube-proxy's defaults (a table of
// 32768 entries per core, at least 131072; established TCP idle for 24h,
// CLOSE_WAIT for 1h) apply as in kube-proxy. In ebpf mode Service
// translation keeps no entry there: only the values an operator gives are
// written, so that the node's settings are not changed for nothing.

// Settings are kube-proxy's --conntrack-* settings. A nil field was not
// given: kube-proxy's default then applies where Service NAT lives in the
// kernel's connection tracking table (the iptables and ipvs modes), and
// nothing is written where it does not (the ebpf mode).
type Settings struct {
	MaxPerCore       *int32
	Min              *int32
	TCPEstablished   *time.Duration
	TCPCloseWait     *time.Duration
	TCPBeLiberal     *bool
	UDPTimeout       *time.Duration
	UDPStreamTimeout *time.Duration
}

// kube-proxy's defaults for the conntrack settings.
const (
	defaultConntrackMaxPerCore     = 32768
	defaultConntrackMin            = 131072
	defaultConntrackTCPEstablished = 24 * time.Hour
	defaultConntrackTCPCloseWait   = time.Hour
)

// Validate refuses negative values, naming the flag.
func (c *Settings) Validate() error {
	if c.MaxPerCore != nil && *c.MaxPerCore < 0 {
		return fmt.Errorf("--conntrack-max-per-core must not be negative")
	}
	if c.Min != nil && *c.Min < 0 {
		return fmt.Errorf("--conntrack-min must not be negative")
	}
	for name, d := range map[string]*time.Duration{
		"--conntrack-tcp-timeout-established": c.TCPEstablished, "--conntrack-tcp-timeout-close-wait": c.TCPCloseWait,
		"--conntrack-udp-timeout": c.UDPTimeout, "--conntrack-udp-timeout-stream": c.UDPStreamTimeout,
	} {
		if d != nil && *d < 0 {
			return fmt.Errorf("%s must not be negative", name)
		}
	}
	return nil
}

// setting is one parameter to write.
type setting struct {
	name  string
	value int
}

// plan returns what to write, given numCPU CPUs; netfilterNAT says whether
// the proxy mode's Service NAT lives in the connection tracking table.
func (c Settings) plan(netfilterNAT bool, numCPU int) (max int, settings []setting) {
	fallback := netfilterNAT
	i32 := func(p *int32, def int32) (int32, bool) {
		if p != nil {
			return *p, true
		}
		return def, fallback
	}
	dur := func(p *time.Duration, def time.Duration) (time.Duration, bool) {
		if p != nil {
			return *p, true
		}
		return def, fallback && def != 0
	}
	perCore, okPerCore := i32(c.MaxPerCore, defaultConntrackMaxPerCore)
	minimum, _ := i32(c.Min, defaultConntrackMin)
	if okPerCore && perCore > 0 {
		max = int(perCore) * numCPU
		if int(minimum) > max {
			max = int(minimum)
		}
	}
	if d, ok := dur(c.TCPEstablished, defaultConntrackTCPEstablished); ok && d > 0 {
		settings = append(settings, setting{"net/netfilter/nf_conntrack_tcp_timeout_established", int(d / time.Second)})
	}
	if d, ok := dur(c.TCPCloseWait, defaultConntrackTCPCloseWait); ok && d > 0 {
		settings = append(settings, setting{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", int(d / time.Second)})
	}
	if c.TCPBeLiberal != nil && *c.TCPBeLiberal {
		settings = append(settings, setting{"net/netfilter/nf_conntrack_tcp_be_liberal", 1})
	}
	if d, ok := dur(c.UDPTimeout, 0); ok && d > 0 {
		settings = append(settings, setting{"net/netfilter/nf_conntrack_udp_timeout", int(d / time.Second)})
	}
	if d, ok := dur(c.UDPStreamTimeout, 0); ok && d > 0 {
		settings = append(settings, setting{"net/netfilter/nf_conntrack_udp_timeout_stream", int(d / time.Second)})
	}
	return max, settings
}

// Env is where the settings go; tests point it elsewhere.
type Env struct {
	Sys sysctl.Sysctl
	// Hashsize is nf_conntrack's module parameter.
	Hashsize string
}

// Tracking says whether the kernel's connection tracking is loaded, as its
// parameters exist only once it is.
func (env Env) Tracking() bool {
	_, err := env.Sys.GetInt("net/netfilter/nf_conntrack_max")
	return err == nil
}

// Node is the node's own netfilter parameters.
var Node = Env{Sys: sysctl.Default, Hashsize: "/sys/module/nf_conntrack/parameters/hashsize"}

// Setup writes the settings; netfilterNAT says whether the proxy mode's
// Service NAT lives in the connection tracking table (nftables, iptables,
// ipvs). kube-proxy's defaults apply there, and in the other mode (ebpf)
// too wherever nf_conntrack is loaded (Tracking): the node's other
// connections (a CNI's masquerade, kube-proxy's own at a migration) are
// tracked, with the timeouts kube-proxy gave them (a half-closed
// connection's entry that lived 60 s broke it, kubernetes#32551), and the
// e2e suite checks them. Where it is not, only values given are written,
// and nothing loads it. Unlike kube-proxy, which exits, it logs what it
// cannot write and goes on: a table size that this network namespace may
// not change (nf_conntrack_max outside the initial one, a read-only /sys
// in a container) is no reason to leave the node without Services. It
// returns the errors for the caller to count.
func Setup(env Env, c Settings, netfilterNAT bool, log *zap.Logger) error {
	if !netfilterNAT && env.Tracking() {
		netfilterNAT = true
		log.Info("nf_conntrack is loaded: kube-proxy's connection tracking defaults apply to the node's tracked connections")
	}
	max, settings := c.plan(netfilterNAT, numCPU())
	var errs []error
	if max > 0 {
		if err := env.setMax(max, log); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range settings {
		wrote, err := env.Sys.SetInt(s.name, s.value)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if wrote {
			log.Info("set a connection tracking parameter", zap.String("sysctl", s.name), zap.Int("value", s.value))
		}
	}
	err := errors.Join(errs...)
	if err != nil {
		log.Error("cannot apply every connection tracking setting; the node keeps its own values for those", zap.Error(err))
	}
	return err
}

// setMax sets nf_conntrack_max, and the hash table to a quarter of it when
// smaller, as kube-proxy does.
func (env Env) setMax(max int, log *zap.Logger) error {
	wrote, err := env.Sys.SetInt("net/netfilter/nf_conntrack_max", max)
	if err != nil {
		return err
	}
	if wrote {
		log.Info("set the connection tracking table size", zap.Int("nf_conntrack_max", max))
	}
	hs, err := sysctl.ReadIntFile(env.Hashsize)
	if err != nil {
		return fmt.Errorf("read conntrack hashsize: %w", err)
	}
	if hs >= max/4 {
		return nil
	}
	if err := os.WriteFile(env.Hashsize, []byte(strconv.Itoa(max/4)), 0o644); err != nil {
		return fmt.Errorf("set conntrack hashsize to %d: %w", max/4, err)
	}
	log.Info("set the connection tracking hash size", zap.Int("hashsize", max/4))
	return nil
}

// numCPU counts the machine's CPUs, not those of the process's cpuset
// (kubernetes#99225: a pinned kube-proxy sized the table for its one CPU).
func numCPU() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 1
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, found := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if found {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || z < a {
			return max(n, 1)
		}
		n += z - a + 1
	}
	return max(n, 1)
}
