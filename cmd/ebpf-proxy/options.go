package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"

	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
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
	cleanup            bool
	verbosity          int
	configSyncPeriod   time.Duration
	syncPeriod         time.Duration
	minSyncPeriod      time.Duration

	manifests        string
	terminateSockets bool
	cgroupPath       string
	bpffsPath        string
	mapSizes         loader.MapSizes

	devices           []string
	nodePortAddresses []string
	tcAttach          string
	conntrackSize     uint32
}

func defaultOptions() *options {
	return &options{
		proxyMode:          "ebpf",
		healthzBindAddress: "0.0.0.0:10256",
		metricsBindAddress: "127.0.0.1:10249",
		configSyncPeriod:   15 * time.Minute,
		syncPeriod:         30 * time.Second,
		bpffsPath:          loader.DefaultBPFFSPath,
		mapSizes:           loader.DefaultMapSizes,
		terminateSockets:   true,
		conntrackSize:      loader.DefaultConntrackSize,
	}
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", o.kubeconfig, "Path to a kubeconfig file with authorization information (the in-cluster configuration is used when neither this nor --master is set).")
	fs.StringVar(&o.master, "master", o.master, "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	fs.StringVar(&o.hostnameOverride, "hostname-override", o.hostnameOverride, "If non-empty, use this string as the node name instead of the actual hostname.")
	fs.StringVar(&o.proxyMode, "proxy-mode", o.proxyMode, "Which proxy mode to use: 'ebpf' (the iptables and ipvs fallbacks are not available yet).")
	fs.StringVar(&o.healthzBindAddress, "healthz-bind-address", o.healthzBindAddress, "The IP address and port for the health check server to serve on; empty disables it.")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", o.metricsBindAddress, "The IP address and port for the metrics server to serve on; empty disables it.")
	fs.BoolVar(&o.bindAddrHardFail, "bind-address-hard-fail", o.bindAddrHardFail, "If true, failure to bind the health or metrics address is fatal; otherwise it is retried.")
	fs.BoolVar(&o.cleanup, "cleanup", o.cleanup, "If true, detach and unpin every BPF program and map ebpf-proxy created, then exit.")
	fs.IntVarP(&o.verbosity, "v", "v", o.verbosity, "Log verbosity: 2 or more logs every sync.")
	fs.DurationVar(&o.configSyncPeriod, "config-sync-period", o.configSyncPeriod, "How often the configuration from the API server is refreshed. Must be greater than 0.")
	fs.DurationVar(&o.syncPeriod, "sync-period", o.syncPeriod, "Interval of the periodic full sync, and the longest retry backoff after a failed sync.")
	fs.DurationVar(&o.minSyncPeriod, "min-sync-period", o.minSyncPeriod, "Least time between two syncs; changes arriving sooner are batched. 0 applies each change at once.")
	fs.BoolVar(&o.terminateSockets, "terminate-removed-backend-sockets", o.terminateSockets, "End the TCP and connected UDP sockets that the socket load balancer sent to a backend once that backend is removed, in every network namespace of the node (needs hostPID), so that clients reconnect to live backends instead of hanging.")
	fs.StringVar(&o.manifests, "manifests", o.manifests, "Read Services and EndpointSlices from YAML files in this directory (watched for changes) instead of the API server.")
	fs.StringVar(&o.cgroupPath, "cgroup-path", o.cgroupPath, "The cgroup v2 directory to attach the socket programs to (default: the node's cgroup2 root, mounting cgroup2 under /run/ebpf-proxy when none is mounted).")
	fs.StringVar(&o.bpffsPath, "bpffs-path", o.bpffsPath, "Directory on a bpf filesystem where maps and links are pinned.")
	fs.Uint32Var(&o.mapSizes.Services, "bpf-map-services-max", o.mapSizes.Services, "Capacity of the services map: one entry per frontend plus one per backend of each frontend.")
	fs.Uint32Var(&o.mapSizes.Backends, "bpf-map-backends-max", o.mapSizes.Backends, "Capacity of the backends map.")
	fs.Uint32Var(&o.mapSizes.RevNat, "bpf-map-revnat-max", o.mapSizes.RevNat, "Capacity of the reverse NAT map: one entry per frontend.")
	fs.Uint32Var(&o.mapSizes.SockRevNat, "bpf-map-sock-revnat-max", o.mapSizes.SockRevNat, "Capacity of the socket reverse NAT LRU.")
	fs.StringSliceVar(&o.devices, "devices", o.devices, "Network devices to translate NodePort, ExternalIP and LoadBalancer-IP traffic on (default: the devices carrying the node's addresses). Add the pod bridge (cni0, ...) to masquerade externalTrafficPolicy=Cluster traffic to pods on the node as kube-proxy does; without it those pods see the client's address.")
	fs.StringSliceVar(&o.nodePortAddresses, "nodeport-addresses", o.nodePortAddresses, "CIDRs whose local addresses accept NodePort traffic, or 'primary' for the node's addresses (the default), as kube-proxy's flag.")
	fs.StringVar(&o.tcAttach, "tc-attach", o.tcAttach, "How to attach the TC programs: '' (tcx where the kernel has it, else clsact), 'tcx' or 'clsact'.")
	fs.Uint32Var(&o.conntrackSize, "bpf-map-conntrack-max", o.conntrackSize, "Capacity of the TC connection tracking LRU: two entries per flow from outside the node.")
	fs.Uint32Var(&o.mapSizes.Affinity, "bpf-map-affinity-max", o.mapSizes.Affinity, "Capacity of the session affinity LRU: (client, Service port) pairs remembered.")
}

func (o *options) validate() error {
	switch o.proxyMode {
	case "ebpf":
	case "iptables", "ipvs", "nftables", "auto":
		return fmt.Errorf("--proxy-mode=%s is not implemented yet: only 'ebpf' is available in this release", o.proxyMode)
	default:
		return fmt.Errorf("unknown --proxy-mode %q: only 'ebpf' is available", o.proxyMode)
	}
	if o.configSyncPeriod <= 0 {
		return fmt.Errorf("--config-sync-period must be greater than 0")
	}
	if o.syncPeriod <= 0 {
		return fmt.Errorf("--sync-period must be greater than 0")
	}
	switch o.tcAttach {
	case loader.TCAttachAuto, loader.TCAttachTCX, loader.TCAttachClsact:
	default:
		return fmt.Errorf("unknown --tc-attach %q: use tcx or clsact, or leave it empty", o.tcAttach)
	}
	if _, err := parseNodePortAddresses(o.nodePortAddresses); err != nil {
		return err
	}
	if o.minSyncPeriod < 0 {
		return fmt.Errorf("--min-sync-period must not be negative")
	}
	return nil
}

func zapISOTime(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	enc.AppendString(t.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}
