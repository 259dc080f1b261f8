package main

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

// The connection tracking settings kube-proxy makes at start-up
// (cmd/kube-proxy's setupConntrack). In iptables and ipvs mode every
// Service connection is a NAT entry of the kernel's connection tracking
// table, and kube-proxy's defaults (a table of 32768 entries per core, at
// least 131072; established TCP idle for 24h, CLOSE_WAIT for 1h) apply as
// in kube-proxy. In ebpf mode Service translation keeps no entry there:
// only the values an operator gives are written, so that the node's
// settings are not changed for nothing.

// conntrackSetting is one parameter to write.
type conntrackSetting struct {
	name  string
	value int
}

// conntrackPlan returns what to write for mode, given numCPU CPUs.
func (c conntrackOptions) plan(mode string, numCPU int) (max int, settings []conntrackSetting) {
	fallback := mode == modeIPTables || mode == modeIPVS
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
	perCore, okPerCore := i32(c.maxPerCore, defaultConntrackMaxPerCore)
	minimum, _ := i32(c.min, defaultConntrackMin)
	if okPerCore && perCore > 0 {
		max = int(perCore) * numCPU
		if int(minimum) > max {
			max = int(minimum)
		}
	}
	if d, ok := dur(c.tcpEstablished, defaultConntrackTCPEstablished); ok && d > 0 {
		settings = append(settings, conntrackSetting{"net/netfilter/nf_conntrack_tcp_timeout_established", int(d / time.Second)})
	}
	if d, ok := dur(c.tcpCloseWait, defaultConntrackTCPCloseWait); ok && d > 0 {
		settings = append(settings, conntrackSetting{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", int(d / time.Second)})
	}
	if c.tcpBeLiberal != nil && *c.tcpBeLiberal {
		settings = append(settings, conntrackSetting{"net/netfilter/nf_conntrack_tcp_be_liberal", 1})
	}
	if d, ok := dur(c.udpTimeout, 0); ok && d > 0 {
		settings = append(settings, conntrackSetting{"net/netfilter/nf_conntrack_udp_timeout", int(d / time.Second)})
	}
	if d, ok := dur(c.udpStreamTimeout, 0); ok && d > 0 {
		settings = append(settings, conntrackSetting{"net/netfilter/nf_conntrack_udp_timeout_stream", int(d / time.Second)})
	}
	return max, settings
}

// conntrackEnv is where the settings go; tests point it elsewhere.
type conntrackEnv struct {
	sys sysctl.Sysctl
	// hashsize is nf_conntrack's module parameter.
	hashsize string
}

var realConntrack = conntrackEnv{sys: sysctl.Default, hashsize: "/sys/module/nf_conntrack/parameters/hashsize"}

// setupConntrack writes the settings for mode. Unlike kube-proxy, which
// exits, it logs what it cannot write and goes on: a table size that this
// network namespace may not change (nf_conntrack_max outside the initial
// one, a read-only /sys in a container) is no reason to leave the node
// without Services. It returns the errors for the caller to count.
func setupConntrack(env conntrackEnv, c conntrackOptions, mode string, log *zap.Logger) error {
	max, settings := c.plan(mode, numCPU())
	var errs []error
	if max > 0 {
		if err := env.setMax(max, log); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range settings {
		wrote, err := env.sys.SetInt(s.name, s.value)
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
func (env conntrackEnv) setMax(max int, log *zap.Logger) error {
	wrote, err := env.sys.SetInt("net/netfilter/nf_conntrack_max", max)
	if err != nil {
		return err
	}
	if wrote {
		log.Info("set the connection tracking table size", zap.Int("nf_conntrack_max", max))
	}
	hs, err := sysctl.ReadIntFile(env.hashsize)
	if err != nil {
		return fmt.Errorf("read conntrack hashsize: %w", err)
	}
	if hs >= max/4 {
		return nil
	}
	if err := os.WriteFile(env.hashsize, []byte(strconv.Itoa(max/4)), 0o644); err != nil {
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

// applyOOMScoreAdj sets the agent's oom_score_adj; a refusal is logged, as
// kube-proxy does, not fatal.
func applyOOMScoreAdj(v int32, log *zap.Logger) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(int(v))), 0o644); err != nil {
		log.Info("cannot set oom_score_adj", zap.Int32("oomScoreAdj", v), zap.Error(err))
	}
}

// applyStrictARP makes the node answer ARP only for addresses of the
// device asked (arp_ignore=1) and announce its best local address
// (arp_announce=2), so that the Service addresses ipvs mode binds to its
// dummy device do not attract traffic meant for a load balancer's
// speaker (MetalLB in L2 mode needs it), as kube-proxy's --ipvs-strict-arp.
func applyStrictARP(sys sysctl.Sysctl, log *zap.Logger) error {
	for _, s := range []conntrackSetting{{"net/ipv4/conf/all/arp_ignore", 1}, {"net/ipv4/conf/all/arp_announce", 2}} {
		wrote, err := sys.SetInt(s.name, s.value)
		if err != nil {
			return fmt.Errorf("--ipvs-strict-arp: %w", err)
		}
		if wrote {
			log.Info("set an ARP parameter for --ipvs-strict-arp", zap.String("sysctl", s.name), zap.Int("value", s.value))
		}
	}
	return nil
}
