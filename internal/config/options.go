// Package config is the agent's configuration: its flags, with kube-proxy's
// under kube-proxy's names and defaults so that a kube-proxy command line
// runs unchanged, kube-proxy's configuration file (--config,
// --write-config-to), and their validation. cmd/ebpf-proxy parses them and
// hands each part to the dataplane and sources it configures.
package config

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/k8swatch"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/nfconntrack"
)

// Options are the agent's settings: its flags (kube-proxy's under their
// names, and its own), kube-proxy's configuration file over them
// (FinishFlags), and what Validate parses from them. The comment after a
// field names its flag.
type Options struct {
	Kubeconfig       string // --kubeconfig
	Master           string // --master
	HostnameOverride string // --hostname-override
	ProxyMode        string // --proxy-mode
	// ProxyModeSetting says what set ProxyMode: ProxyModeFlag or
	// ProxyModeDefault (FinishFlags). kube-proxy's --config never does.
	ProxyModeSetting string
	// KubeProxyMode is the mode kube-proxy's --config file names: kube-
	// proxy's choice, logged beside the agent's own and written back by
	// --write-config-to, never the agent's mode.
	KubeProxyMode      string
	HealthzBindAddress string        // --healthz-bind-address
	MetricsBindAddress string        // --metrics-bind-address
	BindAddrHardFail   bool          // --bind-address-hard-fail
	Profiling          bool          // --profiling
	Cleanup            bool          // --cleanup
	Verbosity          int           // --v
	ConfigSyncPeriod   time.Duration // --config-sync-period
	SyncPeriod         time.Duration // --sync-period
	MinSyncPeriod      time.Duration // --min-sync-period
	NodePortAddresses  []string      // --nodeport-addresses

	// kube-proxy's remaining flags, and its configuration file.
	ConfigFile         string            // --config
	WriteConfigTo      string            // --write-config-to
	InitOnly           bool              // --init-only
	FeatureGates       map[string]string // --feature-gates
	KubeAPIContentType string            // --kube-api-content-type
	KubeAPIQPS         float32           // --kube-api-qps
	KubeAPIBurst       int32             // --kube-api-burst
	BindAddress        string            // --bind-address
	ShowHiddenMetrics  string            // --show-hidden-metrics-for-version
	// Vmodule and LogFlushFrequency are kube-proxy's logging flags,
	// accepted for its command lines.
	Vmodule            string        // --vmodule
	LogFlushFrequency  time.Duration // --log-flush-frequency
	LoggingFormat      string        // --logging-format
	OOMScoreAdj        int32         // --oom-score-adj
	IPTablesSyncPeriod time.Duration // --iptables-sync-period
	IPTablesMinSync    time.Duration // --iptables-min-sync-period
	// NFTablesSyncPeriod and NFTablesMinSync are the nftables section of
	// --config; zero uses the iptables periods, as kube-proxy has no
	// nftables flags of its own.
	NFTablesSyncPeriod time.Duration
	NFTablesMinSync    time.Duration
	LocalhostNodePorts bool                 // --iptables-localhost-nodeports
	IPVSSyncPeriod     time.Duration        // --ipvs-sync-period
	IPVSMinSync        time.Duration        // --ipvs-min-sync-period
	IPVSExcludeCIDRs   []string             // --ipvs-exclude-cidrs
	IPVSStrictARP      bool                 // --ipvs-strict-arp
	DetectLocalMode    string               // --detect-local-mode
	PodBridgeInterface string               // --pod-bridge-interface
	PodInterfacePrefix string               // --pod-interface-name-prefix
	Conntrack          nfconntrack.Settings // --conntrack-*
	// Parsed by Validate: --bind-address, --feature-gates.
	NodeIP netip.Addr
	Gates  FeatureGates

	// The fallback dataplanes' settings, under kube-proxy's flag names.
	ClusterCIDR       string        // --cluster-cidr
	MasqueradeAll     bool          // --masquerade-all
	MasqueradeBit     int32         // --iptables-masquerade-bit
	IPVSScheduler     string        // --ipvs-scheduler
	IPVSTCPTimeout    time.Duration // --ipvs-tcp-timeout
	IPVSTCPFinTimeout time.Duration // --ipvs-tcpfin-timeout
	IPVSUDPTimeout    time.Duration // --ipvs-udp-timeout
	// Parsed by Validate, by IP family ("IPv4", "IPv6"): --cluster-cidr,
	// and --nodeport-addresses with --iptables-localhost-nodeports.
	ClusterPrefixes map[string]netip.Prefix
	NodePorts       map[string]model.NodePortSpec

	Manifests        string   // --manifests
	TerminateSockets bool     // --terminate-removed-backend-sockets
	CgroupPath       string   // --cgroup-path
	BPFFSPath        string   // --bpffs-path
	APISocket        string   // --api-socket
	ProbeBindAddress string   // --probe-bind-address
	MapSizes         MapSizes // --bpf-map-*-max, --maglev-table-size

	Devices       []string // --devices
	TCAttach      string   // --tc-attach
	XDP           string   // --xdp
	ConntrackSize uint32   // --bpf-map-conntrack-max
	// MapMemoryRatio is --bpf-map-dynamic-size-ratio.
	MapMemoryRatio float64
	// SNATPortRange is --nodeport-snat-port-range (the BPF dataplane
	// parses it); SNATPortRangeForce skips its overlap checks.
	SNATPortRange      string // --nodeport-snat-port-range
	SNATPortRangeForce bool   // --nodeport-snat-port-range-force
	LBAlgorithm        string // --lb-algorithm
	SocketLBScope      string // --socket-lb-scope
	// LB is LBAlgorithm parsed by Validate.
	LB model.LBAlgorithm
}

// MapSizes are the BPF dataplane's map capacities, as the flags give them;
// 0 leaves a capacity to the agent (--bpf-map-dynamic-size-ratio).
type MapSizes struct {
	Services, Backends, RevNat, SockRevNat, Affinity uint32
	// MaglevTable is the entries of one Maglev table.
	MaglevTable uint32
}

// DefaultMasqueradeBit is --iptables-masquerade-bit's default, as
// kube-proxy's.
const DefaultMasqueradeBit = 14

// ProxyModeAuto is --proxy-mode's default: the modes choose, in their
// order, the first the node can run (internal/proxymode).
const ProxyModeAuto = "auto"

// kube-proxy's modes, as its file and flags name them where config reads
// them (ebpf-proxy's modes of the same names are its fallbacks).
const (
	kubeProxyNFTables = "nftables"
	kubeProxyIPVS     = "ipvs"
)

// What set --proxy-mode's value (Options.ProxyModeSetting), for the log
// line that says which mode runs and why.
const (
	ProxyModeFlag    = "--proxy-mode"
	ProxyModeDefault = "default"
)

// DefaultProbeBindAddress is --probe-bind-address's default: loopback
// only, where a host-network pod's HTTP probes with host 127.0.0.1 reach
// it, on a port no Kubernetes component uses.
const DefaultProbeBindAddress = "127.0.0.1:10266"

// Defaults are the settings when no flag is given: kube-proxy's defaults
// for its flags. The dataplanes' own settings are left to their modes'
// defaults (proxymode.Modes.NewOptions).
func Defaults() *Options {
	return &Options{
		ProxyMode:          ProxyModeAuto,
		MasqueradeBit:      DefaultMasqueradeBit,
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		ConfigSyncPeriod:   15 * time.Minute,
		SyncPeriod:         30 * time.Second,
		APISocket:          api.DefaultSocket,
		ProbeBindAddress:   DefaultProbeBindAddress,
		TerminateSockets:   true,
		LBAlgorithm:        model.LBRandom.String(),
		KubeAPIContentType: "application/vnd.kubernetes.protobuf",
		KubeAPIQPS:         5,
		KubeAPIBurst:       10,
		BindAddress:        "0.0.0.0",
		LoggingFormat:      "json",
		OOMScoreAdj:        -999,
		IPTablesSyncPeriod: 30 * time.Second,
		IPTablesMinSync:    time.Second,
		LocalhostNodePorts: true,
		IPVSSyncPeriod:     30 * time.Second,
		IPVSMinSync:        0,
	}
}

// AddFlags registers every flag on fs, with o's values as defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file with authorization information (the in-cluster configuration is used when neither this nor --master is set).")
	fs.StringVar(&o.Master, "master", o.Master, "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	fs.StringVar(&o.HostnameOverride, "hostname-override", o.HostnameOverride, "If non-empty, use this string as the node name instead of the actual hostname.")
	fs.StringVar(&o.ProxyMode, "proxy-mode", o.ProxyMode, "Which proxy mode ebpf-proxy uses: 'ebpf', 'nftables', 'iptables', 'ipvs' or 'auto' (ebpf where the kernel can run the BPF programs, else nftables where nft and the kernel's nf_tables work, else iptables; ipvs only when named). The mode in kube-proxy's --config file is kube-proxy's choice and does not set this.")
	fs.StringVar(&o.HealthzBindAddress, "healthz-bind-address", o.HealthzBindAddress, "The IP address and port for the health check server to serve on; empty disables it.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "The IP address and port for the metrics server to serve on; empty disables it.")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "If true, serve Go's profiles on /debug/pprof/ of the metrics server, as kube-proxy does.")
	fs.BoolVar(&o.BindAddrHardFail, "bind-address-hard-fail", o.BindAddrHardFail, "If true, failure to bind the health or metrics address is fatal; otherwise it is retried.")
	fs.BoolVar(&o.Cleanup, "cleanup", o.Cleanup, "If true, remove what every proxy mode of ebpf-proxy created (BPF programs and maps, nftables tables, iptables chains, IPVS virtual servers, ipsets and the dummy interface), then exit.")
	fs.IntVarP(&o.Verbosity, "v", "v", o.Verbosity, "Log verbosity: 2 or more logs every sync.")
	fs.DurationVar(&o.ConfigSyncPeriod, "config-sync-period", o.ConfigSyncPeriod, "How often the configuration from the API server is refreshed. Must be greater than 0.")
	fs.DurationVar(&o.SyncPeriod, "sync-period", o.SyncPeriod, "Interval of the periodic full sync, and the longest retry backoff after a failed sync.")
	fs.DurationVar(&o.MinSyncPeriod, "min-sync-period", o.MinSyncPeriod, "Least time between two syncs; changes arriving sooner are batched. 0 applies each change at once.")
	fs.StringSliceVar(&o.NodePortAddresses, "nodeport-addresses", o.NodePortAddresses, "The node addresses that accept NodePort traffic and serve health check node ports, as kube-proxy 1.37 takes them: CIDRs and the keywords 'primary' (the node's primary IP of each family), 'localhost' (127.0.0.0/8, ::1) and 'all' (every address), comma-separated and combinable (e.g. 'primary,localhost'). Empty means every local address, except in nftables mode, where it means 'primary' as in kube-proxy's nftables mode.")
	fs.BoolVar(&o.TerminateSockets, "terminate-removed-backend-sockets", o.TerminateSockets, "End the TCP and connected UDP sockets that the socket load balancer sent to a backend once that backend is removed, in every network namespace of the node (needs hostPID), so that clients reconnect to live backends instead of hanging.")
	fs.StringVar(&o.ClusterCIDR, "cluster-cidr", o.ClusterCIDR, "The CIDR range of the pods in the cluster (comma-separated for dual-stack: one per IP family). In nftables, iptables and ipvs mode, ClusterIP traffic from outside it is masqueraded.")
	fs.BoolVar(&o.MasqueradeAll, "masquerade-all", o.MasqueradeAll, "In nftables, iptables and ipvs mode, SNAT all traffic sent through Service cluster IPs.")
	fs.Int32Var(&o.MasqueradeBit, "iptables-masquerade-bit", o.MasqueradeBit, "In nftables, iptables and ipvs mode, the bit of the fwmark space that marks packets to SNAT. Must be within [0, 31].")
	fs.StringVar(&o.IPVSScheduler, "ipvs-scheduler", o.IPVSScheduler, "The IPVS scheduler in ipvs mode: rr (default), lc, dh, sh, sed or nq.")
	fs.DurationVar(&o.IPVSTCPTimeout, "ipvs-tcp-timeout", o.IPVSTCPTimeout, "The timeout for idle IPVS TCP connections, 0 to leave it as is (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&o.IPVSTCPFinTimeout, "ipvs-tcpfin-timeout", o.IPVSTCPFinTimeout, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave it as is.")
	fs.DurationVar(&o.IPVSUDPTimeout, "ipvs-udp-timeout", o.IPVSUDPTimeout, "The timeout for IPVS UDP packets, 0 to leave it as is.")
	fs.StringVar(&o.Manifests, "manifests", o.Manifests, "Read Services and EndpointSlices from YAML files in this directory (watched for changes) instead of the API server.")
	fs.StringVar(&o.CgroupPath, "cgroup-path", o.CgroupPath, "The cgroup v2 directory to attach the socket programs to (default: the node's cgroup2 root, mounting cgroup2 under /run/ebpf-proxy when none is mounted).")
	fs.StringVar(&o.BPFFSPath, "bpffs-path", o.BPFFSPath, "Directory on a bpf filesystem where maps and links are pinned.")
	fs.StringVar(&o.APISocket, "api-socket", o.APISocket, "Unix socket of the read-only local API (mode 0600) that `ebpf-proxy dump` reads Service names from; empty disables it.")
	fs.StringVar(&o.ProbeBindAddress, "probe-bind-address", o.ProbeBindAddress, "The IP address and port that serve /livez and /healthz for the kubelet's HTTP probes (deploy/daemonset.yaml), apart from --healthz-bind-address, which kube-proxy holds while both run during a migration; empty disables it.")
	fs.Uint32Var(&o.MapSizes.Services, "bpf-map-services-max", o.MapSizes.Services, "Capacity of the services maps: one entry per frontend plus one per backend of each frontend (0: 262,144 for each IP family the node has addresses of, 16,384 for another). Not preallocated: kernel memory follows the entries, plus 16 bytes an entry of capacity.")
	fs.Uint32Var(&o.MapSizes.Backends, "bpf-map-backends-max", o.MapSizes.Backends, "Capacity of the backends maps (0: 262,144, or 16,384 for a family the node has no address of).")
	fs.Uint32Var(&o.MapSizes.RevNat, "bpf-map-revnat-max", o.MapSizes.RevNat, "Capacity of the reverse NAT maps: one entry per frontend (0: 65,536, or 4,096 for a family the node has no address of).")
	fs.Uint32Var(&o.MapSizes.SockRevNat, "bpf-map-sock-revnat-max", o.MapSizes.SockRevNat, "Capacity of the socket reverse NAT and UDP forwarding LRUs: one entry per connected socket to a Service (0: sized by --bpf-map-dynamic-size-ratio).")
	fs.StringSliceVar(&o.Devices, "devices", o.Devices, "Network devices to translate NodePort, ExternalIP and LoadBalancer-IP traffic on (default: the devices carrying the node's addresses). Add the pod bridge (cni0, ...) to masquerade externalTrafficPolicy=Cluster traffic to pods on the node as kube-proxy does; without it those pods see the client's address.")
	fs.StringVar(&o.TCAttach, "tc-attach", o.TCAttach, "How to attach the TC programs: '' (tcx where the kernel has it, else clsact), 'tcx' or 'clsact'.")
	fs.StringVar(&o.XDP, "xdp", o.XDP, "The XDP fast path for NodePort, ExternalIP and LoadBalancer-IP traffic to backends on other nodes, on the same devices as the TC programs: 'native' (in the driver), 'generic' (any device, less gain) or 'off'. A device that refuses the mode keeps the TC programs only (logged, and counted in ebpfproxy_xdp_attach_failures_total).")
	fs.Uint32Var(&o.ConntrackSize, "bpf-map-conntrack-max", o.ConntrackSize, "Capacity of the TC connection tracking LRUs: two entries per flow from outside the node (0: sized by --bpf-map-dynamic-size-ratio).")
	fs.StringVar(&o.SNATPortRange, "nodeport-snat-port-range", o.SNATPortRange, "Source ports (min-max) that NodePort, ExternalIP and LoadBalancer-IP traffic to a backend on another node is source-NATed to: each (node address, backend) pair has this many concurrent flows (a closed TCP connection frees its port at once, a UDP flow after 30 s, or 120 s once it is a stream). Must lie within 1024-65535 and stay clear of the NodePort range 30000-32767; where it overlaps the node's ephemeral ports (net.ipv4.ip_local_port_range) it is added to net.ipv4.ip_local_reserved_ports, so that the node's own connections never pick these ports and their replies are never taken for source NAT's.")
	fs.BoolVar(&o.SNATPortRangeForce, "nodeport-snat-port-range-force", o.SNATPortRangeForce, "Accept a --nodeport-snat-port-range that overlaps 30000-32767, or the node's ephemeral ports where it cannot be reserved (logged), for nodes that keep those ports free otherwise.")
	fs.Float64Var(&o.MapMemoryRatio, "bpf-map-dynamic-size-ratio", o.MapMemoryRatio, "Share of the node's memory (MemTotal) that the LRU maps the kernel preallocates (connection tracking, socket reverse NAT, UDP forwarding, session affinity) take where their --bpf-map-*-max flags are 0: split among the IP families the node has addresses of, at least 16,384 and at most 524,288 entries a map (a family without addresses gets 4,096). At 0.0025, an IPv4 node of 8 GiB gives each 32,768 entries (its affinity map half), 11 MiB in all.")
	fs.Uint32Var(&o.MapSizes.Affinity, "bpf-map-affinity-max", o.MapSizes.Affinity, "Capacity of the session affinity LRUs: (client, Service port) pairs remembered (0: sized by --bpf-map-dynamic-size-ratio).")
	fs.StringVar(&o.LBAlgorithm, "lb-algorithm", o.LBAlgorithm, "How traffic from outside the node picks a backend for a new flow: 'random' (as kube-proxy) or 'maglev' (consistent hashing: every node picks the same backend for a flow). A Service's annotation "+k8swatch.AnnotationLBAlgorithm+" overrides it.")
	o.addKubeProxyFlags(fs)
	fs.StringVar(&o.SocketLBScope, "socket-lb-scope", o.SocketLBScope, "Whose sockets the BPF dataplane translates at connect() and sendmsg(): \"all\" (the node's and its pods', the fastest) or \"node\" (the node's own; pods' packets are translated at their devices on the node, so that a proxy inside a pod, a service mesh's sidecar, sees the Service address its pod connected to, at a cost per packet).")
	fs.Uint32Var(&o.MapSizes.MaglevTable, "maglev-table-size", o.MapSizes.MaglevTable, "Entries of a Maglev table, a prime well above the largest backend count (4 bytes each, per Service port that uses Maglev).")
}

// Validate checks the settings as kube-proxy does its own, and parses
// what the agent needs parsed (NodeIP, Gates, ClusterPrefixes, NodePorts,
// LB). The modes check --proxy-mode and their own settings
// (proxymode.Modes.Validate).
func (o *Options) Validate() error {
	if o.MasqueradeBit < 0 || o.MasqueradeBit > 31 {
		return fmt.Errorf("--iptables-masquerade-bit=%d: must be within [0, 31]", o.MasqueradeBit)
	}
	for name, d := range map[string]time.Duration{"--ipvs-tcp-timeout": o.IPVSTCPTimeout, "--ipvs-tcpfin-timeout": o.IPVSTCPFinTimeout, "--ipvs-udp-timeout": o.IPVSUDPTimeout} {
		if d < 0 || d%time.Second != 0 {
			return fmt.Errorf("%s=%s: want whole seconds, 0 or more", name, d)
		}
	}
	var err error
	if o.ClusterPrefixes, err = parseClusterCIDR(o.ClusterCIDR); err != nil {
		return err
	}
	o.NodePorts = map[string]model.NodePortSpec{}
	for _, f := range []string{metrics.IPv4, metrics.IPv6} {
		if o.NodePorts[f], err = model.ParseNodePortSpec(o.NodePortAddresses, f == metrics.IPv6, o.LocalhostNodePorts); err != nil {
			return err
		}
	}
	if o.ConfigSyncPeriod <= 0 {
		return fmt.Errorf("--config-sync-period must be greater than 0")
	}
	if o.SyncPeriod <= 0 {
		return fmt.Errorf("--sync-period must be greater than 0")
	}
	if o.LB, err = model.ParseLBAlgorithm(o.LBAlgorithm); err != nil {
		return fmt.Errorf("--lb-algorithm: %w", err)
	}
	if o.MinSyncPeriod < 0 {
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
		f := metrics.FamilyOf(p.Addr())
		if _, dup := out[f]; dup {
			return nil, fmt.Errorf("--cluster-cidr=%s: more than one %s CIDR", v, f)
		}
		out[f] = p.Masked()
	}
	return out, nil
}
