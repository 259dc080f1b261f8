package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"

	"github.com/ebpf-proxy/ebpf-proxy/internal/conntrack"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/iptables"
	"github.com/ebpf-proxy/ebpf-proxy/internal/fallback/ipvs"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maglev"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
)

// options are the agent's flags.
type options struct {
	kubeconfig         string
	master             string
	hostnameOverride   string
	proxyMode          string
	healthzBindAddress string
	metricsBindAddress string
	bindAddrHardFail   bool
	profiling          bool
	cleanup            bool
	verbosity          int
	configSyncPeriod   time.Duration
	syncPeriod         time.Duration
	minSyncPeriod      time.Duration
	nodePortAddresses  []string

	// kube-proxy's remaining flags, and its configuration file.
	configFile         string
	writeConfigTo      string
	initOnly           bool
	featureGates       map[string]string
	kubeAPIContentType string
	kubeAPIQPS         float32
	kubeAPIBurst       int32
	bindAddress        string
	showHiddenMetrics  string
	// vmodule and logFlushFrequency are kube-proxy's logging flags,
	// accepted for its command lines.
	vmodule            string
	logFlushFrequency  time.Duration
	loggingFormat      string
	oomScoreAdj        int32
	iptablesSyncPeriod time.Duration
	iptablesMinSync    time.Duration
	// nftablesSyncPeriod and nftablesMinSync are the nftables section of
	// --config; zero uses the iptables periods, as kube-proxy has no
	// nftables flags of its own.
	nftablesSyncPeriod time.Duration
	nftablesMinSync    time.Duration
	localhostNodePorts bool
	ipvsSyncPeriod     time.Duration
	ipvsMinSync        time.Duration
	ipvsExcludeCIDRs   []string
	ipvsStrictARP      bool
	detectLocalMode    string
	podBridgeInterface string
	podInterfacePrefix string
	conntrack          conntrack.Settings
	// Parsed by validate.
	nodeIP netip.Addr
	gates  featureGates

	// The fallback dataplanes' settings, under kube-proxy's flag names.
	clusterCIDR       string
	masqueradeAll     bool
	masqueradeBit     int32
	ipvsScheduler     string
	ipvsTCPTimeout    time.Duration
	ipvsTCPFinTimeout time.Duration
	ipvsUDPTimeout    time.Duration
	// Parsed by validate, by IP family ("IPv4", "IPv6"): --cluster-cidr,
	// and --nodeport-addresses with --iptables-localhost-nodeports.
	clusterPrefixes map[string]netip.Prefix
	nodePorts       map[string]model.NodePortSpec

	manifests        string
	terminateSockets bool
	cgroupPath       string
	bpffsPath        string
	mapSizes         loader.MapSizes

	devices       []string
	tcAttach      string
	xdp           string
	conntrackSize uint32
	// snatPortRange is --nodeport-snat-port-range, parsed by validate
	// into snatPorts; snatPortRangeForce skips its overlap checks.
	snatPortRange      string
	snatPorts          bpf.PortRange
	snatPortRangeForce bool
	lbAlgorithm        string
	// lb is lbAlgorithm parsed by validate.
	lb model.LBAlgorithm
}

func defaultOptions() *options {
	return &options{
		proxyMode:          proxymode.Auto,
		masqueradeBit:      iptables.DefaultMasqueradeBit,
		healthzBindAddress: "0.0.0.0:10256",
		xdp:                loader.XDPOff,
		metricsBindAddress: "127.0.0.1:10249",
		configSyncPeriod:   15 * time.Minute,
		syncPeriod:         30 * time.Second,
		bpffsPath:          loader.DefaultBPFFSPath,
		mapSizes:           loader.DefaultMapSizes,
		terminateSockets:   true,
		conntrackSize:      loader.DefaultConntrackSize,
		snatPortRange:      bpf.DefaultSNATPortRange.String(),
		lbAlgorithm:        model.LBRandom.String(),
		kubeAPIContentType: "application/vnd.kubernetes.protobuf",
		kubeAPIQPS:         5,
		kubeAPIBurst:       10,
		bindAddress:        "0.0.0.0",
		loggingFormat:      "json",
		oomScoreAdj:        -999,
		iptablesSyncPeriod: 30 * time.Second,
		iptablesMinSync:    time.Second,
		localhostNodePorts: true,
		ipvsSyncPeriod:     30 * time.Second,
		ipvsMinSync:        0,
	}
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "Path to a kubeconfig file with authorization information (the in-cluster configuration is used when neither this nor --master is set).")
	fs.StringVar(&o.master, "master", o.master, "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	fs.StringVar(&o.hostnameOverride, "hostname-override", o.hostnameOverride, "If non-empty, use this string as the node name instead of the actual hostname.")
	fs.StringVar(&o.proxyMode, "proxy-mode", o.proxyMode, "Which proxy mode to use: 'ebpf', 'nftables', 'iptables', 'ipvs' or 'auto' (ebpf where the kernel can run the BPF programs, else nftables where nft and the kernel's nf_tables work, else iptables; ipvs only when named).")
	fs.StringVar(&o.healthzBindAddress, "healthz-bind-address", o.healthzBindAddress, "The IP address and port for the health check server to serve on; empty disables it.")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", o.metricsBindAddress, "The IP address and port for the metrics server to serve on; empty disables it.")
	fs.BoolVar(&o.profiling, "profiling", o.profiling, "If true, serve Go's profiles on /debug/pprof/ of the metrics server, as kube-proxy does.")
	fs.BoolVar(&o.bindAddrHardFail, "bind-address-hard-fail", o.bindAddrHardFail, "If true, failure to bind the health or metrics address is fatal; otherwise it is retried.")
	fs.BoolVar(&o.cleanup, "cleanup", o.cleanup, "If true, remove what every proxy mode of ebpf-proxy created (BPF programs and maps, nftables tables, iptables chains, IPVS virtual servers, ipsets and the dummy interface), then exit.")
	fs.IntVarP(&o.verbosity, "v", "v", o.verbosity, "Log verbosity: 2 or more logs every sync.")
	fs.DurationVar(&o.configSyncPeriod, "config-sync-period", o.configSyncPeriod, "How often the configuration from the API server is refreshed. Must be greater than 0.")
	fs.DurationVar(&o.syncPeriod, "sync-period", o.syncPeriod, "Interval of the periodic full sync, and the longest retry backoff after a failed sync.")
	fs.DurationVar(&o.minSyncPeriod, "min-sync-period", o.minSyncPeriod, "Least time between two syncs; changes arriving sooner are batched. 0 applies each change at once.")
	fs.StringSliceVar(&o.nodePortAddresses, "nodeport-addresses", o.nodePortAddresses, "The CIDRs of the node addresses that accept NodePort traffic and serve health check node ports (comma-separated, e.g. '192.168.77.0/24'); empty means every local address. 'primary' means the node's primary IP.")
	fs.BoolVar(&o.terminateSockets, "terminate-removed-backend-sockets", o.terminateSockets, "End the TCP and connected UDP sockets that the socket load balancer sent to a backend once that backend is removed, in every network namespace of the node (needs hostPID), so that clients reconnect to live backends instead of hanging.")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", o.clusterCIDR, "The CIDR range of the pods in the cluster (comma-separated for dual-stack: one per IP family). In nftables, iptables and ipvs mode, ClusterIP traffic from outside it is masqueraded.")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", o.masqueradeAll, "In nftables, iptables and ipvs mode, SNAT all traffic sent through Service cluster IPs.")
	fs.Int32Var(&o.masqueradeBit, "iptables-masquerade-bit", o.masqueradeBit, "In nftables, iptables and ipvs mode, the bit of the fwmark space that marks packets to SNAT. Must be within [0, 31].")
	fs.StringVar(&o.ipvsScheduler, "ipvs-scheduler", o.ipvsScheduler, "The IPVS scheduler in ipvs mode: rr (default), lc, dh, sh, sed or nq.")
	fs.DurationVar(&o.ipvsTCPTimeout, "ipvs-tcp-timeout", o.ipvsTCPTimeout, "The timeout for idle IPVS TCP connections, 0 to leave it as is (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&o.ipvsTCPFinTimeout, "ipvs-tcpfin-timeout", o.ipvsTCPFinTimeout, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave it as is.")
	fs.DurationVar(&o.ipvsUDPTimeout, "ipvs-udp-timeout", o.ipvsUDPTimeout, "The timeout for IPVS UDP packets, 0 to leave it as is.")
	fs.StringVar(&o.manifests, "manifests", o.manifests, "Read Services and EndpointSlices from YAML files in this directory (watched for changes) instead of the API server.")
	fs.StringVar(&o.cgroupPath, "cgroup-path", o.cgroupPath, "The cgroup v2 directory to attach the socket programs to (default: the node's cgroup2 root, mounting cgroup2 under /run/ebpf-proxy when none is mounted).")
	fs.StringVar(&o.bpffsPath, "bpffs-path", o.bpffsPath, "Directory on a bpf filesystem where maps and links are pinned.")
	fs.Uint32Var(&o.mapSizes.Services, "bpf-map-services-max", o.mapSizes.Services, "Capacity of the services map: one entry per frontend plus one per backend of each frontend.")
	fs.Uint32Var(&o.mapSizes.Backends, "bpf-map-backends-max", o.mapSizes.Backends, "Capacity of the backends map.")
	fs.Uint32Var(&o.mapSizes.RevNat, "bpf-map-revnat-max", o.mapSizes.RevNat, "Capacity of the reverse NAT map: one entry per frontend.")
	fs.Uint32Var(&o.mapSizes.SockRevNat, "bpf-map-sock-revnat-max", o.mapSizes.SockRevNat, "Capacity of the socket reverse NAT LRU.")
	fs.StringSliceVar(&o.devices, "devices", o.devices, "Network devices to translate NodePort, ExternalIP and LoadBalancer-IP traffic on (default: the devices carrying the node's addresses). Add the pod bridge (cni0, ...) to masquerade externalTrafficPolicy=Cluster traffic to pods on the node as kube-proxy does; without it those pods see the client's address.")
	fs.StringVar(&o.tcAttach, "tc-attach", o.tcAttach, "How to attach the TC programs: '' (tcx where the kernel has it, else clsact), 'tcx' or 'clsact'.")
	fs.StringVar(&o.xdp, "xdp", o.xdp, "The XDP fast path for NodePort, ExternalIP and LoadBalancer-IP traffic to backends on other nodes, on the same devices as the TC programs: 'native' (in the driver), 'generic' (any device, less gain) or 'off'. A device that refuses the mode keeps the TC programs only (logged, and counted in ebpfproxy_xdp_attach_failures_total).")
	fs.Uint32Var(&o.conntrackSize, "bpf-map-conntrack-max", o.conntrackSize, "Capacity of the TC connection tracking LRU: two entries per flow from outside the node.")
	fs.StringVar(&o.snatPortRange, "nodeport-snat-port-range", o.snatPortRange, "Source ports (min-max) that NodePort, ExternalIP and LoadBalancer-IP traffic to a backend on another node is source-NATed to: each (node address, backend) pair has this many concurrent flows (a closed TCP connection frees its port at once, a UDP flow after 30 s, or 120 s once it is a stream). Must lie within 1024-65535 and stay clear of the NodePort range 30000-32767; where it overlaps the node's ephemeral ports (net.ipv4.ip_local_port_range) it is added to net.ipv4.ip_local_reserved_ports, so that the node's own connections never pick these ports and their replies are never taken for source NAT's.")
	fs.BoolVar(&o.snatPortRangeForce, "nodeport-snat-port-range-force", o.snatPortRangeForce, "Accept a --nodeport-snat-port-range that overlaps 30000-32767, or the node's ephemeral ports where it cannot be reserved (logged), for nodes that keep those ports free otherwise.")
	fs.Uint32Var(&o.mapSizes.Affinity, "bpf-map-affinity-max", o.mapSizes.Affinity, "Capacity of the session affinity LRU: (client, Service port) pairs remembered.")
	fs.StringVar(&o.lbAlgorithm, "lb-algorithm", o.lbAlgorithm, "How traffic from outside the node picks a backend for a new flow: 'random' (as kube-proxy) or 'maglev' (consistent hashing: every node picks the same backend for a flow). A Service's annotation "+k8swatch.AnnotationLBAlgorithm+" overrides it.")
	o.addKubeProxyFlags(fs)
	fs.Uint32Var(&o.mapSizes.MaglevTable, "maglev-table-size", o.mapSizes.MaglevTable, "Entries of a Maglev table, a prime well above the largest backend count (4 bytes each, per Service port that uses Maglev).")
}

func (o *options) validate() error {
	switch o.proxyMode {
	case proxymode.Auto, proxymode.EBPF, proxymode.NFTables, proxymode.IPTables, proxymode.IPVS:
	default:
		return fmt.Errorf("unknown --proxy-mode %q: want 'auto', 'ebpf', 'nftables', 'iptables' or 'ipvs'", o.proxyMode)
	}
	if o.masqueradeBit < 0 || o.masqueradeBit > 31 {
		return fmt.Errorf("--iptables-masquerade-bit=%d: must be within [0, 31]", o.masqueradeBit)
	}
	if o.ipvsScheduler != "" && !slices.Contains(ipvs.Schedulers, o.ipvsScheduler) {
		return fmt.Errorf("--ipvs-scheduler=%s: want one of %s", o.ipvsScheduler, strings.Join(ipvs.Schedulers, ", "))
	}
	for name, d := range map[string]time.Duration{"--ipvs-tcp-timeout": o.ipvsTCPTimeout, "--ipvs-tcpfin-timeout": o.ipvsTCPFinTimeout, "--ipvs-udp-timeout": o.ipvsUDPTimeout} {
		if d < 0 || d%time.Second != 0 {
			return fmt.Errorf("%s=%s: want whole seconds, 0 or more", name, d)
		}
	}
	var err error
	if o.clusterPrefixes, err = parseClusterCIDR(o.clusterCIDR); err != nil {
		return err
	}
	o.nodePorts = map[string]model.NodePortSpec{}
	for _, f := range []string{metrics.IPv4, metrics.IPv6} {
		if o.nodePorts[f], err = model.ParseNodePortSpec(o.nodePortAddresses, f == metrics.IPv6, o.localhostNodePorts); err != nil {
			return err
		}
	}
	if o.configSyncPeriod <= 0 {
		return fmt.Errorf("--config-sync-period must be greater than 0")
	}
	if o.syncPeriod <= 0 {
		return fmt.Errorf("--sync-period must be greater than 0")
	}
	if err := bpf.ValidateAttach(o.tcAttach, o.xdp); err != nil {
		return err
	}
	if o.snatPorts, err = bpf.ParsePortRange(o.snatPortRange); err != nil {
		return fmt.Errorf("--nodeport-snat-port-range: %w", err)
	}
	if o.lb, err = model.ParseLBAlgorithm(o.lbAlgorithm); err != nil {
		return fmt.Errorf("--lb-algorithm: %w", err)
	}
	if err := maglev.CheckSize(int(o.mapSizes.MaglevTable)); err != nil {
		return fmt.Errorf("--maglev-table-size: %w", err)
	}
	if o.minSyncPeriod < 0 {
		return fmt.Errorf("--min-sync-period must not be negative")
	}
	return o.validateKubeProxyFlags()
}

// parseClusterCIDR returns the prefixes of --cluster-cidr by IP family: it
// lists one per family, as kube-proxy's does.
func parseClusterCIDR(v string) (map[string]netip.Prefix, error) {
	out := map[string]netip.Prefix{}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--cluster-cidr: %q is not a CIDR: %w", s, err)
		}
		f := familyOf(p.Addr())
		if _, dup := out[f]; dup {
			return nil, fmt.Errorf("--cluster-cidr=%s: more than one %s CIDR", v, f)
		}
		out[f] = p.Masked()
	}
	return out, nil
}

func zapISOTime(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	enc.AppendString(t.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}
