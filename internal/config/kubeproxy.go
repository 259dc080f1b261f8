package config

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// kube-proxy's flags that ebpf-proxy takes under the same names, so that
// a kube-proxy DaemonSet's command line runs unchanged. Those with a
// meaning in a mode of ours apply there; the few without any are accepted
// and their effect (none) is logged once at start-up by NoteIgnored.

// Detect-local modes (--detect-local-mode).
const (
	DetectLocalClusterCIDR         = "ClusterCIDR"
	DetectLocalNodeCIDR            = "NodeCIDR"
	DetectLocalBridgeInterface     = "BridgeInterface"
	DetectLocalInterfaceNamePrefix = "InterfaceNamePrefix"
)

// GatePreferSameTrafficDistribution is the one feature gate of kube-proxy
// that changes what ebpf-proxy does.
const GatePreferSameTrafficDistribution = "PreferSameTrafficDistribution"

// FeatureGates are the parsed --feature-gates.
type FeatureGates map[string]bool

// Enabled says whether gate is on, def when not given.
func (g FeatureGates) Enabled(gate string, def bool) bool {
	if v, ok := g[gate]; ok {
		return v
	}
	return def
}

// optional is a flag value that stays nil until the flag is given, for
// kube-proxy's settings whose default depends on the proxy mode.
type optional[T any] struct {
	p     **T
	parse func(string) (T, error)
	typ   string
}

func (v optional[T]) String() string {
	if *v.p == nil {
		return ""
	}
	return fmt.Sprint(**v.p)
}

func (v optional[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = &x
	return nil
}

func (v optional[T]) Type() string { return v.typ }

// IsBoolFlag lets a boolean flag be given without a value.
func (v optional[T]) IsBoolFlag() bool { return v.typ == "bool" }

func optInt32(p **int32) optional[int32] {
	return optional[int32]{p, func(s string) (int32, error) {
		n, err := strconv.ParseInt(s, 10, 32)
		return int32(n), err
	}, "int32"}
}

func optDuration(p **time.Duration) optional[time.Duration] {
	return optional[time.Duration]{p, time.ParseDuration, "duration"}
}

func optBool(p **bool) optional[bool] { return optional[bool]{p, strconv.ParseBool, "bool"} }

func (o *Options) addKubeProxyFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "The path to kube-proxy's configuration file (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1). As in kube-proxy, the file replaces kube-proxy's own flags (except --hostname-override); ebpf-proxy's flags still apply.")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", o.WriteConfigTo, "If set, write the configuration in effect (defaults, flags and --config) to this file as a KubeProxyConfiguration and exit.")
	fs.BoolVar(&o.InitOnly, "init-only", o.InitOnly, "If true, do the privileged start-up work (the connection tracking settings) and exit.")
	fs.StringToStringVar(&o.FeatureGates, "feature-gates", o.FeatureGates, "kube-proxy's feature gates as key=value pairs. "+GatePreferSameTrafficDistribution+" (trafficDistribution PreferSameNode) is GA and locked to true, as in kube-proxy 1.35 and later; the others have no effect on ebpf-proxy and are logged.")
	fs.StringVar(&o.KubeAPIContentType, "kube-api-content-type", o.KubeAPIContentType, "Content type of requests sent to the API server.")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "QPS to use while talking with the API server.")
	fs.Int32Var(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Burst to use while talking with the API server.")
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "Overrides the node's primary IPv4 address (the first of its Node object's addresses) when set to one; 0.0.0.0 keeps the Node's.")
	fs.StringVar(&o.ShowHiddenMetrics, "show-hidden-metrics-for-version", o.ShowHiddenMetrics, "The previous version for which to show hidden metrics. ebpf-proxy hides none, so any version is accepted and changes nothing.")
	fs.StringVar(&o.LoggingFormat, "logging-format", o.LoggingFormat, "Log format: 'json' (default) or 'text'.")
	fs.StringVar(&o.Vmodule, "vmodule", o.Vmodule, "kube-proxy's per-file log verbosity (pattern=N,...). ebpf-proxy has one verbosity, --v: accepted, and logged as without effect.")
	fs.DurationVar(&o.LogFlushFrequency, "log-flush-frequency", 5*time.Second, "Maximum time between log flushes, as in kube-proxy. ebpf-proxy writes every line at once: accepted, without effect.")
	fs.Int32Var(&o.OOMScoreAdj, "oom-score-adj", o.OOMScoreAdj, "The oom-score-adj value for the agent's process. Must be within [-1000, 1000].")
	fs.DurationVar(&o.IPTablesSyncPeriod, "iptables-sync-period", o.IPTablesSyncPeriod, "In iptables and nftables mode, the interval of the periodic full sync and the longest retry backoff (e.g. '5s', '1m'). Must be greater than 0.")
	fs.DurationVar(&o.IPTablesMinSync, "iptables-min-sync-period", o.IPTablesMinSync, "In iptables and nftables mode, the least time between two syncs; changes arriving sooner are batched.")
	fs.BoolVar(&o.LocalhostNodePorts, "iptables-localhost-nodeports", o.LocalhostNodePorts, "NodePorts on 127.0.0.1 (all of 127.0.0.0/8) for the node's own processes, when --nodeport-addresses holds 127.0.0.1 (as unset does), as kube-proxy's iptables mode serves them. In ebpf mode the socket programs serve them to the node's sockets only, never to pods or to traffic from outside. The iptables fallback serves them as kube-proxy's iptables mode does (route_localnet=1, with its rule that drops what the network sends to 127.0.0.0/8, CVE-2020-8558); the nftables fallback does not, as kube-proxy's nftables mode does not.")
	fs.DurationVar(&o.IPVSSyncPeriod, "ipvs-sync-period", o.IPVSSyncPeriod, "In ipvs mode, the interval of the periodic full sync and the longest retry backoff. Must be greater than 0.")
	fs.DurationVar(&o.IPVSMinSync, "ipvs-min-sync-period", o.IPVSMinSync, "In ipvs mode, the least time between two syncs; changes arriving sooner are batched.")
	fs.StringSliceVar(&o.IPVSExcludeCIDRs, "ipvs-exclude-cidrs", o.IPVSExcludeCIDRs, "In ipvs mode, CIDRs whose IPVS virtual servers are never removed, not even when they look like ours.")
	fs.BoolVar(&o.IPVSStrictARP, "ipvs-strict-arp", o.IPVSStrictARP, "In ipvs mode, set arp_ignore=1 and arp_announce=2 so that the Service addresses on the dummy device are not answered for by ARP.")
	fs.StringVar(&o.DetectLocalMode, "detect-local-mode", o.DetectLocalMode, "How nftables, iptables and ipvs mode tell pod traffic from the rest: 'ClusterCIDR' (default) or 'BridgeInterface' or 'InterfaceNamePrefix'. ebpf mode sees every client's socket and needs none.")
	fs.StringVar(&o.PodBridgeInterface, "pod-bridge-interface", o.PodBridgeInterface, "With --detect-local-mode=BridgeInterface, the bridge the node's pods are attached to.")
	fs.StringVar(&o.PodInterfacePrefix, "pod-interface-name-prefix", o.PodInterfacePrefix, "With --detect-local-mode=InterfaceNamePrefix, the prefix of the node's pod interfaces.")
	fs.Var(optInt32(&o.Conntrack.MaxPerCore), "conntrack-max-per-core", "Maximum number of NAT connections to track per CPU core (0 to leave the limit as is and ignore conntrack-min); kube-proxy's default 32768 applies in iptables and ipvs mode.")
	fs.Var(optInt32(&o.Conntrack.Min), "conntrack-min", "Minimum number of connection tracking entries to allocate, whatever conntrack-max-per-core says; default 131072 in iptables and ipvs mode.")
	fs.Var(optDuration(&o.Conntrack.TCPEstablished), "conntrack-tcp-timeout-established", "Idle timeout of established TCP connections in the connection tracking table (0 to leave it as is); default 24h in iptables and ipvs mode.")
	fs.Var(optDuration(&o.Conntrack.TCPCloseWait), "conntrack-tcp-timeout-close-wait", "Time connection tracking keeps TCP connections in CLOSE_WAIT; default 1h in iptables and ipvs mode.")
	fs.Var(optBool(&o.Conntrack.TCPBeLiberal), "conntrack-tcp-be-liberal", "Mark only out-of-window RST segments as INVALID (nf_conntrack_tcp_be_liberal=1).")
	fs.Var(optDuration(&o.Conntrack.UDPTimeout), "conntrack-udp-timeout", "Idle timeout of UNREPLIED UDP entries (0 to leave it as is).")
	fs.Var(optDuration(&o.Conntrack.UDPStreamTimeout), "conntrack-udp-timeout-stream", "Idle timeout of ASSURED UDP entries (0 to leave it as is).")
	fs.Lookup("conntrack-tcp-be-liberal").NoOptDefVal = "true"
}

// validateKubeProxyFlags checks kube-proxy's flags as kube-proxy's own
// validation does, and parses what later steps need.
func (o *Options) validateKubeProxyFlags() error {
	if o.OOMScoreAdj < -1000 || o.OOMScoreAdj > 1000 {
		return fmt.Errorf("--oom-score-adj=%d: must be within [-1000, 1000]", o.OOMScoreAdj)
	}
	if o.KubeAPIQPS < 0 || o.KubeAPIBurst < 0 {
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must not be negative")
	}
	for name, d := range map[string]time.Duration{"--iptables-sync-period": o.IPTablesSyncPeriod, "--ipvs-sync-period": o.IPVSSyncPeriod} {
		if d <= 0 {
			return fmt.Errorf("%s=%s: must be greater than 0", name, d)
		}
	}
	for name, d := range map[string]time.Duration{"--iptables-min-sync-period": o.IPTablesMinSync, "--ipvs-min-sync-period": o.IPVSMinSync} {
		if d < 0 {
			return fmt.Errorf("%s=%s: must not be negative", name, d)
		}
	}
	if o.IPTablesMinSync > o.IPTablesSyncPeriod {
		return fmt.Errorf("--iptables-min-sync-period=%s must be less than or equal to --iptables-sync-period=%s", o.IPTablesMinSync, o.IPTablesSyncPeriod)
	}
	if o.IPVSMinSync > o.IPVSSyncPeriod {
		return fmt.Errorf("--ipvs-min-sync-period=%s must be less than or equal to --ipvs-sync-period=%s", o.IPVSMinSync, o.IPVSSyncPeriod)
	}
	for _, c := range o.IPVSExcludeCIDRs {
		if _, err := netip.ParsePrefix(strings.TrimSpace(c)); err != nil {
			return fmt.Errorf("--ipvs-exclude-cidrs: %q is not a CIDR: %w", c, err)
		}
	}
	switch o.LoggingFormat {
	case "json", "text":
	default:
		return fmt.Errorf("--logging-format=%q: want 'json' or 'text'", o.LoggingFormat)
	}
	switch o.DetectLocalMode {
	case "", DetectLocalClusterCIDR:
	case DetectLocalBridgeInterface:
		if o.PodBridgeInterface == "" {
			return fmt.Errorf("--detect-local-mode=BridgeInterface needs --pod-bridge-interface")
		}
	case DetectLocalInterfaceNamePrefix:
		if o.PodInterfacePrefix == "" {
			return fmt.Errorf("--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix")
		}
	case DetectLocalNodeCIDR:
		// Node.spec.podCIDRs are not watched: refused when a fallback
		// mode starts (cmd/ebpf-proxy, localDetector), where it would matter.
	default:
		return fmt.Errorf("unknown --detect-local-mode %q: want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", o.DetectLocalMode)
	}
	if err := o.Conntrack.Validate(); err != nil {
		return err
	}
	o.Gates = FeatureGates{}
	for k, v := range o.FeatureGates {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("--feature-gates: %s=%q is not a boolean", k, v)
		}
		o.Gates[strings.TrimSpace(k)] = b
	}
	if on, given := o.Gates[GatePreferSameTrafficDistribution]; given && !on {
		// As kube-proxy 1.37 refuses it: the gate went GA in 1.35,
		// locked to its default.
		return fmt.Errorf("--feature-gates: %s=false: the gate is GA and locked to true since Kubernetes 1.35 (kube-proxy refuses false too)", GatePreferSameTrafficDistribution)
	}
	o.NodeIP = netip.Addr{}
	if s := strings.TrimSpace(o.BindAddress); s != "" {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("--bind-address=%q is not an IP address: %w", o.BindAddress, err)
		}
		if a = a.Unmap(); !a.IsUnspecified() && !a.IsLoopback() {
			o.NodeIP = a
		}
	}
	return nil
}

// NFTablesPeriods are the nftables section's sync periods of kube-proxy's
// file: where it gives none, the iptables ones, as kube-proxy has no
// nftables flags of its own.
func (o *Options) NFTablesPeriods() (sync, minSync time.Duration) {
	sync, minSync = o.IPTablesSyncPeriod, o.IPTablesMinSync
	if o.NFTablesSyncPeriod > 0 {
		sync = o.NFTablesSyncPeriod
	}
	if o.NFTablesMinSync > 0 {
		minSync = o.NFTablesMinSync
	}
	return sync, minSync
}

// NoteIgnored logs, once at start-up, each kube-proxy setting given that
// has no effect on the agent, or none in the mode that runs (the modes
// note their own: proxymode.Mode.Ignored), so that nobody relies on it
// unknowingly.
func (o *Options) NoteIgnored(mode string, log *zap.Logger) {
	var known []string
	for gate, on := range o.Gates {
		if gate == GatePreferSameTrafficDistribution {
			continue
		}
		known = append(known, fmt.Sprintf("%s=%t", gate, on))
	}
	sort.Strings(known)
	if len(known) > 0 {
		log.Info("feature gates without effect on ebpf-proxy", zap.Strings("featureGates", known))
	}
	if o.Vmodule != "" {
		log.Info("--vmodule has no effect: ebpf-proxy has one log verbosity, --v", zap.String("vmodule", o.Vmodule))
	}
	if o.ShowHiddenMetrics != "" {
		log.Info("--show-hidden-metrics-for-version: ebpf-proxy hides no metrics", zap.String("version", o.ShowHiddenMetrics))
	}
	if mode != kubeProxyIPVS && (o.IPVSStrictARP || len(o.IPVSExcludeCIDRs) > 0) {
		log.Info("--ipvs-strict-arp and --ipvs-exclude-cidrs apply in ipvs mode only", zap.String("mode", mode))
	}
}

// LogModeSetting says, once at start-up, which setting chose the proxy
// mode that runs, and what kube-proxy's --config file names as its own
// mode when it names one: kubeadm writes "mode: iptables" (1.37) into the
// ConfigMap the agent reads, which must not look like the reason for a
// fallback.
func (o *Options) LogModeSetting(mode, reason string, log *zap.Logger) {
	fields := []zap.Field{zap.String("mode", mode), zap.String("reason", reason),
		zap.String("setting", o.ProxyModeSetting), zap.String("proxyMode", o.ProxyMode)}
	if o.KubeProxyMode != "" {
		fields = append(fields, zap.String("kubeProxyMode", o.KubeProxyMode))
		log.Info("proxy mode set by "+o.ProxyModeSetting+"; the mode in kube-proxy's --config file is kube-proxy's choice and has no effect on ebpf-proxy", fields...)
		return
	}
	log.Info("proxy mode set by "+o.ProxyModeSetting, fields...)
}
